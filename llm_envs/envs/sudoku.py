"""4x4 Mini Sudoku (paper appendix "Experiment with Mini Sudoku Task").

Puzzles come from reasoning-gym's ``mini_sudoku`` generator, as in the paper: 1000 unique puzzles,
800 train / 200 test, each with exactly one solution (the generator keeps a clue rather than allow
a second). The model shows its work in ``<think>`` and gives the filled grid in the LAST
``<answer>`` block, one row per line, numbers separated by spaces. As in the paper, the
assistant's turn opens with "Let me solve this step by step.\\n<think>", which the model
continues (``opening=False`` turns it off); the scorer sees the whole turn.

Reward, chosen with ``reward=``:

- ``"partial"`` (default), the paper's: it trained with reasoning-gym's ``mini_sudoku`` score,
  which pays partial credit for correct cells. The score of the last answer block (stripped, as
  reasoning-gym's ``extract_answer`` gives it) is ``cells * layout * length``:
  ``cells`` = fraction of the 16 cells equal to the solution's, reading the block's first four
  lines that hold exactly four digits 1-9 (any other character ignored, other lines skipped);
  ``layout`` = 1.0 when the block is the grid exactly as the prompt lays it out (trailing spaces
  aside), else 0.9; ``length`` = 31 / len(block) when the block is longer than that grid's 31
  characters, else 1.0. So a solution in the prompt's layout earns 1.0, in another layout 0.9
  (less if longer), and no answer block 0. ``partial_credit`` computes it (tests check it equals
  reasoning-gym's own ``score_answer``). reasoning-gym compares with the stored solution; a
  user's puzzle with several solutions is scored against the model's grid when that grid is a
  valid solution, so every valid solution earns what the stored one would (for the built-in
  puzzles, with one solution each, this is reasoning-gym's score unchanged).
- ``"binary"``: 1.0 when ``correct``, else 0.0.

``correct`` (pass@1), whatever the reward, is our own strict check: the last answer block parses
as a 4x4 grid (see below) that keeps every given of the puzzle and holds 1-4 exactly once in
every row, column and 2x2 box.

``parts``: the partial reward's factors ``cells``, ``layout`` and ``length`` (their product is
that reward, whichever reward is chosen), and the strict check's ``answer`` (= correct),
``format`` (1 when the block parsed as a 4x4 grid of digits), ``givens`` (1 when that grid keeps
all givens) and ``units`` (fraction of the 12 rows, columns and boxes that hold 1-4 exactly once).

Answer parsing for ``correct`` (lenient on layout, strict on content): inside the last answer
block, blank lines and ruler lines made only of ``- + = | ` `` and spaces are skipped; every other
line is one row, and must be exactly four digits once spaces, tabs, commas, ``|`` and square
brackets are removed (so ``2 1 4 3``, ``2,1,4,3``, ``[2, 1, 4, 3]`` and ``2143`` all read as the
same row). Exactly four rows are required; any other text inside the block (``Row 1: ...``,
``_``) fails the format.

Bring your own data (``data={"test": "puzzles.jsonl"}``): rows with ``puzzle`` and ``solution``,
each a 16-cell string (whitespace, commas and ``|`` ignored, e.g. ``"1 _ 3 4\\n..."``), a list of
4 row strings (``"1 _ 3 4"`` or ``"1_34"``), a list of 4 lists of 4 cells (ints or 1-char strings)
or a flat list of 16 cells. Blanks are ``_``, ``.`` or ``0``. The solution must have
none, be a valid grid and keep the puzzle's givens. An optional ``id`` is kept.
"""

from __future__ import annotations

import random
import re
from collections.abc import Mapping, Sequence
from os import PathLike
from typing import Any

from llm_envs.core import Example, Score, TaskEnv, chat
from llm_envs.data import FieldError, require
from llm_envs.parsing import last_tag
from llm_envs.registry import register

Grid = list[list[int]]  # 4 rows of 4 cells; 0 = blank

#: Training rewards (``reward=``): reasoning-gym's partial credit (the paper's), or 1/0 for correct.
REWARDS = ("partial", "binary")

