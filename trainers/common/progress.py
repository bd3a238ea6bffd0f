"""Progress, shown and projected: the one home of what a run says about how far it is and how
long it will take.

**Display.** Progress bars that suit where the output goes: live tqdm bars in a terminal, plain
lines in a log file.

In a terminal (stderr is a TTY) every long phase has a tqdm bar redrawn in place, nested bars
included. Written to a file (a cluster job's log, ``2> run.log``), redrawn bars would leave
carriage returns, escape codes and a line per decode step (tens of MB over a long run), so there
a bar writes plain lines instead: a run-level bar (ES iterations, RL steps, the study's runs) one
per update, every other bar at most one every ``LINE_EVERY`` seconds across all bars, and no
bar is drawn inside another. ``LLM_ENVS_PROGRESS=bars|lines`` overrides the choice.

``RowProgress`` counts the rows of one generation call for a bar and for ``on_progress``.

**Projection.** How long a run will take, said before it is long: a trainer measures its first
work on this device and extrapolates to the whole run, with no table of device speeds.

``RunClock`` says three things at most, each once:

- the held-out evaluation's time (``evaluation``, its generation's ``on_progress``): per
  evaluation and for all of the run's, once the first evaluation has run ``SETTLE`` seconds past
  its first report (or ended). Every pace is a call's seconds so far over its rows done, the
  prompt pass included (it grows with the rows: with rg/'s long system prompt it was most of a
  call). It says nothing of training: held-out prompts are generated in
  other batches than a unit's, so their pace per response is no measure of a unit's;
- a projection per unit and for the run from the first training generation (``generation``: an
  ES member's or low-rank iteration's rows, an RL step's samples), once it has run ``SETTLE``
  seconds. Where a unit does more than generate (``also``: an RL step's update, which on CPU took
  4x its sampling for SmolLM2), only the sampling's time per unit is said, and what it leaves out.
  Shorter calls are not extrapolated: their fixed costs (noise work, prompt pass) are too large a
  share; the next item comes soon after them;
- a projection from the first unit of training work, whole (``trained``: an ES member or
  iteration, an RL step), the most faithful.

An engine that counts a row only when it finishes (vLLM, ``Engine.finished_rows_only``) gives no
pace until a call ends, so with ``whole_calls`` the pace is seconds / rows of a call that ended.
When the projected run exceeds ``LONG``, the projection names the options that shorten it.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import torch
from tqdm import tqdm

# ----- display: bars in a terminal, lines in a log --------------------------------------------

#: Seconds between two plain lines of bars other than the run-level one (when not in a terminal).
LINE_EVERY = 30.0
#: What a plain line says: no bar, just counts, the rate and the time left.
LINE_FORMAT = "{desc}: {n_fmt}/{total_fmt} {unit} ({percentage:.0f}%) [{elapsed}<{remaining}, {rate_fmt}]{postfix}"
BAR_FORMAT = "{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} {unit} [{elapsed}<{remaining}, {rate_fmt}]{postfix}"


def live() -> bool:
    """Whether progress is drawn as live bars: stderr is a terminal (``$LLM_ENVS_PROGRESS`` =
    ``bars`` or ``lines`` decides instead when set)."""
    choice = os.environ.get("LLM_ENVS_PROGRESS", "").strip().lower()
    if choice in ("bars", "lines"):
        return choice == "bars"
    return sys.stderr.isatty()


class LineBar(tqdm):
    """A tqdm bar for log files: each display is one plain line (no carriage return, no cursor
    movement), at most one every ``every`` seconds across all line bars (``every=0``: at every
    update, the run-level bar)."""

    _last_line = float("-inf")  # when any line bar last wrote

    def __init__(self, *args, every: float = LINE_EVERY, **kwargs):
        self.every, self._written_over = every, False
        kwargs.update(mininterval=0, miniters=1, leave=False, dynamic_ncols=False)
        kwargs.setdefault("bar_format", LINE_FORMAT)
        super().__init__(*args, **kwargs)

    def display(self, msg=None, pos=None) -> bool:
        if msg is not None:  # clearing the bar (close): nothing to clear in a log
            return False
        if self._written_over:  # tqdm.write redraws every bar after its line: not progress
            self._written_over = False
            return True
        now = time.monotonic()
        if self.every and now - LineBar._last_line < self.every:
            return True
        LineBar._last_line = now
        self.fp.write(self.__str__() + "\n")
        self.fp.flush()
        return True

    def set_postfix(self, ordered_dict=None, refresh: bool = True, **kwargs) -> None:
        super().set_postfix(ordered_dict, refresh=False, **kwargs)  # shown with the next line

    def set_postfix_str(self, s: str = "", refresh: bool = True) -> None:
        super().set_postfix_str(s, refresh=False)

    def clear(self, nolock: bool = False) -> None:
        self._written_over = True  # tqdm.write clears each bar, writes, then redraws it


    def moveto(self, n: int) -> None:
        pass


def bar(iterable: Iterable | None = None, *, total: float | None = None, desc: str = "", unit: str = "it",
        initial: float = 0, disable: bool = False, run: bool = False, fractional: bool = False) -> tqdm:
    """A progress bar of ``total`` ``unit``s named ``desc``: a live tqdm bar in a terminal, else a
    ``LineBar``. ``run``: the run-level bar (kept on screen in a terminal, a line per update in a
    log); every other bar is transient (cleared when done; in a log, a line every ``LINE_EVERY`` s).
    ``fractional``: counts that move by fractions (rows by their share of tokens), shown rounded."""
    count = "{n:.0f}" if fractional else "{n_fmt}"
    common = dict(total=total, desc=desc, unit=unit, initial=initial, disable=disable)
    if live():
        return tqdm(iterable, leave=run, dynamic_ncols=True,
                    bar_format=BAR_FORMAT.replace("{n_fmt}", count) if fractional else None, **common)
    return LineBar(iterable, every=0 if run else LINE_EVERY, bar_format=LINE_FORMAT.replace("{n_fmt}", count), **common)


def rows_bar(total: int, enabled: bool | str) -> tqdm | None:
    """A transient bar of a generation call's rows (named by ``enabled`` when a string), or None when off."""
    if not enabled:
        return None
    return bar(total=total, desc=enabled if isinstance(enabled, str) else "generate", unit="seq", fractional=True)


