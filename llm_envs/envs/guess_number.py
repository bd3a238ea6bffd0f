"""Guess the number: the simplest multi-turn environment (``llm_envs.multiturn``).

The env thinks of an integer in ``1..high``; the model guesses with ``<guess>N</guess>``, and the
env answers "Higher." or "Lower." until the guess is right or ``max_turns`` guesses are used.

A turn ends at ``</guess>`` (``stop_strings``), so a guess is a turn.

Reward: 1.0 on the turn that guesses right (``correct``), 0 on every other turn, so the episode's
return is 1 when solved within the turns, else 0. A turn without a readable guess gets a reminder
of the format and costs a turn. ``parts``: ``solved`` and ``guesses`` (turns used).

Built-in data: ``train_size`` / ``test_size`` secrets drawn from ``seed`` (the two splits drawn
from separate streams). Own data (``data={"test": path}``): rows with ``secret`` (an int in
``1..high``) and an optional ``id``.
"""

from __future__ import annotations

import random
import re
from collections.abc import Mapping, Sequence
from os import PathLike
from typing import Any

from llm_envs.core import chat
from llm_envs.data import FieldError, require
from llm_envs.multiturn import MultiTurnEnv, Reply
from llm_envs.parsing import last_tag
from llm_envs.registry import register
from llm_envs.types import Example

PROMPT = ("I am thinking of an integer between 1 and {high}. Guess it: answer with your guess in <guess></guess> "
          "tags, e.g. <guess>{example}</guess>. After each wrong guess I will say Higher or Lower. You have "
          "{turns} guesses.")
_INT = re.compile(r"[+-]?\d{1,12}")


class GuessNumberEnv(MultiTurnEnv):
    """Guess an integer in ``1..high`` with higher/lower feedback, in at most ``max_turns`` guesses (multi-turn)."""

    max_new_tokens = 64
    score_workers = 0  # pure-Python, cheap
    max_turns = 7
    stop_strings = ("</guess>",)

    def __init__(self, data: Mapping[str, str | PathLike] | None = None, seed: int = 0, high: int = 100,
                 max_turns: int = 7, train_size: int = 500, test_size: int = 100, opening: bool | str = True,
                 stop_strings: Sequence[str] | None = None):
        super().__init__(data=data, seed=seed, opening=opening, max_turns=max_turns, stop_strings=stop_strings)
        if high < 2:
            raise ValueError(f"high must be >= 2, got {high}")
        if train_size < 0 or test_size < 0:
            raise ValueError("split sizes must be >= 0")
        self.high = int(high)
        self.sizes = {"train": int(train_size), "test": int(test_size)}

    def make_example(self, example_id: str, secret: int) -> Example:
        prompt = chat(PROMPT.format(high=self.high, example=(self.high + 1) // 2, turns=self.max_turns))
        return self._open(Example(example_id, prompt, secret, {"secret": secret}))

    def build_split(self, split: str) -> list[Example]:
        if split not in self.sizes:
            return super().build_split(split)
        rng = random.Random(f"guess-number:{self.seed}:{split}")
        return [self.make_example(f"guess-{split}-{i}", rng.randint(1, self.high)) for i in range(self.sizes[split])]

    def parse_row(self, row: Mapping[str, Any], index: int) -> Example:
        secret = require(row, "secret", int)
        if isinstance(secret, bool) or not 1 <= secret <= self.high:
            raise FieldError("secret", f"expected an int in 1..{self.high}, got {secret!r:.40}")
        return self.make_example(str(row.get("id", index)), secret)

    def good_reply(self, example: Example) -> str:
        return f"<guess>{example.answer}</guess>"

    def begin(self, example: Example) -> dict[str, int]:
        return {"guesses": 0}

    def respond(self, text: str, state: dict[str, int], example: Example) -> Reply:
        state["guesses"] += 1
        block = last_tag(text, "guess")
        guess = int(block) if block is not None and _INT.fullmatch(block) else None
        if guess == example.answer:
            return Reply(reward=1.0, done=True, correct=True, parts={"solved": 1.0, "guesses": state["guesses"]})
        if guess is None:
            reply = "I could not read a guess: write it as <guess>N</guess>."
        else:
            reply = "Higher." if guess < example.answer else "Lower."
        return Reply([{"role": "user", "content": reply}], parts={"solved": 0.0, "guesses": state["guesses"]})


register("GuessNumber-v0", GuessNumberEnv)