# The paper's prompt (appendix, Figure 11). Its opening sentence is a standing instruction, not
# part of the task, so it goes in the system message. The paper pre-fills the assistant's turn
# with "Let me solve this step by step.\n<think>" (OPENING, written as its Countdown data writes
# it); the model continues it, and the reward reads only the last <answer> block of the turn.
SYSTEM_PROMPT = (
    "You are a helpful assistant. You first think about the reasoning process in your mind "
    "and then provide the user with the answer."
)
RULES = (
    "In 4x4 Mini Sudoku:\n"
    "- Each row must contain each number from 1-4 exactly once\n"
    "- Each column must contain each number 1-4 exactly once\n"
    "- Each 2x2 subgrid must contain each number 1-4 exactly once\n\n"
    "Solve this 4x4 Mini Sudoku puzzle:\n\n"
)
# The paper's format example, verbatim. Its second column reads 1 3 1 2, so it is not a valid
# grid and copying it never solves a puzzle.
INSTRUCTIONS = (
    "Show your work in <think> </think> tags. And return the final answer in <answer> </answer> "
    "tags, with spaces separating each number within a row, and newlines separating rows. "
    "For example <answer>\n2 1 4 3\n4 3 2 1\n3 1 4 2\n1 2 3 4\n</answer>."
)

#: How the paper's prompt opens the assistant's turn (``opening=False`` turns it off).
OPENING = "Let me solve this step by step.\n<think>"

_BLANKS = "_.0"
_SEPARATORS = re.compile(r"[\s,|\[\]]+")  # removed inside a row (answers and data files)
_RULER = re.compile(r"[-+=|`\s]*")  # a line of only these is decoration, not a row
_UNITS = (
    [[(r, c) for c in range(4)] for r in range(4)]
    + [[(r, c) for r in range(4)] for c in range(4)]
    + [[(r, c) for r in (br, br + 1) for c in (bc, bc + 1)] for br in (0, 2) for bc in (0, 2)]
)


def format_grid(grid: Sequence[Sequence[int]]) -> str:
    """A grid as the prompt shows it: rows on lines, cells separated by spaces, ``_`` for blanks."""
    return "\n".join(" ".join(str(x) if x else "_" for x in row) for row in grid)


def parse_answer(text: str) -> Grid | None:
    """The 4x4 grid of digits (0-9) in an answer block, or ``None`` if it is not one."""
    rows = []
    for line in text.splitlines():
        if _RULER.fullmatch(line):
            continue
        cells = _SEPARATORS.sub("", line)
        if len(cells) != 4 or not cells.isascii() or not cells.isdigit():
            return None
        rows.append([int(ch) for ch in cells])
    return rows if len(rows) == 4 else None


def unit_ok(grid: Grid, unit: list[tuple[int, int]]) -> bool:
    """The cells of ``unit`` (a row, column or box) hold 1-4 exactly once."""
    return sorted(grid[r][c] for r, c in unit) == [1, 2, 3, 4]


def keeps_givens(grid: Grid, puzzle: Grid) -> bool:
    """Every non-blank cell of ``puzzle`` has the same value in ``grid``."""
    return all(p == 0 or p == g for prow, grow in zip(puzzle, grid) for p, g in zip(prow, grow))


def is_solution(grid: Grid, puzzle: Grid) -> bool:
    """True iff ``grid`` keeps every given of ``puzzle`` and is a valid 4x4 sudoku."""
    return keeps_givens(grid, puzzle) and all(unit_ok(grid, unit) for unit in _UNITS)