class RowProgress:
    """Counts the rows of a generation call done, for a bar and ``on_progress(done, total, seconds)``:
    finished batches whole, the current batch's rows by their share of ``max_new_tokens`` generated
    (rows that stopped early whole), so the ETA is an upper bound until the end. HF ``generate``
    reports through ``stopping_criteria()``, a criterion that never stops anything (HF calls those
    after every step); the native engine calls ``step`` itself."""

    def __init__(self, bar: tqdm | None, on_progress: Callable[[float, int, float], None] | None, total: int,
                 max_new_tokens: int):
        self.bar, self.on_progress, self.total, self.max_new = bar, on_progress, total, max_new_tokens
        self.start = time.perf_counter()
        self.done = 0.0  # whole batches
        self.rows, self.width = 0, 0

    def batch(self, rows: int, width: int = 0) -> None:
        """A batch of ``rows`` rows starts (``width``: its prompt tokens, for HF's step count)."""
        self.rows, self.width = rows, width

    def step(self, steps: int, live: int | None = None) -> None:
        """The batch has generated ``steps`` tokens per row; ``live`` of its rows are still going (default all)."""
        live = self.rows if live is None else live
        self._report(self.done + self.rows - live + live * min(steps, self.max_new) / self.max_new)

    def batch_done(self) -> None:
        self.done += self.rows
        self._report(self.done)

    def stopping_criteria(self):
        from transformers import StoppingCriteriaList

        return StoppingCriteriaList([self])

    def __call__(self, input_ids: torch.Tensor, scores, **kwargs) -> torch.Tensor:
        self.step(input_ids.shape[1] - self.width)
        return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)

    def _report(self, done: float) -> None:
        if self.bar is not None:
            self.bar.update(done - self.bar.n)
        if self.on_progress is not None:
            self.on_progress(done, self.total, time.perf_counter() - self.start)


# ----- projection: how long the run will take --------------------------------------------------

#: Seconds of a first generation the per-response projection waits for (or for the call's end).
SETTLE = 20.0
#: A projected run longer than this (seconds) comes with the options that shorten it.
LONG = 3 * 3600.0


def duration(seconds: float) -> str:
    """``seconds`` in the unit a person reads best: 40 s, 12 min, 3.4 h, 5.2 days, 3.1 years."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 2 * 3600:
        return f"{seconds / 60:.0f} min"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.1f} h"
    if seconds < 2 * 365 * 86400:
        return f"{seconds / 86400:.1f} days"
    return f"{seconds / (365 * 86400):.1f} years"


def plural(count: int, noun: str) -> str:
    return f"{count} {noun}{'s' * (count != 1)}"


def options(*names: str) -> str:
    """``a, b or c``: the options that would change a run's time."""
    return ", ".join(names[:-1]) + (" or " if len(names) > 1 else "") + names[-1]


def evaluations_left(done: int, total: int, every: int) -> int:
    """Held-out evaluations a trainer runs after unit ``done`` of ``total``: every ``every`` units
    before the last, then one at the end."""
    return sum(1 for k in range(done + 1, total) if every and k % every == 0) + (total > done)


