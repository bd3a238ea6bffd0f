"""Bitwise-repeatable RL runs on one machine (``--deterministic``): torch's deterministic algorithms.

Measured on a 2-core Xeon (docs/reliability.md, "Repeating a run"): a GRPO run on the default model
repeats bitwise with one thread, while with two its 2-step runs ended with 0.05-0.07% of their weights
one or two float32 ulps apart from run to run. That is enough for later steps to sample other
responses, so a "retrained" RL run is another sample of it. With torch's deterministic algorithms on,
three such runs gave the same weights. ES needs none of this: its runs repeated bitwise without it.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from typing import Iterator

import torch


@contextmanager
def deterministic() -> Iterator[None]:
    """Within the block, torch's deterministic algorithms (an op with no deterministic kernel warns
    instead of failing); the process's previous setting comes back after it."""
    was_on = torch.are_deterministic_algorithms_enabled()
    was_warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    was_benchmark = torch.backends.cudnn.benchmark
    # cuBLAS reads this when CUDA starts (so it stays set): its deterministic mode needs a fixed workspace
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cudnn.benchmark = False  # autotuning may pick another kernel on each run
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(was_on, warn_only=was_warn_only)
        torch.backends.cudnn.benchmark = was_benchmark
