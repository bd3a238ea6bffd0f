"""Many processes (``accelerate launch`` / ``torchrun``): ranks, a sum across processes, order.

ES exchanges only per-member scalars, so the whole protocol is one all-reduce per iteration
(plus one for the held-out evaluation, which every rank shares). Without a launcher
(WORLD_SIZE unset) everything here is a no-op on one process.

Timeouts. Collectives (the all-reduces) time out after torch's default (NCCL 10 min, gloo
30 min; ``$LLM_ENVS_DIST_TIMEOUT`` seconds overrides it). Work that only rank 0 does (fetching
the default model, saving a checkpoint or the final model, which takes minutes for a 7B model)
is never waited for inside a collective: the other ranks wait at ``wait_for_main``, a barrier
on a separate gloo group whose timeout is ``$LLM_ENVS_DIST_WAIT`` seconds (default 6 hours).
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as tdist

WAIT_DEFAULT_S = 6 * 3600


@dataclass
class Dist:
    rank: int = 0
    world: int = 1
    device: str | None = None  # the device this rank must use (None: let the loader choose)
    waits: object = field(default=None, repr=False)  # the long-timeout gloo group of wait_for_main

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def sum(self, values: np.ndarray) -> np.ndarray:
        """Elementwise sum of ``values`` over all processes."""
        if self.world == 1:
            return np.asarray(values)
        t = torch.as_tensor(np.asarray(values), dtype=torch.float64, device=self.device or "cpu")
        tdist.all_reduce(t)
        return t.cpu().numpy()

    def wait_for_main(self) -> None:
        """Every rank waits here until all arrive, rank 0 after its own work (saving, fetching),
        with the long timeout of the wait group, not a collective's."""
        if self.world > 1:
            tdist.barrier(group=self.waits)

    @contextmanager
    def main_first(self):
        """Run the block on rank 0 first (e.g. a download that fills a cache), then on the rest."""
        if not self.is_main:
            self.wait_for_main()
        yield
        if self.is_main:
            self.wait_for_main()


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
        timeout = os.environ.get("LLM_ENVS_DIST_TIMEOUT")
        tdist.init_process_group("nccl" if device else "gloo",
                                 **({"timeout": timedelta(seconds=float(timeout))} if timeout else {}))
    wait = timedelta(seconds=float(os.environ.get("LLM_ENVS_DIST_WAIT", WAIT_DEFAULT_S)))
    return Dist(rank, world, device, waits=tdist.new_group(backend="gloo", timeout=wait))
