"""Scoring thousands of completions at once, in worker processes, with a per-item timeout.

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
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from llm_envs.core import Example, Score, TaskEnv

_ENV: TaskEnv | None = None  # the worker's environment


class _ItemTimeout(BaseException):
    """Not an Exception, so that ``TaskEnv.score``'s safety net lets it through."""


def _on_alarm(signum, frame):
    raise _ItemTimeout


def _init_worker(env: TaskEnv) -> None:
    global _ENV
    _ENV = env
    signal.signal(signal.SIGALRM, _on_alarm)


def _score_chunk(items: list[tuple[str, Example]], timeout: float) -> list[Score]:
    from llm_envs.core import Score

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
    """A pool of scoring processes bound to one environment."""

    def __init__(self, env: TaskEnv, workers: int | None = None):
        self.env = env
        self.workers = workers or default_workers()
        self._pool = None

    def _start(self):
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

    def score(self, completions: list[str], examples: list[Example], timeout: float) -> list[Score]:
        from llm_envs.core import Score

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

    def close(self) -> None:
        if self._pool is not None:
            self._pool.terminate()
            self._pool.join()
            self._pool = None
