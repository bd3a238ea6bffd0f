"""Scoring model text in bounded time: every call that scores a completion (``TaskEnv.step``,
``score``, ``score_batch``, a ``BatchScorer``) returns within a deadline, by one of two mechanisms:

- **An interval timer in this process** (``SIGALRM``), for environments whose scorer is cheap pure
  Python (``score_workers = 0``: Countdown, Sudoku, Conciseness). A signal interrupts Python code
  and blocking system calls, at a cost of a few microseconds per call. Signal handlers run on
  the main thread only: called from another thread, the scorer's worker process takes the call.
- **Worker processes killed at the deadline**, for every other scorer (MATH: sympy can spend
  minutes inside C code that no signal interrupts; ARC: a sandbox per completion). Inside a
  worker the same timer stops Python-level work at ``timeout``; a worker still busy
  ``GRACE`` seconds later is killed and replaced, and the item scores as a timeout.

A completion not scored in time gets reward 0 with ``error="timeout"``. A ``BatchScorer`` is to a
``TaskEnv`` what a Gymnasium vector env is to an ``Env``: a separate object that holds the worker
processes, so trainers and the eval harness start one per run and close it at the end.
"""

from __future__ import annotations

import math
import multiprocessing as mp
import os
import signal
import sys
import threading
import time
from collections import deque
from collections.abc import Sequence
from multiprocessing.connection import wait
from typing import Any, Protocol

from llm_envs.types import Example, Score

#: Seconds a worker gets past an item's timeout before it is killed (its own timer fires first
#: for Python-level work; this catches code that blocks in C).
GRACE = 1.0
#: Seconds a new worker process may take to start (imports, ``prepare_scoring``).
START_TIMEOUT = 60.0
#: Seconds to wait for a worker whose pipe closed to exit, so its exit code can be reported.
EXIT_WAIT = 5.0


class Scorable(Protocol):
    """What scoring needs of an environment (``TaskEnv`` is one)."""

    score_workers: int | None
    score_timeout: float

    def score_completion(self, completion: str, example: Example) -> Score: ...

    def prepare_scoring(self) -> None: ...


def checked_score(env: Scorable, completion: str, example: Example) -> Score:
    """``env.score_completion`` of the whole assistant turn, ``example.opening + completion``, with
    its failures as scores (reward 0, ``error`` set); no time bound. Every scoring path (``step``,
    ``score``, ``score_batch``, a ``BatchScorer``, its workers) comes here, so this is the one
    place where the opening is put in front of the completion."""
    if not isinstance(completion, str):
        return Score(0.0, False, error=f"completion must be str, got {type(completion).__name__}")
    try:
        score = env.score_completion(example.opening + completion, example)
    except Exception as exc:  # a scorer bug must not kill a training run
        return Score(0.0, False, error=f"{type(exc).__name__}: {exc}")
    if not math.isfinite(score.reward):
        return Score(0.0, False, score.parts, error=f"non-finite reward {score.reward}")
    return score


# ----- the timer ------------------------------------------------------------------------------------


class _ItemTimeout(BaseException):
    """Not an Exception, so that ``checked_score``'s safety net lets it through."""


def _raise_timeout(signum, frame):
    raise _ItemTimeout


def timer_usable() -> bool:
    """Whether this call can bound itself with ``SIGALRM``: Python runs signal handlers on the
    main thread only."""
    return threading.current_thread() is threading.main_thread()


