"""The environment a trainer runs on, and a validation split carved from its training split.

Hyperparameters chosen on the test split overstate what they achieve on unseen data. ``--val-size
K`` moves K training examples into a ``validation`` split: the run trains on the rest, and
``--eval-split validation`` measures its held-out numbers there. The K examples are a fixed choice
for the environment's training split (the same whatever ``--seed``), so every run of a sweep is
validated on the same examples; ``trainers.sweep`` selects on them and measures the test split
only for the run it selected. Both options are in the run's config.yaml.

The carve moves whole questions: training examples that are the same question (a small
procedural task repeats its questions, e.g. rg/basic_arithmetic-v0 with two one-digit terms holds
~100 distinct questions in 393 training examples) go to validation together or stay in train
together, so no validation question is trained on. A question is its prompt text and its answer
(``question_key``, ``--val-carve question``, the default): examples of a hidden-state env share
one prompt text and differ in what the model must find (GuessNumber-v0: one prompt, 100 secrets),
and they are different questions. Runs from before this rule carved by prompt text alone
(``--val-carve prompt``, which a resumed run without the key keeps: config.yaml records the rule).
Where every question is distinct, the carve is the plain seeded choice of K examples; otherwise
whole questions are taken in a seeded order while they fit, so validation may hold a few fewer than
K examples (``split_counts`` says how many, and how many distinct prompts, each split holds).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import numpy as np

import llm_envs
from llm_envs import Example
from trainers.common.config import ConfigError, TrainConfig, make_env

VALIDATION = "validation"  # the carved split's name
#: A validation split carved for selecting settings (trainers.sweep, benchmarks.study) holds at
#: least this many examples and leaves as many to train on.
MIN_VALIDATION = 8
CARVE_SEED = 20240917  # fixed: the carve depends on the training split and K only


def prompt_key(example: Example) -> str:
    """An example's whole prompt text (every message)."""
    return json.dumps(example.prompt, sort_keys=True, ensure_ascii=False)


def question_key(example: Example) -> str:
    """What makes two examples the same question: the prompt and the answer (a hidden-state env's
    examples share a prompt and differ in their answer)."""
    return json.dumps([example.prompt, example.answer], sort_keys=True, ensure_ascii=False, default=repr)


def carve(n: int, size: int, keys: Sequence[str] | None = None) -> list[int]:
    """The sorted indices of the training examples (of ``n``) that form a validation split of at most
    ``size``: examples with equal ``keys`` (their prompt text) all in it or all out of it."""
    rng = np.random.default_rng(CARVE_SEED)
    if keys is None or len(set(keys)) == n:  # every prompt distinct: the plain choice of ``size``
        return sorted(int(i) for i in rng.choice(n, size, replace=False))
    groups: dict[str, list[int]] = {}
    for i, key in enumerate(keys):
        groups.setdefault(key, []).append(i)
    members = list(groups.values())
    held: list[int] = []
    for g in rng.permutation(len(members)):
        if len(held) + len(members[g]) <= size:
            held += members[g]
        if len(held) == size:
            break
    return sorted(held)


def split_counts(examples: Sequence[Example]) -> dict[str, int]:
    """A split's number of examples and of distinct prompts."""
    return {"examples": len(examples), "prompts": len({prompt_key(e) for e in examples})}


def measured_split_counts(env, splits: Sequence[str], limit: int | None = None) -> dict[str, dict[str, int]]:
    """``split_counts`` of ``splits`` as a run uses them: train whole (it trains on all of it), any
    other split's first ``limit`` examples (what ``--eval-limit`` measures)."""
    return {name: split_counts(env.examples(name) if name == "train" else list(env.examples(name))[:limit])
            for name in dict.fromkeys(splits)}


class WithValidation:
    """``env`` with ``size`` of its training examples moved into a ``validation`` split (disjoint
    from the ``train`` split it now shows). Everything else (scoring, ``max_new_tokens``, other
    splits, ``close``) is the environment's own: this is a view, not a copy."""

    def __init__(self, env: llm_envs.TaskEnv, size: int, rule: str = "question"):
        if VALIDATION in env.split_names or VALIDATION in env.data:
            raise ConfigError(f"--val-size: {type(env).__name__} already has a {VALIDATION!r} split; "
                              f"evaluate on it with --eval-split {VALIDATION} instead of carving one")
        train = env.examples("train")
        if not 1 <= size < len(train):
            raise ConfigError(f"--val-size {size}: the train split has {len(train)} examples; the validation "
                              f"split takes 1 to {len(train) - 1} of them")
        key = {"question": question_key, "prompt": prompt_key}[rule]
        held = set(carve(len(train), size, [key(e) for e in train]))
        if not held:
            raise ConfigError(f"--val-size {size}: every {rule} of the train split repeats more than {size} times; "
                              f"no whole {rule} fits a validation split that small")
        self.env = env
        self.splits: dict[str, list[Example]] = {
            "train": [e for i, e in enumerate(train) if i not in held],
            VALIDATION: [e for i, e in enumerate(train) if i in held],
        }

    def examples(self, split: str = "train") -> Sequence[Example]:
        return self.splits[split] if split in self.splits else self.env.examples(split)

    def __getattr__(self, name: str) -> Any:
        if name == "env":  # looked up before __init__ ran (unpickling in a scoring worker)
            raise AttributeError(name)
        return getattr(self.env, name)


def training_env(cfg: TrainConfig):
    """The environment of a run, built before its run directory exists: ``--env`` with
    ``--env-args`` (a bad option is a one-line error), ``--val-size`` examples moved from train
    into ``validation``, and ``--eval-split`` checked to exist."""
    env = make_env(cfg.env, cfg.env_args, splits=("train",))
    if cfg.val_size:
        env = WithValidation(env, cfg.val_size, cfg.val_carve)
    try:
        env.examples(cfg.eval_split)
    except KeyError as exc:
        hint = " (--val-size K carves one from train)" if cfg.eval_split == VALIDATION else ""
        raise ConfigError(f"--eval-split: {exc.args[0]}{hint}") from None
    return env
