"""``python -m llm_envs.list``: every registered environment id with a one-line description.

The built-in environments come first (``llm_envs.ENV_IDS``, described by their class's docstring),
then the reasoning-gym tasks (``rg/<task>-v0``, described by reasoning-gym's docstrings; listing
them imports reasoning-gym, about a second). ``--namespace rg`` (or ``none``) keeps one group, a
``FILTER`` word keeps the ids or descriptions that contain it, ``--fields`` adds each rg task's
config fields (the keyword arguments ``gym.make`` takes) with their defaults. ``--module my_envs``
(repeatable) imports a module of your own first: the envs it registers are listed after the
built-in ones, marked with their ``my_envs:`` prefix (how trainers and ``python -m llm_envs.check``
name them).

    python -m llm_envs.list --module my_envs --namespace none
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import sys
from collections.abc import Sequence
from typing import NoReturn

import llm_envs
from llm_envs.envs import rg
from llm_envs.registry import env_class

NAMESPACES = ("none", rg.NAMESPACE)


class _Parser(argparse.ArgumentParser):
    """A bad flag ends the program with one line (exit code 2), not argparse's usage block."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (--help lists the options)\n")


def builtin_description(env_id: str) -> str:
    """The first line of the env class's docstring, without reST markup."""
    lines = (env_class(env_id).__doc__ or "").strip().splitlines()
    line = lines[0] if lines else ""
    return line.replace(" (see the module docstring)", "").replace("``", "").strip()


def field_defaults(task: str) -> str:
    """``name=default`` for each config field of an rg task that ``gym.make`` accepts."""
    _, config_cls = rg.installed_tasks()[task]
    accepted = set(rg.config_fields(config_cls))
    parts = []
    for f in dataclasses.fields(config_cls):
        if f.name not in accepted:
            continue
        if f.default is not dataclasses.MISSING:
            parts.append(f"{f.name}={f.default!r}")
        elif f.default_factory is not dataclasses.MISSING:
            parts.append(f"{f.name}={f.default_factory()!r}")
        else:
            parts.append(f.name)
    return ", ".join(parts)


def import_modules(modules: Sequence[str]) -> dict[str, str]:
    """Import ``modules`` (users' env modules); ``{env id: module}`` of the ids they registered."""
    own = {}
    for module in modules:
        before = list(llm_envs.ENV_IDS)
        importlib.import_module(module)
        own |= {env_id: module for env_id in llm_envs.ENV_IDS if env_id not in before}
    return own


def rows(namespace: str | None, fields: bool, own: dict[str, str] | None = None) -> list[tuple[str, str]]:
    """``(env id, description)`` of every registered env in ``namespace`` (``None``: all); the ids
    of ``own`` (``import_modules``) as ``module:id``."""
    out = []
    own = own or {}
    if namespace in (None, "none"):
        out += [(f"{own[env_id]}:{env_id}" if env_id in own else env_id, builtin_description(env_id))
                for env_id in llm_envs.ENV_IDS]
    if namespace in (None, rg.NAMESPACE):
        for task in rg.register_installed():
            text = rg.describe(task)
            if fields:
                text += f"\n    {field_defaults(task) or '(no config fields)'}"
            out.append((rg.env_id(task), text))
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = _Parser(prog="python -m llm_envs.list",
                     description="Every registered environment id with a one-line description.")
    parser.add_argument("filter", nargs="?", metavar="FILTER",
                        help="only ids or descriptions containing this (case-insensitive)")
    parser.add_argument("--namespace", choices=NAMESPACES,
                        help="only this namespace ('none': the built-in environments)")
    parser.add_argument("--fields", action="store_true",
                        help="also print each rg task's config fields, with defaults")
    parser.add_argument("--module", action="append", default=[], metavar="MODULE",
                        help="import this module of your own first and list the envs it registers (repeatable)")
    args = parser.parse_args(argv)
    try:
        own = import_modules(args.module)
    except ImportError as exc:
        parser.error(f"--module: cannot import {exc.name or ''}: {exc}")
    found = rows(args.namespace, args.fields, own)
    if args.filter:
        word = args.filter.lower()
        found = [(i, d) for i, d in found if word in i.lower() or word in d.lower()]
    width = max((len(i) for i, _ in found), default=0)
    for env_id, text in found:
        print(f"{env_id:<{width}}  {text}")
    if not found:
        print(f"no environment matches {args.filter!r}", file=sys.stderr)
    return 0 if found else 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BrokenPipeError:  # piped into head: stop quietly
        sys.stderr.close()
        sys.exit(0)