def grid_from_value(value: Any, field: str) -> Grid:
    """A data file's grid (see the module docstring for the forms) -> 4 lists of 4 ints, 0 = blank."""

    def cell(x: Any) -> int:
        if isinstance(x, int) and not isinstance(x, bool) and 0 <= x <= 4:
            return x
        if isinstance(x, str) and len(x) == 1 and x in "1234" + _BLANKS:
            return 0 if x in _BLANKS else int(x)
        raise FieldError(field, f"cells must be 1-4, or _ . 0 for a blank; got {x!r:.20}")

    def cells_of(text: str) -> list[str]:
        return list(_SEPARATORS.sub("", text))

    if isinstance(value, str):
        flat = cells_of(value)
        if len(flat) != 16:
            raise FieldError(field, f"expected 16 cells, got {len(flat)} in {value!r:.60}")
        rows = [flat[i : i + 4] for i in range(0, 16, 4)]
    elif isinstance(value, list) and len(value) == 16:
        rows = [value[i : i + 4] for i in range(0, 16, 4)]
    elif isinstance(value, list) and len(value) == 4:
        rows = [cells_of(row) if isinstance(row, str) else row for row in value]
        for row in rows:
            if not isinstance(row, list) or len(row) != 4:
                raise FieldError(field, f"each of the 4 rows must hold 4 cells; got {row!r:.60}")
    else:
        raise FieldError(field, f"expected a 16-cell string or a list of 4 rows; got {value!r:.60}")
    return [[cell(x) for x in row] for row in rows]


def partial_credit(answer: str, solution: Grid) -> dict[str, float]:
    """reasoning-gym's ``mini_sudoku`` score of an answer block against ``solution``, as its factors.

    ``cells * layout * length`` equals reasoning-gym's ``score_answer(answer, entry)`` with that
    solution as the entry (the module docstring explains the three factors); an empty answer
    scores 0.
    """
    oracle = format_grid(solution)
    lines = answer.split("\n")
    if "\n".join(line.rstrip() for line in lines) == oracle:
        cells, layout = 1.0, 1.0
    else:
        rows = [[int(c) for c in line if c in "123456789"] for line in lines]
        rows = [row for row in rows if len(row) == 4][:4]
        right = sum(a == b for row, want in zip(rows, solution) for a, b in zip(want, row))
        cells, layout = right / 16, 0.9
    length = len(oracle) / len(answer) if len(answer) > len(oracle) else 1.0
    return {"cells": cells, "layout": layout, "length": length}


