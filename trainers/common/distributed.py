"""Many processes (``accelerate launch`` / ``torchrun``): ranks, a sum across processes, order,
a check that the ranks still hold the same weights, and one-line errors when a process is lost.

ES exchanges only per-member scalars, so the whole protocol is one all-reduce per iteration
(plus one for the held-out evaluation, which every rank shares, and a weight checksum every few
iterations, ``same_weights``). Without a launcher (WORLD_SIZE unset) everything here is a no-op
on one process.

Timeouts. Collectives (the all-reduces) time out after torch's default (NCCL 10 min, gloo
30 min; ``$LLM_ENVS_DIST_TIMEOUT`` seconds overrides it). Work that only rank 0 does (fetching
the default model, saving a checkpoint or the final model, which takes minutes for a 7B model)
is never waited for inside a collective: the other ranks wait at ``wait_for_main``, a barrier
on a separate gloo group whose timeout is ``$LLM_ENVS_DIST_WAIT`` seconds (default 6 hours).

A lost process. When a process dies, the others stop with one line, never a traceback
(``one_line_errors`` around the entry point): those inside a collective when gloo reports the
peer's closed connection (or the collective's timeout) raise ``PeerLost``; those stopped by the
launcher (torchrun sends SIGTERM to the survivors of a failed worker) raise ``Stopped`` from the
SIGTERM handler ``one_line_errors`` installs. Both say what the process was doing (``Dist.phase``) and how
to continue (``Dist.hint``).

Exit. The process group ``init`` starts is destroyed at interpreter exit (``_teardown``, an
``atexit`` hook), so gloo's and NCCL's threads are joined while the interpreter is whole; left to
static destructors, a rank could abort at exit ("terminate called without an active exception").
"""

from __future__ import annotations

import atexit
import hashlib
import os
import signal
import sys
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as tdist

WAIT_DEFAULT_S = 6 * 3600
#: Exit code of a run stopped by a lost process, a launcher's SIGTERM or diverged weights.
EXIT_CODE = 1


class DistributedError(RuntimeError):
    """A multi-process run cannot go on; the message is one line (``one_line_errors`` prints it).
    From its making on, the launcher's SIGTERM that follows it is ignored (``_stop``): raised while
    this error unwinds, ``Stopped`` would take its place or break its one line with a traceback."""

    def __init__(self, *args: object) -> None:
        global _erring
        _erring = True
        super().__init__(*args)


class PeerLost(DistributedError):
    """A collective failed: another process died, or stopped answering within the timeout."""


class Diverged(DistributedError):
    """The ranks' weights are no longer identical."""


class Stopped(BaseException):
    """The launcher stopped this process (SIGTERM). A BaseException, so that no ``except
    Exception`` on the way (a library's, a retry loop's) turns it into something else."""