@dataclass
class RunClock:
    """Projects a run's time from its first measured work and says it (see the module docstring).

    ``rows_per_unit`` and ``eval_rows`` are the responses this process generates per unit of work
    (iteration, step) and per held-out evaluation; ``detail`` says how a unit is made and
    ``advice`` which options change the time; ``whole_calls``: the engine reports finished rows only."""

    say: Callable[[str], None]
    unit: str
    units_left: int
    rows_per_unit: int
    detail: str
    advice: str
    device: str
    max_new_tokens: int
    eval_rows: int = 0
    evals_left: int = 0
    whole_calls: bool = False
    also: str = ""  # what a unit does besides generating, whose cost a generation's pace cannot tell
    per_eval: float | None = None  # seconds per held-out evaluation, once measured
    starts: dict[str, tuple[float, float]] = field(default_factory=dict)  # first report of each kind of call
    said: set[str] = field(default_factory=set)

    def evaluation(self, done: float, total: int, seconds: float) -> None:
        """The held-out evaluation's ``on_progress``: its time, per evaluation and for the run's."""
        pace = self._pace("evaluation", done, total, seconds)
        if pace is None:
            return
        self.per_eval = pace * self.eval_rows
        text = (f"held-out evaluation on this {self.device} (from {seconds:.0f} s of it): ~{duration(self.per_eval)} "
                f"per evaluation of {self.eval_rows}")
        if self.evals_left:
            text += f", ~{duration(self.per_eval * self.evals_left)} for the {self.evals_left} still to come"
        self.say(f"{text}; the time per {self.unit} follows from its first training work")

    def generation(self, done: float, total: int, seconds: float) -> None:
        """A training generation's ``on_progress``: once it has run ``SETTLE`` seconds, its time
        per response, hence per unit and for the run."""
        pace = self._pace("generation", done, total, seconds, at_least=SETTLE)
        if pace is None:
            return
        source = f"{seconds:.0f} s of generation, {pace:.2f} s per response of up to {self.max_new_tokens} tokens"
        if self.also:  # e.g. an RL step's backward pass, which on CPU took 4x its sampling: no run total yet
            self.say(f"sampling on this {self.device} (from {source}): ~{duration(pace * self.rows_per_unit)} per "
                     f"{self.unit} for its {self.rows_per_unit} responses alone; {self.also} comes on top, not measured "
                     f"yet: the run's time follows its first {self.unit}")
            return
        self._tell("generation", source, pace * self.rows_per_unit)

    def trained(self, seconds: float, fraction: float, what: str) -> None:
        """The first ``what`` of training, ``fraction`` of a unit's work, took ``seconds``."""
        if "unit" not in self.said and fraction > 0:
            self.said.add("generation")  # the whole unit's time supersedes its generation's
            self._tell("unit", f"the first {what}, {seconds:.0f} s", seconds / fraction)

    def _pace(self, kind: str, done: float, total: int, seconds: float, at_least: float = 0.0) -> float | None:
        """Seconds per response of the first call of ``kind``, once it can be told (None before
        and after): the call's seconds so far over its rows done (a running row counts by its share
        of the token budget, so it is an upper bound until rows finish), told ``SETTLE`` s after its
        first report (which comes after the prompt pass) or when the call ends; with ``whole_calls``
        only when the call ends. A pace measured over less than ``at_least`` seconds is not told."""
        if kind in self.said or done <= 0:
            return None
        if done < total:  # a call still running: wait until SETTLE s after its first report
            if self.whole_calls:
                return None
            d0, t0 = self.starts.setdefault(kind, (done, seconds))
            if done <= d0 or seconds - t0 < SETTLE:
                return None
        self.said.add(kind)
        if seconds < at_least:
            return None
        # over the whole call so far, prompt pass included: it grows with the rows (with a long
        # system prompt it was most of a call), and rows that finish early count whole at once
        return seconds / done

    def _tell(self, key: str, source: str, per_unit: float) -> None:
        self.said.add(key)
        per_eval = self.per_eval if self.per_eval is not None else per_unit / max(1, self.rows_per_unit) * self.eval_rows
        total = self.units_left * per_unit + self.evals_left * per_eval
        evals = f" and {plural(self.evals_left, 'held-out evaluation')} of {self.eval_rows}" if self.evals_left else ""
        text = (f"projected on this {self.device} (from {source}): ~{duration(per_unit)} per {self.unit} "
                f"({self.detail}), ~{duration(total)} for {plural(self.units_left, self.unit)}{evals}")
        self.say(text + (f". To shorten it: {self.advice}" if total > LONG else ""))
