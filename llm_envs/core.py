"""The one base class every task environment subclasses.

An episode is a single turn: ``reset`` picks a problem and returns its prompt, ``step`` takes
the model's completion and returns the verifiable reward. Trainers skip the episode protocol and
use the batch API instead: ``examples(split)`` for the prompts and ``score``/``score_batch`` for
the rewards.

Every call that scores model text (``step``, ``score``, ``score_batch``) returns within
``score_timeout`` seconds (10 by default): a cheap pure-Python scorer (``score_workers = 0``) runs
in this process under an interval timer, any other in a worker process that is killed at the
deadline (``llm_envs.scoring``). A completion not scored in time gets reward 0 and
``error="timeout"``. Scoring many completions in worker processes is a separate object,
``llm_envs.scoring.BatchScorer``, that trainers and the eval harness hold (``score_batch`` here is
a convenience over one).

A new environment implements three hooks:

- ``build_split(split)``: the built-in examples of a split (generated or read from packaged data);
- ``parse_row(row)``: one row of a user's data file -> ``Example`` (raise ``FieldError`` on bad data);
- ``score_completion(completion, example)``: the reward of one completion;

and may implement ``prepare_scoring()`` (slow imports a worker does before its first item).

**Assistant-turn openings.** A prompt may end with an assistant message, the opening of the
assistant's turn (the paper's Countdown and Sudoku prompts begin it with "Let me solve this step
by step.\n<think>"): generation continues it, and scoring sees the whole assistant turn, the
opening followed by the completion (``scoring.checked_score`` joins them, the one place every
scoring path goes through). An env declares one for all its examples with the class attribute
``opening``, an example its own with ``chat(..., opening=...)``; ``opening=False`` at construction
removes every opening, a string replaces them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from os import PathLike
from typing import Any, ClassVar

import gymnasium as gym
from gymnasium import spaces

from llm_envs.data import DataError, FieldError, load_rows
from llm_envs.scoring import BatchScorer, resolve_workers
from llm_envs.types import Example, Message, Score


class AnyText(spaces.Text):
    """A Text space that contains any string up to ``max_length`` (prompts and completions are
    free text, not drawn from a small charset); sampling still uses the alphanumeric charset."""

    def contains(self, x: Any) -> bool:
        return isinstance(x, str) and self.min_length <= len(x) <= self.max_length

    def __repr__(self) -> str:
        return f"AnyText({self.max_length})"


def chat(user: str, system: str | None = None, opening: str = "") -> list[Message]:
    """Chat messages for a prompt: an optional system message, the user's, and an optional
    ``opening`` of the assistant's turn (a final assistant message that generation continues)."""
    messages = [{"role": "system", "content": system}] if system else []
    return with_opening(messages + [{"role": "user", "content": user}], opening)


def with_opening(messages: Sequence[Message], opening: str) -> list[Message]:
    """``messages`` without a final assistant message, then ``opening`` as one (none when empty)."""
    messages = list(messages)
    if messages and messages[-1].get("role") == "assistant":
        messages.pop()
    return messages + ([{"role": "assistant", "content": opening}] if opening else [])