@dataclass
class Dist:
    rank: int = 0
    world: int = 1
    device: str | None = None  # the device this rank must use (None: let the loader choose)
    waits: object = field(default=None, repr=False)  # the long-timeout gloo group of wait_for_main
    phase: str = "start-up"  # what the run is doing, for the message of a lost process
    hint: str = ""  # how to continue a stopped run (e.g. "resume it with --resume DIR")

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def sum(self, values: np.ndarray) -> np.ndarray:
        """Elementwise sum of ``values`` over all processes."""
        if self.world == 1:
            return np.asarray(values)
        t = torch.as_tensor(np.asarray(values), dtype=torch.float64, device=self.device or "cpu")
        with self.collective("an all-reduce"):
            tdist.all_reduce(t)
        return t.cpu().numpy()

    def from_main(self, value):
        """Rank 0's ``value`` (a picklable object) on every rank: e.g. the default run directory, whose
        name holds the time each rank started at."""
        if self.world == 1:
            return value
        box = [value]
        with self.collective("a broadcast"):
            tdist.broadcast_object_list(box, src=0, group=self.waits)
        return box[0]

    def wait_for_main(self) -> None:
        """Every rank waits here until all arrive, rank 0 after its own work (saving, fetching),
        with the long timeout of the wait group, not a collective's."""
        if self.world > 1:
            with self.collective("a barrier"):
                tdist.barrier(group=self.waits)

    @contextmanager
    def main_first(self):
        """Run the block on rank 0 first (e.g. a download that fills a cache), then on the rest."""
        if not self.is_main:
            self.wait_for_main()
        yield
        if self.is_main:
            self.wait_for_main()

    def same_weights(self, tensors, when: str) -> None:
        """Raise ``Diverged`` unless every rank holds bit-identical ``tensors`` (the model's
        weights, fp32 masters): each rank's ``checksum``, gathered (16 bytes per rank). ``when``
        names the moment ("after iteration 20"). One process: nothing to compare, nothing computed."""
        if self.world == 1:
            return
        local = torch.tensor(checksum(tensors), dtype=torch.int64, device=self.device or "cpu")
        gathered = [torch.empty_like(local) for _ in range(self.world)]
        with self.collective("the weight check"):
            tdist.all_gather(gathered, local)
        sums = [tuple(int(v) for v in g.cpu()) for g in gathered]
        differ = [r for r in range(1, self.world) if sums[r] != sums[0]]
        if differ:
            ranks = (f"rank {differ[0]}" if len(differ) == 1 else
                     "ranks " + ", ".join(map(str, differ)))
            raise Diverged(f"{when} the weights of {ranks} differ from rank 0's (weight checksums "
                           f"{', '.join(f'{r}: {sums[r][0] & 0xFFFFFFFF:08x}' for r in [0, *differ])}): the processes "
                           f"no longer train the same model, so the run stops{self._hint()}")

    @contextmanager
    def collective(self, what: str):
        """Run a collective; a failure (a peer's closed connection, a timeout) becomes ``PeerLost``."""
        try:
            yield
        except RuntimeError as exc:  # gloo's and NCCL's errors are RuntimeErrors (DistBackendError)
            if isinstance(exc, DistributedError):
                raise
            raise PeerLost(f"rank {self.rank} of {self.world} lost contact with the other processes in {what} "
                           f"during {self.phase} ({_reason(exc)}): another process died or stopped answering; every "
                           f"process stops{self._hint()}") from exc

    def _hint(self) -> str:
        return f"; {self.hint}" if self.hint else ""


def checksum(tensors) -> tuple[int, int]:
    """128 bits that change when any bit of ``tensors`` changes. Tensors in CPU memory: SHA-256 of
    their raw bytes (~1.6 GB/s here, on one thread whatever torch's thread count). Tensors on a GPU
    are summed where they live, so nothing is copied to the host: per tensor, two 64-bit integer sums
    over each element's bits read as an integer of its width, plain and weighted by position (mod
    65521), which a changed value or two swapped ones change (integer sums wrap the same way on
    every rank); the sums then go into the hash."""
    h = hashlib.sha256()
    sums = []
    for t in tensors:
        flat = t.detach().reshape(-1)
        if flat.numel() == 0:
            continue
        if flat.device.type == "cpu":
            h.update(flat.contiguous().view(torch.uint8).numpy().data)
        else:
            sums.append(integer_sums(flat))
    if sums:
        h.update(str(torch.stack(sums).sum(0).tolist()).encode())
    digest = h.digest()
    return int.from_bytes(digest[:8], "little", signed=True), int.from_bytes(digest[8:16], "little", signed=True)


#: Elements per integer sum of a GPU tensor's checksum (32 MB of int64 at a time).
CHUNK = 1 << 22
_INTS = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def integer_sums(flat: torch.Tensor) -> torch.Tensor:
    """``(plain, weighted)`` int64 sums of a 1-D tensor's elements' bits, on its device (``checksum``)."""
    bits = flat.view(_INTS[flat.element_size()]) if flat.dtype != torch.bool else flat.to(torch.int8)
    w = torch.arange(min(CHUNK, bits.numel()), dtype=torch.int64, device=bits.device) % 65521 + 1
    total = torch.zeros(2, dtype=torch.int64, device=bits.device)
    for part in bits.split(CHUNK):
        v = part.to(torch.int64)
        total += torch.stack([v.sum(), (v * w[:v.numel()]).sum()])
    return total


