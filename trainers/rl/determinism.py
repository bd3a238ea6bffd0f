"""Bitwise-repeatable RL runs on a GPU (``--deterministic``): torch's deterministic algorithms.

On CUDA many kernels (``index_select``'s and embeddings' backward, ``scatter_add``) add with atomics,
in an order that changes from run to run; an update that differs in the last bit of a few weights
is enough for later steps to sample other responses, so such a "retrained" run is another sample.
On a CPU the RL trainers repeat bitwise without this: the one such op they used (indexing's
backward with repeated rows, see ``trainers.rl.logprobs.per_response``) is gone, and three GRPO runs
with it on gave the weights two without it give (docs/reliability.md, "Repeating a run"). Untested
on a GPU here: no GPU run has checked it.
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
