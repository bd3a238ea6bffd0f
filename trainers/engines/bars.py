"""Progress bars that suit where the output goes: live tqdm bars in a terminal, plain lines in a
log file.

In a terminal (stderr is a TTY) every long phase has a tqdm bar redrawn in place, nested bars
included. Written to a file (a cluster job's log, ``2> run.log``), redrawn bars would leave
carriage returns, escape codes and a line per decode step (tens of MB over a long run), so there
a bar writes plain lines instead: a run-level bar (ES iterations, RL steps, the study's runs) one
per update, every other bar at most one every ``LINE_EVERY`` seconds across all bars, and no
bar is drawn inside another. ``LLM_ENVS_PROGRESS=bars|lines`` overrides the choice.

``RowProgress`` counts the rows of one generation call for a bar and for ``on_progress``.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterable

import torch
from tqdm import tqdm

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
