"""Registration with Gymnasium, and ``make`` for trainers (the unwrapped ``TaskEnv``)."""

from __future__ import annotations

import importlib
from typing import Any

import gymnasium as gym

from llm_envs.core import TaskEnv

#: Ids registered by llm_envs (and by users through ``register``), in registration order.
ENV_IDS: list[str] = []


class UnknownEnvError(KeyError):
    """An env id that nobody registered."""

    def __str__(self) -> str:  # KeyError would print the message in quotes
        return str(self.args[0])


def register(env_id: str, cls: type[TaskEnv], **defaults: Any) -> None:
    """Register ``cls`` under ``env_id`` so ``gym.make(env_id, **overrides)`` builds it."""
    if not (isinstance(cls, type) and issubclass(cls, TaskEnv)):
        raise TypeError(f"{env_id}: {cls!r} is not a TaskEnv subclass")
    gym.register(id=env_id, entry_point=cls, kwargs=defaults)
    if env_id not in ENV_IDS:
        ENV_IDS.append(env_id)


def resolve_id(env_id: str) -> str:
    """The registered id of ``env_id``; ``"my_module:My-v0"`` first imports ``my_module`` (which
    registers ``My-v0``), as ``gym.make`` does. Raises ``UnknownEnvError`` for unknown ids."""
    if ":" in env_id:
        module, env_id = env_id.split(":", 1)
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise UnknownEnvError(f"cannot import {module!r} to register {env_id!r}: {exc}") from None
    spec = gym.registry.get(env_id)
    if spec is None or not _is_task_env(spec):
        raise UnknownEnvError(f"unknown env id {env_id!r}; registered: {', '.join(ENV_IDS)}, and every "
                              f"reasoning-gym task as rg/<task>-v0 (python -m llm_envs.list)")
    return env_id


def env_class(env_id: str) -> type[TaskEnv]:
    """The ``TaskEnv`` subclass registered as ``env_id`` (class attributes such as
    ``eval_splits`` and ``max_new_tokens``, without building the env)."""
    return gym.registry[resolve_id(env_id)].entry_point


def make(env_id: str, **kwargs: Any) -> TaskEnv:
    """Build a registered environment and return the ``TaskEnv`` itself (no wrappers)."""
    env_id = resolve_id(env_id)
    try:
        return gym.make(env_id, disable_env_checker=True, **kwargs).unwrapped
    except TypeError as exc:
        raise TypeError(f"{env_id}: bad argument: {exc}") from None


def _is_task_env(spec: gym.envs.registration.EnvSpec) -> bool:
    entry = spec.entry_point
    return isinstance(entry, type) and issubclass(entry, TaskEnv)