def _reason(exc: BaseException) -> str:
    """The informative part of a torch.distributed error, on one line (gloo's messages start with
    a source location and may span lines)."""
    text = " ".join(str(exc).split())
    if text.startswith("[") and "] " in text[:200]:  # gloo: "[../gloo/transport/tcp/pair.cc:538] Read error ..."
        text = text.split("] ", 1)[1]
    text = text.split(". ", 1)[0].rstrip(".")  # the first sentence: what happened, not the advice after it
    return (text[:200] + "..." if len(text) > 200 else text) or type(exc).__name__


def init() -> Dist:
    """This process's ``Dist``: one process without a launcher; else the process group, started
    once per process (a study trains many runs in the same processes) with its wait group."""
    global _current
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1:
        return Dist()
    if _current is not None and tdist.is_initialized():
        return _current
    rank, local = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    device = None
    if torch.cuda.is_available():
        torch.cuda.set_device(local)
        device = f"cuda:{local}"
    if not tdist.is_initialized():
        timeout = os.environ.get("LLM_ENVS_DIST_TIMEOUT")
        tdist.init_process_group("nccl" if device else "gloo",
                                 **({"timeout": timedelta(seconds=float(timeout))} if timeout else {}))
        atexit.register(_teardown)  # a group started by someone else is theirs to destroy
    wait = timedelta(seconds=float(os.environ.get("LLM_ENVS_DIST_WAIT", WAIT_DEFAULT_S)))
    _current = Dist(rank, world, device, waits=tdist.new_group(backend="gloo", timeout=wait))
    return _current


#: The Dist of this process's run (what a SIGTERM message says the process was doing).
_current: Dist | None = None
#: Set when ``one_line_errors`` stopped the run: the process group is then left to the exit.
_failed = False
#: Set when a ``DistributedError`` is made: its one line is on its way, so a SIGTERM adds nothing.
_erring = False


def _teardown() -> None:
    """At exit, after a run that did not fail: destroy the process group (and the wait group).
    After a failure it is left alone: a group whose peer died or hung may block in its destruction,
    and the exit code already says that the run failed."""
    if not _failed and tdist.is_initialized():
        tdist.destroy_process_group()


def _stop(signum, frame):
    """SIGTERM: raise ``Stopped``, unless a ``DistributedError`` is already on its way out (a peer's
    death seen by a collective races the launcher's SIGTERM: the first cause is the one to print)."""
    if _erring:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        return
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second SIGTERM ends the process at once
    d = _current or Dist(int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1")))
    raise Stopped(f"rank {d.rank} of {d.world} was stopped by its launcher (SIGTERM) during {d.phase}, most likely "
                  f"because another process failed{d._hint()}")


@contextmanager
def one_line_errors():
    """Around an entry point: a lost process, a launcher's SIGTERM (several processes only:
    torchrun stops the survivors of a failed process with it) or diverged weights end the process
    with one ``error:`` line on stderr (after the progress bars, which are closed first) and exit
    code ``EXIT_CODE``, never a traceback."""
    import threading

    global _failed, _erring
    _erring = False
    handle = int(os.environ.get("WORLD_SIZE", "1")) > 1 and threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _stop) if handle else None
    try:
        yield
    except (DistributedError, Stopped) as exc:
        _failed = True
        if handle:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the launcher's SIGTERM may follow: one line only
        _close_bars()
        print(f"error: {exc}", file=sys.stderr, flush=True)
        raise SystemExit(EXIT_CODE) from None
    finally:
        if handle and signal.getsignal(signal.SIGTERM) is _stop:
            signal.signal(signal.SIGTERM, previous)


def _close_bars() -> None:
    """Close every open progress bar, so that the error is the last line of stderr."""
    try:
        from tqdm import tqdm

        for bar in list(getattr(tqdm, "_instances", ())):
            try:
                bar.close()
            except Exception:  # a bar half-torn by the exception: leave it
                pass
    except ImportError:
        pass
