"""The environment a trainer runs on, and a validation split carved from its training split.

Hyperparameters chosen on the test split overstate what they achieve on unseen data. ``--val-size
K`` moves K training examples into a ``validation`` split: the run trains on the rest, and
``--eval-split validation`` measures its held-out numbers there. The K examples are a fixed choice
for the environment's training split (the same whatever ``--seed``), so every run of a sweep is
validated on the same examples; ``trainers.sweep`` selects on them and measures the test split
only for the run it selected. Both options are in the run's config.yaml.
"""

from __future__ import annotations

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


def carve(n: int, size: int) -> list[int]:
    """The sorted indices of the ``size`` of ``n`` training examples that form the validation split."""
    return sorted(int(i) for i in np.random.default_rng(CARVE_SEED).choice(n, size, replace=False))


class WithValidation:
    """``env`` with ``size`` of its training examples moved into a ``validation`` split (disjoint
    from the ``train`` split it now shows). Everything else (scoring, ``max_new_tokens``, other
    splits, ``close``) is the environment's own: this is a view, not a copy."""

    def __init__(self, env: llm_envs.TaskEnv, size: int):
        if VALIDATION in env.split_names or VALIDATION in env.data:
            raise ConfigError(f"--val-size: {type(env).__name__} already has a {VALIDATION!r} split; "
                              f"evaluate on it with --eval-split {VALIDATION} instead of carving one")
        train = env.examples("train")
        if not 1 <= size < len(train):
            raise ConfigError(f"--val-size {size}: the train split has {len(train)} examples; the validation "
                              f"split takes 1 to {len(train) - 1} of them")
        held = set(carve(len(train), size))
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
        env = WithValidation(env, cfg.val_size)
    try:
        env.examples(cfg.eval_split)
    except KeyError as exc:
        hint = " (--val-size K carves one from train)" if cfg.eval_split == VALIDATION else ""
        raise ConfigError(f"--eval-split: {exc.args[0]}{hint}") from None
    return env
