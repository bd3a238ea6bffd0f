"""How long a run will take, said before it is long: a trainer measures its first work on this
device and extrapolates to the whole run, with no table of device speeds.

``RunClock`` speaks twice at most: once the first generation has run for ``SETTLE`` seconds past
its first decode step (or ended), from the time per response (usually the held-out evaluation at
iteration 0; until a batch ends every row counts at the full token budget, so this is an upper
bound), and once the first unit of training work is done (an ES member or iteration, an RL step),
from its own time. When the
projected run exceeds ``LONG``, it names the options that shorten it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

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
    ``advice`` which options change the time."""

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
    per_row: float | None = None  # seconds per response, once measured
    start: tuple[float, float] | None = None  # (done, seconds) of the first generation's first report
    said: set[str] = field(default_factory=set)

    def generation(self, done: float, total: int, seconds: float) -> None:
        """``generate``'s ``on_progress``: the first generation long enough to measure gives the
        time per response, hence per unit and for the run. Its first report comes after the first
        batch's prompt pass, whose cost does not grow with the tokens generated: the pace is
        measured from there (or over the whole call, when that report was its last)."""
        if "generation" in self.said or done <= 0:
            return
        if self.start is None:
            self.start = (done, seconds)
        d0, t0 = self.start
        if done < total and (done <= d0 or seconds - t0 < SETTLE):
            return
        if done <= d0:  # the call ended at its first report
            d0, t0 = 0.0, 0.0
        self.per_row = (seconds - t0) / (done - d0)
        self._tell("generation", f"{seconds:.0f} s of generation, {self.per_row:.2f} s per response of up to "
                                 f"{self.max_new_tokens} tokens", self.per_row * self.rows_per_unit)

    def trained(self, seconds: float, fraction: float, what: str) -> None:
        """The first ``what`` of training, ``fraction`` of a unit's work, took ``seconds``."""
        if "unit" not in self.said and fraction > 0:
            self._tell("unit", f"the first {what}, {seconds:.0f} s", seconds / fraction)

    def _tell(self, key: str, source: str, per_unit: float) -> None:
        self.said.add(key)
        per_row = self.per_row if self.per_row is not None else per_unit / max(1, self.rows_per_unit)
        total = self.units_left * per_unit + self.evals_left * self.eval_rows * per_row
        evals = f" and {plural(self.evals_left, 'held-out evaluation')} of {self.eval_rows}" if self.evals_left else ""
        text = (f"projected on this {self.device} (from {source}): ~{duration(per_unit)} per {self.unit} "
                f"({self.detail}), ~{duration(total)} for {plural(self.units_left, self.unit)}{evals}")
        self.say(text + (f". To shorten it: {self.advice}" if total > LONG else ""))
