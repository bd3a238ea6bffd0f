"""Any single-turn env with retries: after a wrong answer the env says so and the model tries again,
up to ``attempts`` turns (a multi-turn env, ``llm_envs.multiturn``).

``Retry-v0`` wraps the env ``env`` (any registered id, built with ``env_args``): its prompts, splits,
``max_new_tokens`` and scorer. Each assistant turn is scored as that env scores a completion. A
correct turn ends the episode; otherwise the env answers ``feedback`` (default "That is not correct.
Try again.", which never reveals the answer) until the last attempt. Reward: the wrapped env's reward
of the turn that ends the episode (the correct one, or the ``attempts``-th), 0 on the others, so the
return is the wrapped reward of the last attempt and ``correct`` its strict check. An episode cut
short (a turn cut at ``max_new_tokens`` without its stop token ends it, as does the episode's token
budget) returns 0.

It turns a task the model can already do sometimes into one where the env answers back, e.g.
reasoning-gym's arithmetic with two attempts::

    llm_envs.make("Retry-v0", env="rg/basic_arithmetic-v0", attempts=2,
                  env_args={"min_terms": 2, "max_terms": 2, "max_digits": 1})
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from os import PathLike
from typing import Any

from llm_envs.multiturn import MultiTurnEnv, Reply, turn_limit
from llm_envs.registry import UnknownEnvError, make, register
from llm_envs.types import Example

FEEDBACK = "That is not correct. Try again."


class RetryEnv(MultiTurnEnv):
    """A single-turn env over several attempts, told "not correct" after each wrong one (multi-turn).

    Args:
        env: the wrapped env's id (single-turn; a multi-turn env already answers back).
        env_args: its options (``data``, ``seed``, ``opening``, ... go here or below).
        attempts: turns an episode may take (>= 1; 1 is the wrapped env as an episode of one turn;
            ``max_turns`` is the same option).
        feedback: the env's message after a wrong attempt.
        data, opening: passed to the wrapped env when given (``--data`` and ``opening=`` reach it).
        stop_strings: strings that end a turn (default: the wrapped env's if it has any, else
            ``</answer>``, where the tasks here close their answer; a string never written ends nothing).
    """

    stop_strings = ("</answer>",)

    def __init__(self, env: str = "Countdown-v0", env_args: Mapping[str, Any] | None = None,
                 attempts: int | None = None, feedback: str = FEEDBACK,
                 data: Mapping[str, str | PathLike] | None = None, opening: bool | str = True,
                 max_turns: int | None = None, stop_strings: Sequence[str] | None = None):
        attempts = turn_limit(attempts, max_turns, 2)
        if not isinstance(feedback, str) or not feedback.strip():
            raise ValueError("feedback must be a non-empty string")
        if env_args is not None and not isinstance(env_args, Mapping):
            raise ValueError(f"env_args must be a JSON object of the wrapped env's options, got {env_args!r:.60}")
        options = dict(env_args or {})
        if data is not None:
            options["data"] = data
        if opening is not True:
            options["opening"] = opening
        try:
            inner = make(env, **options)
        except UnknownEnvError as exc:
            raise ValueError(f"env: {exc}") from None
        if isinstance(inner, MultiTurnEnv):
            raise ValueError(f"Retry-v0 wraps a single-turn env; {env} is already multi-turn")
        if stop_strings is None:
            stop_strings = inner.stop_strings or None  # None: this class's
        super().__init__(max_turns=attempts, stop_strings=stop_strings)
        self.inner, self.feedback = inner, feedback
        # The wrapped env's data, budget and scoring settings are this env's.
        self.split_names, self.eval_splits = inner.split_names, inner.eval_splits
        self.max_new_tokens, self.score_workers, self.score_timeout = (inner.max_new_tokens, inner.score_workers,
                                                                         inner.score_timeout)

    def examples(self, split: str = "train") -> Sequence[Example]:
        return self.inner.examples(split)

    def prepare_scoring(self) -> None:
        self.inner.prepare_scoring()

    def good_reply(self, example: Example) -> str | None:
        return self.inner.good_reply(example)

    def begin(self, example: Example) -> dict[str, int]:
        return {"attempts": 0}

    def respond(self, text: str, state: dict[str, int], example: Example) -> Reply:
        state["attempts"] += 1
        score = self.inner.score_completion(text, example)
        if score.correct or state["attempts"] >= self.max_turns:
            return Reply(reward=score.reward, done=True, correct=score.correct,
                         parts={**score.parts, "attempts": float(state["attempts"])})
        return Reply([{"role": "user", "content": self.feedback}], parts={"attempts": float(state["attempts"])})

    def close(self) -> None:
        self.inner.close()
        super().close()


register("Retry-v0", RetryEnv)
