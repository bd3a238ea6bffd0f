"""Many processes (``accelerate launch`` / ``torchrun``): ranks, a sum across processes, order.

ES exchanges only per-member scalars, so the whole protocol is one all-reduce per iteration.
Without a launcher (WORLD_SIZE unset) everything here is a no-op on one process.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as tdist


@dataclass
class Dist:
    rank: int = 0
    world: int = 1
    device: str | None = None  # the device this rank must use (None: let the loader choose)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def sum(self, values: np.ndarray) -> np.ndarray:
        """Elementwise sum of ``values`` over all processes."""
        if self.world == 1:
            return values
        t = torch.as_tensor(values, dtype=torch.float64, device=self.device or "cpu")
        tdist.all_reduce(t)
        return t.cpu().numpy()

    def barrier(self) -> None:
        if self.world > 1:
            tdist.barrier()

    @contextmanager
    def main_first(self):
        """Run the block on rank 0 first (e.g. a download that fills a cache), then on the rest."""
        if not self.is_main:
            self.barrier()
        yield
        if self.is_main:
            self.barrier()


def init() -> Dist:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1:
        return Dist()
    rank, local = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    device = None
    if torch.cuda.is_available():
        torch.cuda.set_device(local)
        device = f"cuda:{local}"
    if not tdist.is_initialized():
        tdist.init_process_group("nccl" if device else "gloo")
    return Dist(rank, world, device)