class SudokuEnv(TaskEnv):
    """4x4 Mini Sudoku: the paper's partial-credit reward, a constraint-checking ``correct``.

    Args:
        data: ``{split: path}`` of files replacing built-in splits (see the module docstring).
        seed: seed of puzzle generation; each seed gives its own 1000 puzzles.
        train_size, test_size: sizes of the built-in splits (unique, disjoint puzzles; the test
            puzzles are drawn first, so they do not change with train_size).
        min_empty, max_empty: blanks per puzzle, passed to reasoning-gym's generator (its
            defaults; it keeps a clue rather than allow a second solution).
        reward: ``"partial"`` (reasoning-gym's partial credit, the paper's training reward) or
            ``"binary"`` (1.0 when correct, else 0.0).
        opening: ``True``: the paper's opening of the assistant's turn (``OPENING``); ``False``:
            none; a string: that opening instead.
    """

    max_new_tokens = 512
    score_workers = 0  # pure-Python scoring that cannot hang: workers only add overhead
    opening = OPENING

    def __init__(
        self,
        data: Mapping[str, str | PathLike] | None = None,
        seed: int = 0,
        train_size: int = 800,
        test_size: int = 200,
        min_empty: int = 8,
        max_empty: int = 12,
        reward: str = "partial",
        opening: bool | str = True,
    ):
        super().__init__(data=data, seed=seed, opening=opening)
        if train_size < 0 or test_size < 0:
            raise ValueError(f"split sizes must be >= 0; got {train_size}, {test_size}")
        if reward not in REWARDS:
            raise ValueError(f"reward must be one of {REWARDS}, got {reward!r}")
        self.reward = reward
        self.train_size, self.test_size = int(train_size), int(test_size)
        self.min_empty, self.max_empty = int(min_empty), int(max_empty)
        self._generated: list[tuple[Grid, Grid]] | None = None

    # ----- built-in data ------------------------------------------------------------------------
    def build_split(self, split: str) -> list[Example]:
        # Test puzzles come first, so changing train_size leaves the test set as it is.
        pairs = self._generate()
        chosen = pairs[: self.test_size] if split == "test" else pairs[self.test_size :]
        return [self._example(f"sudoku-{split}-{i}", p, s) for i, (p, s) in enumerate(chosen)]

    def _generate(self) -> list[tuple[Grid, Grid]]:
        """``test_size + train_size`` (puzzle, solution) pairs with distinct puzzles."""
        if self._generated is not None:
            return self._generated
        # Imported here: reasoning-gym takes ~1 s to import and scoring workers never need it.
        from reasoning_gym.games.mini_sudoku import MiniSudokuConfig, MiniSudokuDataset

        # reasoning-gym seeds item i with base + i, so bases seed and seed + 1 would share all
        # but one puzzle; a hashed base keeps the puzzle sets of different seeds apart.
        base = random.Random(f"Sudoku-v0/{self.seed}").getrandbits(48)
        config = MiniSudokuConfig(min_empty=self.min_empty, max_empty=self.max_empty, seed=base, size=2**62)
        dataset = MiniSudokuDataset(config)
        want = self.test_size + self.train_size
        pairs: list[tuple[Grid, Grid]] = []
        seen: set[str] = set()
        index = 0
        while len(pairs) < want:
            if index > 50 * want + 1000:  # a narrow min/max_empty range has few distinct puzzles
                raise RuntimeError(f"found only {len(pairs)} unique puzzles of {want} wanted")
            meta = dataset[index]["metadata"]
            index += 1
            key = format_grid(meta["puzzle"])
            if key not in seen:
                seen.add(key)
                pairs.append((meta["puzzle"], meta["solution"]))
        self._generated = pairs
        return pairs

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state["_generated"] = None  # scoring workers need no puzzles
        return state

    def _example(self, id_: str, puzzle: Grid, solution: Grid) -> Example:
        prompt = chat(RULES + format_grid(puzzle) + "\n\n" + INSTRUCTIONS, system=SYSTEM_PROMPT)
        meta = {"puzzle": [list(r) for r in puzzle], "solution": [list(r) for r in solution],
                "num_empty": sum(x == 0 for row in puzzle for x in row)}
        return Example(id=id_, prompt=prompt, answer=format_grid(solution), meta=meta)

    # ----- users' data ------------------------------------------------------------------------
    def parse_row(self, row: Mapping[str, Any], index: int) -> Example:
        puzzle = grid_from_value(require(row, "puzzle", (str, list)), "puzzle")
        solution = grid_from_value(require(row, "solution", (str, list)), "solution")
        if any(0 in r for r in solution):
            raise FieldError("solution", "has blank cells")
        if not keeps_givens(solution, puzzle):
            raise FieldError("solution", "contradicts a given of the puzzle")
        if not is_solution(solution, puzzle):
            raise FieldError("solution", "is not a valid sudoku: a row, column or box repeats a number")
        return self._example(str(row.get("id", index)), puzzle, solution)

    # ----- scoring ----------------------------------------------------------------------------
    def good_reply(self, example: Example) -> str | None:
        """The stored solution in an answer block, after a closed think."""
        return f"</think>\n<answer>\n{format_grid(example.meta['solution'])}\n</answer>"

    def score_completion(self, completion: str, example: Example) -> Score:
        block = last_tag(completion, "answer")  # what reasoning-gym's extract_answer returns
        grid = parse_answer(block) if block is not None else None
        puzzle = example.meta["puzzle"]
        correct = grid is not None and is_solution(grid, puzzle)
        # A valid grid other than the stored solution (a user's puzzle with several) is its own target.
        parts = partial_credit(block or "", grid if correct else example.meta["solution"])
        partial = parts["cells"] * parts["layout"] * parts["length"]
        parts |= {
            "answer": float(correct),
            "format": float(grid is not None),
            "givens": float(grid is not None and keeps_givens(grid, puzzle)),
            "units": sum(unit_ok(grid, unit) for unit in _UNITS) / len(_UNITS) if grid is not None else 0.0,
        }
        return Score(float(correct) if self.reward == "binary" else partial, correct, parts)


register("Sudoku-v0", SudokuEnv)
