"""Bitwise-repeatable RL runs on one machine (``--deterministic``): torch's deterministic algorithms.

Measured on a 2-core Xeon (docs/reliability.md, "Repeating a run"): a GRPO run on the default model
repeats bitwise with one thread, while with two its update differs from run to run in about 1 of
1,500 weights by one float32 ulp per step. That is enough for later steps to sample other responses,
so a "retrained" RL run is another sample of it. With torch's deterministic algorithms on, two such
runs gave the same weights. ES needs none of this: its runs repeated bitwise without it.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from typing import Iterator

import torch


@contextmanager
def deterministic(on: bool) -> Iterator[None]:
    """Within the block, torch's deterministic algorithms when ``on`` (an op with no deterministic
    kernel warns instead of failing); the process's previous setting comes back after it."""
    if not on:
        yield
        return
    before = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),
              torch.backends.cudnn.benchmark)
    # cuBLAS reads this when CUDA starts: its deterministic mode needs a fixed workspace (torch's docs)
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cudnn.benchmark = False  # autotuning may pick another kernel on each run
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])
        torch.backends.cudnn.benchmark = before[2]
