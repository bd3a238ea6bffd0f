"""Scoring many completions at once, in worker processes, with a per-item timeout.

A ``BatchScorer`` is to a ``TaskEnv`` what a Gymnasium vector env is to an ``Env``: a separate
object that holds the worker processes, so trainers and the eval harness start it once per run
and close it at the end, while the environment itself stays a plain, picklable object.

Each worker holds a copy of the environment (sent once, when the pool starts). Inside a worker
an interval timer stops any one item after ``timeout`` seconds; should a worker hang where Python
cannot interrupt it (a C extension), the parent stops waiting at a batch deadline, marks what is
left as timed out and replaces the pool.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import time
from collections.abc import Sequence
from typing import Any, Protocol

from llm_envs.types import Example, Score


class Scorable(Protocol):
    """What a ``BatchScorer`` needs of an environment (``TaskEnv`` is one)."""

    score_workers: int | None

    def score(self, completion: str, example: Example) -> Score: ...


_ENV: Scorable | None = None  # the worker's environment


class _ItemTimeout(BaseException):
    """Not an Exception, so that ``TaskEnv.score``'s safety net lets it through."""


def _on_alarm(signum, frame):
    raise _ItemTimeout


def _init_worker(env: Scorable) -> None:
    global _ENV
    _ENV = env
    signal.signal(signal.SIGALRM, _on_alarm)


def _score_chunk(items: list[tuple[str, Example]], timeout: float) -> list[Score]:
    out = []
    for completion, example in items:
        signal.setitimer(signal.ITIMER_REAL, timeout)
        try:
            out.append(_ENV.score(completion, example))
        except _ItemTimeout:
            out.append(Score(0.0, False, error="timeout"))
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
    return out


def default_workers() -> int:
    return max(1, min(8, os.cpu_count() or 1))


class BatchScorer:
    """Scores completions for one environment, in a pool of worker processes started on first use.

    ``workers``: ``None`` takes the env's ``score_workers`` (itself ``None`` = one per core, up to
    8); ``0`` scores in this process (no per-item timeout there). Close it when done (or use it
    as a context manager).
    """

    def __init__(self, env: Scorable, workers: int | None = None):
        self.env = env
        workers = env.score_workers if workers is None else workers
        self.workers = default_workers() if workers is None else int(workers)
        self._pool = None

    def score_batch(self, completions: Sequence[str], examples: Sequence[Example],
                    timeout: float = 10.0) -> list[Score]:
        """Score ``completions[i]`` against ``examples[i]``; each item gets at most ``timeout``
        seconds, after which it scores 0 with ``error='timeout'``."""
        if len(completions) != len(examples):
            raise ValueError(f"{len(completions)} completions for {len(examples)} examples")
        if self.workers == 0:
            return [self.env.score(c, e) for c, e in zip(completions, examples)]
        if not completions:
            return []
        if self._pool is None:
            self._start()
        items = list(zip(completions, examples))
        # Small chunks keep all workers busy; one chunk's worst case bounds its wait.
        size = max(1, min(64, len(items) // (4 * self.workers)))
        chunks = [items[i : i + size] for i in range(0, len(items), size)]
        pending = [self._pool.apply_async(_score_chunk, (chunk, timeout)) for chunk in chunks]
        rounds = -(-len(chunks) // self.workers)
        deadline = time.monotonic() + rounds * size * (timeout + 0.5) + 10.0
        scores: list[Score] = []
        broken = False
        for chunk, result in zip(chunks, pending):
            try:
                scores.extend(result.get(timeout=max(0.0, deadline - time.monotonic())))
            except mp.TimeoutError:
                broken = True
                scores.extend(Score(0.0, False, error="timeout") for _ in chunk)
            except Exception as exc:  # a worker died (e.g. killed by the OOM killer)
                broken = True
                scores.extend(Score(0.0, False, error=f"worker failed: {exc!r}") for _ in chunk)
        if broken:
            self.close()
        return scores

    def _start(self) -> None:
        # forkserver: workers never inherit the trainer's threads (torch, tqdm, tensorboard)
        ctx = mp.get_context("forkserver")
        self._pool = ctx.Pool(self.workers, initializer=_init_worker, initargs=(self.env,))
        try:  # workers that cannot start (say, __main__ read from stdin) would be respawned forever
            self._pool.apply_async(os.getpid).get(timeout=60)
        except Exception as exc:
            self.close()
            raise RuntimeError(
                f"scoring worker processes failed to start ({exc!r}); run from a script file, "
                "or pass workers=0 to score in this process"
            ) from None

    def close(self) -> None:
        """Stop the worker processes (a later ``score_batch`` starts new ones)."""
        if self._pool is not None:
            self._pool.terminate()
            self._pool.join()
            self._pool = None

    def __enter__(self) -> BatchScorer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __getstate__(self) -> dict[str, Any]:
        # Worker processes belong to the process that started them: a copy starts its own.
        return {**self.__dict__, "_pool": None}