def score_with_timer(env: Scorable, completion: str, example: Example, timeout: float) -> Score:
    """``checked_score`` stopped after ``timeout`` seconds by ``SIGALRM`` (main thread only).

    An interval timer already running (the caller's own, pytest-timeout's) is respected: ours is
    never longer than what is left of it, and afterwards it is re-armed with what is left, with
    its handler back in place (when it would have fired during the call, it fires right away).
    """
    outer_left, outer_interval = signal.getitimer(signal.ITIMER_REAL)
    previous = signal.signal(signal.SIGALRM, _raise_timeout)
    start = time.monotonic()
    try:
        try:
            signal.setitimer(signal.ITIMER_REAL, min(timeout, outer_left) if outer_left else timeout)
            return checked_score(env, completion, example)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
    except _ItemTimeout:  # also when the alarm lands between the scorer's return and the cancel
        return Score(0.0, False, error="timeout")
    finally:
        signal.signal(signal.SIGALRM, previous)
        if outer_left:
            signal.setitimer(signal.ITIMER_REAL, max(outer_left - (time.monotonic() - start), 1e-6), outer_interval)


# ----- worker processes -------------------------------------------------------------------------------


def _serve(conn, env: Scorable) -> None:
    """A worker's loop: receive ``(items, timeout)``, send back one ``Score`` per item as it is done."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    try:
        env.prepare_scoring()
    except Exception as exc:
        conn.send(f"{type(exc).__name__}: {exc}")
        return
    conn.send("ready")
    while True:
        try:
            message = conn.recv()
        except EOFError:  # the parent is gone
            return
        if message is None:
            return
        items, timeout = message
        for completion, example in items:
            conn.send(score_with_timer(env, completion, example, timeout))


class WorkerStartError(RuntimeError):
    """A scoring worker process could not start; the message says why and what to do."""


def _start_failure(env: Scorable, why: str) -> WorkerStartError:
    """The error for a worker that died before it could say why (in multiprocessing's start-up)."""
    main = sys.modules.get("__main__")
    script = getattr(main, "__file__", None)
    if start_method() == "fork":  # a forked worker re-imports nothing: the guard is not the cause
        advice = ("the worker died while starting; it was forked from this process, so the cause is in the "
                  "environment object sent to it (it must be picklable) or in the process's resources "
                  "(memory, process limits)")
    elif script and getattr(getattr(main, "__spec__", None), "name", None) is None:
        if os.path.isfile(script):
            advice = (f"the script {script} has no `if __name__ == \"__main__\":` guard around the code that "
                      f"scores completions: worker processes re-import the main script, re-run its top-level "
                      f"code and fail there. Put that code under the guard")
        else:
            advice = (f"the main program ({script}) was read from standard input, which worker processes "
                      f"cannot re-import: save it as a script file, with the code that scores completions "
                      f"under `if __name__ == \"__main__\":`")
    else:
        advice = ("worker processes cannot import the environment's class; define it in a module file, "
                  "not in an interactive session or `python -c`")
    return WorkerStartError(f"a scoring worker process for {type(env).__name__} {why}. Most likely cause: "
                            f"{advice} (the worker's own error is printed above).")


def start_method() -> str:
    """How worker processes start. ``forkserver`` where possible: workers never inherit the
    trainer's threads (torch, tqdm, tensorboard). But a forkserver (or spawn) child re-imports a
    main *script* and re-runs its top-level code, which in a script without an
    ``if __name__ == "__main__":`` guard scores again and starts workers again (and an env class
    defined in such a script exists only there). So when the main program is a script run by path
    (or read from stdin), workers are forked: they get the script's classes without re-running it."""
    main = sys.modules.get("__main__")
    by_path = getattr(main, "__file__", None) is not None and getattr(getattr(main, "__spec__", None), "name", None) is None
    from_stdin = getattr(main, "__file__", "") == "<stdin>" or (main is not None and not hasattr(main, "__file__"))
    if (by_path or from_stdin) and "fork" in mp.get_all_start_methods():
        return "fork"
    return "forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn"


class _Worker:
    """One scoring process and the pipe to it."""

    def __init__(self, env: Scorable):
        ctx = mp.get_context(start_method())
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(target=_serve, args=(child, env), daemon=True, name="llm_envs-scorer")
        try:
            self.process.start()
        except Exception as exc:
            raise _start_failure(env, f"could not start ({type(exc).__name__}: {exc})") from None
        finally:
            child.close()

    def wait_ready(self, env: Scorable, timeout: float = START_TIMEOUT) -> None:
        if not wait([self.conn, self.process.sentinel], timeout):
            self.kill()
            raise _start_failure(env, f"did not start within {timeout:.0f} s")
        try:
            message = self.conn.recv()
        except (EOFError, OSError):
            message = None
        if message == "ready":
            return
        if message is not None:  # the worker's own report
            self.kill()
            raise WorkerStartError(f"a scoring worker process for {type(env).__name__} failed to start: {message}")
        self.process.join(1.0)
        code = self.process.exitcode
        self.kill()
        raise _start_failure(env, f"exited while starting (exit code {code})")

    def failure(self) -> str:
        """Why the worker stopped answering, with its exit code (-9: SIGKILL, e.g. the OOM killer;
        a positive code: the process exited). Its pipe closes before the process is reaped, so the
        process is joined briefly first."""
        self.process.join(EXIT_WAIT)
        if self.process.exitcode is None:
            return f"worker failed (its pipe closed; still running after {EXIT_WAIT:g} s)"
        return f"worker failed (exit code {self.process.exitcode})"

    def kill(self) -> None:
        if self.process.is_alive():
            self.process.kill()
        self.process.join()
        self.conn.close()


# ----- the scorer -------------------------------------------------------------------------------------


def default_workers() -> int:
    return max(1, min(8, os.cpu_count() or 1))


def resolve_workers(env: Scorable, workers: int | None) -> int:
    """How many worker processes scoring ``env`` uses: ``workers``, else the env's
    ``score_workers``, else one per core (up to 8). ``0`` (this process, under the timer) only
    for an env whose scorer is pure Python (``score_workers == 0``); others get at least one."""
    if workers is None:
        workers = env.score_workers
    if workers is None:
        return default_workers()
    return int(workers) if workers > 0 or env.score_workers == 0 else 1


class BatchScorer:
    """Scores completions for one environment, each within ``timeout`` seconds (default: the env's
    ``score_timeout``); see the module docstring for how.

    ``workers``: processes (started on first use), ``None`` = the env's ``score_workers`` (``None``
    there = one per core, up to 8); ``0`` = in this process under a timer, for pure-Python
    scorers. Close it when done (or use it as a context manager). Thread-safe: concurrent calls
    take turns.
    """

    def __init__(self, env: Scorable, workers: int | None = None, timeout: float | None = None):
        self.env = env
        self.workers = resolve_workers(env, workers)
        self.timeout = timeout
        self._workers: list[_Worker] = []
        self._lock = threading.Lock()

    def score_batch(self, completions: Sequence[str], examples: Sequence[Example],
                    timeout: float | None = None) -> list[Score]:
        """Score ``completions[i]`` against ``examples[i]``; an item not done within ``timeout``
        seconds (default: the scorer's) scores 0 with ``error='timeout'``."""
        if len(completions) != len(examples):
            raise ValueError(f"{len(completions)} completions for {len(examples)} examples")
        timeout = float(timeout or self.timeout or self.env.score_timeout)
        if self.workers == 0 and timer_usable():
            return [score_with_timer(self.env, c, e, timeout) for c, e in zip(completions, examples)]
        if not completions:
            return []
        with self._lock:
            return self._score_in_workers(list(zip(completions, examples)), timeout)

    def score(self, completion: str, example: Example, timeout: float | None = None) -> Score:
        """Score one completion (``score_batch`` of one)."""
        if self.workers == 0 and timer_usable():  # the common case, kept short: it runs per step
            return score_with_timer(self.env, completion, example,
                                    float(timeout or self.timeout or self.env.score_timeout))
        return self.score_batch([completion], [example], timeout)[0]

    def _score_in_workers(self, items: list[tuple[str, Example]], timeout: float) -> list[Score]:
        wanted = max(1, self.workers)
        scores: list[Score | None] = [None] * len(items)
        # Small chunks keep all workers busy; each item is sent back as soon as it is scored.
        size = max(1, min(64, len(items) // (4 * wanted)))
        todo = deque(list(range(i, min(i + size, len(items)))) for i in range(0, len(items), size))
        busy: dict[_Worker, list[Any]] = {}  # worker -> [item indices, next position, deadline]
        try:
            while todo or busy:
                if todo and len(self._workers) < wanted:  # first use, or replacing killed ones
                    self._start(wanted)
                for worker in [w for w in self._workers if w not in busy]:
                    if not todo:
                        break
                    if not worker.process.is_alive():  # died while idle (the OOM killer, say): replace it
                        self._drop(worker)
                        continue
                    chunk = todo.popleft()
                    try:
                        worker.conn.send(([items[i] for i in chunk], timeout))
                    except OSError:  # died between the check and the send: replace it, the chunk goes again
                        self._drop(worker)
                        todo.appendleft(chunk)
                        continue
                    busy[worker] = [chunk, 0, time.monotonic() + timeout + GRACE]
                if not busy:  # every idle worker was dead: start new ones
                    continue
                wait([w.conn for w in busy] + [w.process.sentinel for w in busy],
                     max(0.0, min(job[2] for job in busy.values()) - time.monotonic()))
                for worker, job in list(busy.items()):
                    if self._collect(worker, job, scores, timeout):
                        del busy[worker]
                        if job[1] < len(job[0]):  # stopped: the rest of its chunk goes again
                            todo.appendleft(job[0][job[1]:])
        except BaseException:  # interrupted: busy workers would answer for items no one waits for
            for worker in busy:
                self._drop(worker)
            raise
        return scores  # type: ignore[return-value]

    def _collect(self, worker: _Worker, job: list[Any], scores: list[Score | None], timeout: float) -> bool:
        """Take the scores ``worker`` has sent; True when its chunk is done or it was stopped (dead,
        or past the deadline: killed, and its item in progress scores as failed)."""
        chunk, failed = job[0], None
        try:
            while job[1] < len(chunk) and worker.conn.poll():
                scores[chunk[job[1]]] = worker.conn.recv()
                job[1] += 1
                job[2] = time.monotonic() + timeout + GRACE
        except (EOFError, OSError):  # the pipe closed: the process died (or is dying); say how
            failed = worker.failure()
        if job[1] == len(chunk):
            return True
        if failed is None and not worker.process.is_alive():
            failed = worker.failure()
        if failed is None and time.monotonic() >= job[2]:
            failed = "timeout"
        if failed is None:
            return False
        scores[chunk[job[1]]] = Score(0.0, False, error=failed)
        job[1] += 1
        self._drop(worker)
        return True

    def _drop(self, worker: _Worker) -> None:
        worker.kill()
        self._workers.remove(worker)

    def _start(self, count: int) -> None:
        """Start workers until there are ``count`` (in parallel: they start while others do)."""
        new: list[_Worker] = []
        try:
            while len(self._workers) + len(new) < count:
                new.append(_Worker(self.env))
            for worker in new:
                worker.wait_ready(self.env)
        except BaseException:
            for worker in new:
                worker.kill()
            raise
        self._workers += new

    def close(self) -> None:
        """Stop the worker processes (a later call starts new ones)."""
        workers, self._workers = self._workers, []
        for worker in workers:
            try:
                worker.conn.send(None)
            except OSError:
                pass
        for worker in workers:
            worker.process.join(0.5)
            worker.kill()

    def __enter__(self) -> BatchScorer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __getstate__(self) -> dict[str, Any]:
        # Worker processes and locks belong to the process that made them: a copy makes its own.
        return {"env": self.env, "workers": self.workers, "timeout": self.timeout}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state, _workers=[], _lock=threading.Lock())
