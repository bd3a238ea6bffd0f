"""Conciseness (paper section "Behavioral differences between ES and RL", appendix setup).

The model is rewarded for answering as briefly as the shortest correct answer, not for being
right: reward = -|len(response) - len(solution)| in characters. Train split: the paper's 2
fine-tuning prompts; test split: its 8 evaluation prompts (the paper samples 20 responses per
evaluation prompt; that is the evaluator's business). Prompts are a plain user message, no system
prompt and no answer format.

Decisions (the paper leaves them open):
- ``len(response)`` counts the response stripped of surrounding whitespace, so a trailing newline
  left by decoding costs nothing; ``strip=False`` counts raw characters as the paper's formula
  reads. Characters are Unicode code points (Python ``len``).
- ``parts``: ``normalized`` = max(0, 1 + reward / 2000), the paper's reported [0, 1] scale
  (0 <-> -2000 and below, 1 <-> 0); ``length`` = the counted length.
- ``correct`` (never part of the reward) shows whether a short answer is also right: the
  response contains an accepted answer as a whole word, case-insensitively ("84." and
  "The answer is 84" count, "184" and "84.5" do not). Accepted answers are the paper's solution plus a
  few obvious spellings (``meta["accepted"]``): any primary colour for "Name one primary color",
  number words for the numeric answers. The reward still uses the paper's solution length only.
  This is a coarse check: "No, wait, yes" contains "No".
- The paper typesets "12 \\times 7"; we send "12 × 7" (U+00D7, what LaTeX renders).
- ``max_new_tokens`` is 128: enough for a verbose answer to show (about -500 characters), short
  enough for CPU runs. The paper generated long answers (its scale bottoms out at -2000
  characters); raise it to reproduce that range.

Bring your own data: rows with string fields ``prompt`` and ``solution``, optionally
``accepted`` (a list of strings, for ``correct``) and ``id``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from os import PathLike
from typing import Any

from llm_envs.core import TaskEnv, chat
from llm_envs.data import FieldError, require
from llm_envs.registry import register
from llm_envs.types import Example, Score

#: (prompt, solution, other accepted answers), from the paper's tables.
TRAIN = [
    ("Solve: 3 + 5 =", "8", ["eight"]),
    ("If all birds can fly and penguins are birds, can penguins fly", "No", []),
]
TEST = [
    ("What is the capital of France?", "Paris", []),
    ("Calculate: 12 × 7 =", "84", ["eighty-four", "eighty four"]),
    ('Is the statement "All cats are mammals" true or false?', "True", []),
    ("What comes next in the sequence: 2, 4, 6, 8, ?", "10", ["ten"]),
    ('Translate "Hello" to Spanish:', "Hola", []),
    ("What is 15% of 200?", "30", ["thirty"]),
    ("Name one primary color:", "Red", ["Blue", "Yellow"]),
    ("How many days are in a week?", "7", ["seven"]),
]

#: Reward at which ``normalized`` reaches 0 (the paper's scale).
WORST_REWARD = -2000.0


def contains_word(text: str, word: str) -> bool:
    """``word`` occurs in ``text`` case-insensitively, not inside a longer word or number
    ("7" is not in "17", "7.5" or "1,7"; it is in "7." and "7,")."""
    pattern = rf"(?<!\w)(?<!\d[.,]){re.escape(word)}(?!\w)(?![.,]\d)"
    return re.search(pattern, text, re.IGNORECASE) is not None


class ConcisenessEnv(TaskEnv):
    """Reward short answers: -|len(response) - len(solution)|.

    Args:
        data: ``{split: path}`` of files replacing built-in splits.
        seed: unused (the prompts are fixed); kept for a uniform signature.
        strip: count the response without surrounding whitespace (default) or raw.
        opening: a string opens the assistant's turn of every example with it (none by default).
    """

    max_new_tokens = 128
    score_workers = 0  # cheap pure-Python scoring, no long C calls: timed in-process, workers only add overhead

    def __init__(self, data: Mapping[str, str | PathLike] | None = None, seed: int = 0, strip: bool = True,
                 opening: bool | str = True):
        super().__init__(data=data, seed=seed, opening=opening)
        self.strip = bool(strip)

    def build_split(self, split: str) -> list[Example]:
        table = TRAIN if split == "train" else TEST
        return [self._example(f"conciseness-{split}-{i}", prompt, solution, [solution, *others])
                for i, (prompt, solution, others) in enumerate(table)]

    def parse_row(self, row: Mapping[str, Any], index: int) -> Example:
        prompt = require(row, "prompt")
        solution = require(row, "solution")
        if not prompt.strip():
            raise FieldError("prompt", "is empty")
        accepted = row.get("accepted", [])
        if not isinstance(accepted, list) or not all(isinstance(a, str) and a.strip() for a in accepted):
            raise FieldError("accepted", f"expected a list of non-empty strings; got {accepted!r:.60}")
        return self._example(str(row.get("id", index)), prompt, solution, [solution, *accepted])

    @staticmethod
    def _example(id_: str, prompt: str, solution: str, accepted: list[str]) -> Example:
        # An empty solution is allowed (reward for saying nothing) but cannot be "contained".
        accepted = list(dict.fromkeys(a for a in accepted if a.strip()))
        return Example(id=id_, prompt=chat(prompt), answer=solution, meta={"accepted": accepted})

    def score_completion(self, completion: str, example: Example) -> Score:
        response = completion.strip() if self.strip else completion
        reward = -float(abs(len(response) - len(example.answer)))
        correct = any(contains_word(response, a) for a in example.meta["accepted"])
        parts = {"normalized": max(0.0, 1.0 + reward / -WORST_REWARD), "length": float(len(response))}
        return Score(reward, correct, parts)


register("Conciseness-v0", ConcisenessEnv)