class TaskEnv(gym.Env[str, str]):
    """A single-turn environment with a verifiable outcome reward.

    Scoring is bounded in time: ``step``, ``score`` and ``score_batch`` give each completion at
    most ``score_timeout`` seconds, in this process under a timer when ``score_workers == 0`` (the
    scorer is cheap pure Python and this is the main thread), else in a worker process killed at
    the deadline; a completion not scored in time gets reward 0 and ``error="timeout"``. Workers
    of a main script are forked from it (``scoring.start_method``), so a script needs no
    ``if __name__ == "__main__":`` guard; a worker that cannot start fails at once, naming why.

    Args:
        data: ``{split: path}`` of JSON/JSONL files that replace built-in splits.
        seed: seed of everything the environment generates (puzzles, split assignment).
        opening: ``True``: the openings the env declares (``opening``, or an example's own);
            ``False``: none (the assistant's turn starts empty); a string: that opening for every
            example.
    """

    metadata: ClassVar[dict[str, Any]] = {"render_modes": []}
    #: Split names ``examples`` accepts; ``data=`` may add others.
    split_names: ClassVar[tuple[str, ...]] = ("train", "test")
    #: Splits the eval harness measures by default (and tables list in this order).
    eval_splits: ClassVar[tuple[str, ...]] = ("test",)
    #: Generation budget a trainer uses unless told otherwise.
    max_new_tokens: ClassVar[int] = 512
    #: Default worker processes of a ``BatchScorer`` (and ``score_batch``): ``None`` = one per core
    #: (up to 8); ``0`` = this scorer is cheap pure Python (no long C calls): score in this
    #: process under a timer, no process start-up or messaging.
    score_workers: ClassVar[int | None] = None
    #: Seconds a completion's scoring may take (an instance may set its own).
    score_timeout: float = 10.0
    #: Longest prompt or completion the spaces admit.
    max_text_length: ClassVar[int] = 200_000
    #: How the assistant's turn begins in every example that does not bring its own opening
    #: (generation continues it; the scorer sees it followed by the completion). "" = none.
    opening: ClassVar[str] = ""
    #: Strings that end a turn: generation stops at the first one the model writes, and the turn
    #: is its text up to and including it (``</answer>``, ``</tool_call>``). () = only the model's
    #: end-of-turn token (or the token budget) ends it.
    stop_strings: tuple[str, ...] = ()

    def __init__(self, data: Mapping[str, str | PathLike] | None = None, seed: int = 0, opening: bool | str = True):
        if data is not None and not isinstance(data, Mapping):
            raise TypeError(
                f"data must map split names to file paths, e.g. {{'train': 'a.jsonl'}}; got {data!r}"
            )
        if not isinstance(opening, (bool, str)):
            raise TypeError(f"opening must be True (the env's), False (none) or a string; got {opening!r}")
        self.data = {str(k): v for k, v in (data or {}).items()}
        self.seed = int(seed)
        self.opening_option = opening
        self.observation_space = AnyText(self.max_text_length, min_length=0)
        self.action_space = AnyText(self.max_text_length, min_length=0)
        self._splits: dict[str, list[Example]] = {}
        self._current: Example | None = None
        self._scorers: dict[int, BatchScorer] = {}  # score's and score_batch's, by workers, until close()

    # ----- hooks for subclasses -------------------------------------------------------------
    def build_split(self, split: str) -> list[Example]:
        """The built-in examples of ``split``."""
        raise DataError(f"{type(self).__name__} has no built-in {split!r} split; pass data={{{split!r}: path}}")

    def parse_row(self, row: Mapping[str, Any], index: int) -> Example:
        """Turn one row of a user's data file into an ``Example``; raise ``FieldError`` on bad data."""
        raise NotImplementedError

    def score_completion(self, completion: str, example: Example) -> Score:
        """Score one completion: the whole assistant turn, i.e. ``example.opening`` followed by the
        model's text (never the user's prompt)."""
        raise NotImplementedError

    def prepare_scoring(self) -> None:
        """Import or build what scoring needs; each worker process calls it once before its
        first item, so slow imports (sympy) do not count against an item's time."""

    def good_reply(self, example: Example) -> str | None:
        """A turn that solves ``example`` (the text after its opening), which ``python -m
        llm_envs.check`` steps to show the env rewarding it; ``None`` (the default): not known."""
        return None

    # ----- batch API for trainers -----------------------------------------------------------
    def examples(self, split: str = "train") -> Sequence[Example]:
        """All examples of ``split``, in a fixed order (built once, then cached)."""
        if split not in self._splits:
            if split in self.data:
                examples = self._load_file(self.data[split])
            elif split in self.split_names:
                examples = self.build_split(split)
            else:
                known = sorted(set(self.split_names) | set(self.data))
                raise KeyError(f"unknown split {split!r} for {type(self).__name__}; known: {known}")
            self._splits[split] = [self._open(e) for e in examples]
        return self._splits[split]

    def score(self, completion: str, example: Example) -> Score:
        """Score one completion within ``score_timeout`` seconds; never raises: a failure is
        reward 0 with ``error`` set (``"timeout"`` when out of time)."""
        return self._scorer(0 if self.score_workers == 0 else 1).score(completion, example)

    def score_batch(
        self,
        completions: Sequence[str],
        examples: Sequence[Example],
        workers: int | None = None,
        timeout: float | None = None,
    ) -> list[Score]:
        """Score many completions, each within ``timeout`` seconds (default ``score_timeout``):
        a convenience over a ``BatchScorer`` that this env keeps until ``close``.

        ``workers``: processes; ``None`` takes the env's ``score_workers``, ``0`` scores in this
        process (pure-Python scorers only; others get one process). A completion whose scoring
        times out gets reward 0 and ``error='timeout'``.
        """
        return self._scorer(workers).score_batch(completions, examples, timeout)

    # ----- Gymnasium episode API -------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        """Start an episode on one example: ``options={"split": "test", "index": 3}`` picks it;
        without an index, one is drawn from the env's RNG (seeded by ``seed``)."""
        super().reset(seed=seed)
        options = dict(options or {})
        split = options.pop("split", "train")
        index = options.pop("index", None)
        if options:
            raise ValueError(f"unknown reset options {sorted(options)}; known: split, index")
        examples = self.examples(split)
        if not examples:
            raise DataError(f"split {split!r} of {type(self).__name__} is empty")
        if index is None:
            index = int(self.np_random.integers(len(examples)))
        elif not 0 <= int(index) < len(examples):
            raise IndexError(f"index {index} out of range for split {split!r} ({len(examples)} examples)")
        self._current = examples[int(index)]
        info = {"example_id": self._current.id, "split": split, "index": int(index),
                "messages": self._current.prompt}
        return render_prompt(self._current.prompt), info

    def step(self, action: str):
        """Score the completion ``action`` (the text that continues the observation, whose end is
        the example's opening when it has one); the episode ends at once."""
        if self._current is None:
            raise RuntimeError("call reset() before step()")
        score = self.score(action, self._current)
        info = {"example_id": self._current.id, "correct": score.correct, "parts": score.parts,
                "error": score.error}
        return "", float(score.reward), True, False, info

    def close(self) -> None:
        """Stop the worker processes of ``score`` and ``score_batch`` (they restart when needed)."""
        scorers, self._scorers = self._scorers, {}
        for scorer in scorers.values():
            scorer.close()

    # ----- internals --------------------------------------------------------------------------
    def _open(self, example: Example) -> Example:
        """``example`` with the opening this env gives it (``opening_option``, see the class)."""
        option = self.opening_option
        wanted = option if isinstance(option, str) else (example.opening or self.opening) if option else ""
        prompt = with_opening(example.prompt, wanted)
        return example if prompt == example.prompt else replace(example, prompt=prompt)

    def _scorer(self, workers: int | None) -> BatchScorer:
        workers = resolve_workers(self, workers)
        if workers not in self._scorers:
            self._scorers[workers] = BatchScorer(self, workers)
        return self._scorers[workers]

    def _load_file(self, path: str | PathLike) -> list[Example]:
        examples = []
        for index, row in enumerate(load_rows(path)):
            try:
                examples.append(self.parse_row(row, index))
            except FieldError as exc:
                raise DataError(f"{path}: row {index}: field {exc.field!r}: {exc}") from None
        return examples


def render_prompt(messages: Sequence[Message]) -> str:
    """A chat prompt as plain text (the episode API's observation)."""
    return "\n\n".join(m["content"] for m in messages)
