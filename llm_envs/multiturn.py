"""Environments that answer back: episodes of several turns, optionally with tools.

A ``MultiTurnEnv`` is a ``TaskEnv`` whose episode does not end at the first completion. Gymnasium's
protocol, on chat messages:

- ``reset(options=...)`` -> ``(messages, info)``: the first prompt (the example's chat messages);
- ``step(assistant_text)`` -> ``(messages, reward, terminated, truncated, info)``: the env's reply
  (``user`` or ``tool`` messages; on the last turn whatever the env said, often nothing), this
  turn's reward, whether the env ended the episode and whether a limit did (``max_turns``).

The episode's **return** is the sum of its turns' rewards: a final verifiable reward on the last
turn, plus optional per-turn rewards. ES trains on returns; the RL trainers on returns with the
loss over the assistant's tokens only (``trainers.rl.masking``); ``correct`` of the last turn is
the episode's pass/fail (pass@k).

A subclass writes the ``TaskEnv`` hooks that build examples (``build_split``, ``parse_row``) and:

- ``begin(example)``: the episode's initial state (any picklable value; default ``None``);
- ``respond(text, state, example)``: the env's ``Reply`` to one assistant turn (``text`` is the
  whole turn, an example's opening included); it may update ``state`` in place;
- ``tools()``: the tools it offers (``llm_envs.tools``); a turn that calls one is answered by the
  tools' ``tool`` messages (reward 0) and ``respond`` is not called for it. A tool's function may
  take ``state`` and ``example``: the episode's, filled by the env, never shown to the model.

**Replies.** A ``Reply`` that does not end the episode (``done=False``) must answer the model with
at least one message; one without is an env bug, and the turn fails with that error (the episode
ends, reward 0, ``error`` set), the same in ``step`` and in the batched runner. An env's reply on
the turn that ends the episode (``done=True``, or the last turn a limit allows) is returned by
``step`` and kept in the runner's conversation record, though the model never reads it.

**Options every multi-turn env takes**: ``max_turns`` (assistant turns per episode) and
``stop_strings`` (strings that end a turn, kept in it; the class attribute by default, e.g.
``</tool_call>`` and ``</answer>``): ``--env-args '{"max_turns": 3}'``.

**Bounded in time.** Every turn is processed by ``score_completion`` on a ``TurnExample`` (the
episode's state, turn number and example), through the scoring path itself: ``step`` through
``score``, the batched runner (``trainers.common.episodes``) through the run's ``BatchScorer``.
So a turn (its tool calls included) gets ``score_timeout`` seconds, in this process under the
interval timer (``score_workers = 0``) or in a worker process killed at the deadline; each tool
call gets ``tool_timeout`` of it. A turn not processed in time ends the episode with reward 0 and
``error="timeout"``; a tool call not done in time is an error message to the model.

**Limits.** ``max_turns`` assistant turns (``truncated`` when the last one did not end the
episode), and, in the batched runner, ``episode_tokens(max_new_tokens)`` tokens after the first
prompt (model and env tokens; ``truncated`` when they run out). A single-turn ``TaskEnv`` is the
one-turn case: the runner gives it the one-call rollout it always had.

Scoring a plain completion (``score``, ``score_batch``, TRL's ``EnvReward``) scores it as the
first turn of an episode: ``respond``'s reward, or 0 for a tool call.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from gymnasium import spaces

from llm_envs.core import TaskEnv
from llm_envs.tools import Tool, has_tool_call, run_tool_calls
from llm_envs.types import Example, Message, Score


@dataclass
class Reply:
    """The env's answer to one assistant turn: its ``messages`` to the model (``user`` role,
    usually), this turn's ``reward``, whether the episode is ``done``, and, on the last turn,
    whether it was solved (``correct``) and the reward's ``parts``."""

    messages: list[Message] = field(default_factory=list)
    reward: float = 0.0
    done: bool = False
    correct: bool = False
    parts: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class TurnExample(Example):
    """One turn to process: the episode's ``example``, its ``state`` before the turn and the turn's
    number (0 first). Its prompt is empty, so the scoring path puts no opening in front of the turn
    (the runner gives the first turn the whole text, opening included)."""

    example: Example | None = None
    state: Any = None
    turn: int = 0


@dataclass
class TurnScore(Score):
    """A processed turn: the reward fields of ``Score`` plus the env's reply and the state after it."""

    messages: list[Message] = field(default_factory=list)
    done: bool = False
    state: Any = None
    tool_calls: int = 0
    tool_errors: int = 0


class Messages(spaces.Space):
    """The space of chat-message lists (a multi-turn env's observations)."""

    def __init__(self):
        super().__init__(None, None)

    def contains(self, x: Any) -> bool:
        return isinstance(x, list) and all(isinstance(m, dict) and isinstance(m.get("content"), str) for m in x)

    def sample(self, mask: Any = None, probability: Any = None) -> list[Message]:
        return [{"role": "user", "content": str(self.np_random.integers(100))}]

    def __repr__(self) -> str:
        return "Messages()"


class MultiTurnEnv(TaskEnv):
    """An environment whose episodes have several turns (see the module docstring)."""

    #: Assistant turns an episode may take (the episode is truncated after the last).
    max_turns: ClassVar[int] = 4
    #: Tokens an episode may hold after its first prompt, model and env turns together (the batched
    #: runner's budget; ``None``: ``max_turns * (max_new_tokens + 256)``).
    max_episode_tokens: ClassVar[int | None] = None
    #: Seconds each tool call may take (within the turn's ``score_timeout``).
    tool_timeout: float = 5.0
    #: Tool calls run per turn (more are answered with an error).
    max_tool_calls: ClassVar[int] = 4

    def __init__(self, *args: Any, max_turns: int | None = None, stop_strings: Sequence[str] | None = None,
                 **kwargs: Any):
        """``max_turns``: assistant turns per episode (default: the class's); ``stop_strings``: strings
        that end a turn (default: the class's ``stop_strings``; ``[]``: none). Other arguments are
        ``TaskEnv``'s (``data``, ``seed``, ``opening``)."""
        super().__init__(*args, **kwargs)
        if max_turns is not None:
            if not isinstance(max_turns, int) or isinstance(max_turns, bool) or max_turns < 1:
                raise ValueError(f"max_turns must be an int >= 1, got {max_turns!r}")
            self.max_turns = max_turns
        if stop_strings is not None:
            if isinstance(stop_strings, str) or not all(isinstance(x, str) and x for x in stop_strings):
                raise ValueError(f"stop_strings must be a list of non-empty strings, got {stop_strings!r:.80}")
            self.stop_strings = tuple(stop_strings)
        self.observation_space = Messages()
        self._episode: dict[str, Any] | None = None

    # ----- hooks -----------------------------------------------------------------------------------
    def begin(self, example: Example) -> Any:
        """The state of a new episode on ``example`` (picklable; default ``None``)."""
        return None

    def respond(self, text: str, state: Any, example: Example) -> Reply:
        """The env's reply to the assistant's turn ``text`` (may update ``state`` in place)."""
        raise NotImplementedError

    def tools(self) -> Sequence[Tool]:
        """The tools the model may call (default: none)."""
        return ()

    def episode_tokens(self, max_new_tokens: int | None = None) -> int:
        """The token budget of an episode after its first prompt: ``max_episode_tokens``, else
        ``max_turns * (max_new_tokens + 256)``, with the run's ``max_new_tokens`` per turn (default:
        the env's)."""
        return self.max_episode_tokens or self.max_turns * ((max_new_tokens or self.max_new_tokens) + 256)

    def model_tokens(self, max_new_tokens: int | None = None) -> int:
        """The most tokens the model can write in one episode: ``max_new_tokens`` (the run's,
        default the env's) in each of ``max_turns`` turns, within ``episode_tokens``."""
        per_turn = max_new_tokens or self.max_new_tokens
        return min(self.max_turns * per_turn, self.episode_tokens(per_turn))

    # ----- one turn, through the scoring path ------------------------------------------------------
    def score_completion(self, completion: str, example: Example) -> Score:
        if not isinstance(example, TurnExample):  # a plain completion: the first turn of an episode
            turn = self.process_turn(completion, TurnExample(example.id, [], None, example=example,
                                                             state=self.begin(example)))
            return Score(turn.reward, turn.correct, turn.parts, turn.error)
        return self.process_turn(completion, example)

    def process_turn(self, text: str, turn: TurnExample) -> TurnScore:
        """The env's answer to one turn: tool results when ``text`` calls a tool, else ``respond``'s
        reply; works on a copy of the state (the same in this process as in a worker)."""
        state = copy.deepcopy(turn.state)
        tools = self.tools()
        if tools and has_tool_call(text):
            results = run_tool_calls(text, tools, self.tool_timeout, self.max_tool_calls, state, turn.example)
            return TurnScore(0.0, False, messages=results.messages, state=state, tool_calls=results.calls,
                             tool_errors=results.errors)
        reply = self.respond(text, state, turn.example)
        if not isinstance(reply, Reply):
            raise TypeError(f"{type(self).__name__}.respond must return a Reply, got {type(reply).__name__}")
        if not reply.done and not reply.messages:  # the model would be asked to go on with nothing said
            raise ValueError(f"{type(self).__name__}.respond returned Reply(done=False) with no messages: a reply "
                             f"that does not end the episode must answer the model")
        return TurnScore(float(reply.reward), bool(reply.correct), dict(reply.parts), messages=list(reply.messages),
                         done=bool(reply.done), state=state)

    # ----- Gymnasium episode API ---------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        """Start an episode (``options`` as ``TaskEnv.reset``); the observation is the first
        prompt's chat messages."""
        _, info = super().reset(seed=seed, options=options)
        example = self._current
        self._episode = {"state": self.begin(example), "turn": 0, "return": 0.0, "tool_calls": 0, "tool_errors": 0}
        return list(example.prompt), info

    def step(self, action: str):
        """Process one assistant turn (the first one continues the example's opening, if any)."""
        if self._episode is None or self._current is None:
            raise RuntimeError("call reset() before step()")
        ep, example = self._episode, self._current
        text = (example.opening if ep["turn"] == 0 else "") + action
        out = self.score(text, TurnExample(example.id, [], None, example=example, state=ep["state"], turn=ep["turn"]))
        ep["turn"] += 1
        ep["return"] += float(out.reward)
        terminated = bool(getattr(out, "done", False)) or out.error is not None
        truncated = not terminated and ep["turn"] >= self.max_turns
        if isinstance(out, TurnScore):
            ep["state"] = out.state
            ep["tool_calls"] += out.tool_calls
            ep["tool_errors"] += out.tool_errors
        messages = list(getattr(out, "messages", []))  # the env's last reply too: Gymnasium's final observation
        info = {"example_id": example.id, "turn": ep["turn"], "return": ep["return"], "correct": out.correct,
                "parts": out.parts, "error": out.error, "tool_calls": ep["tool_calls"],
                "tool_errors": ep["tool_errors"]}
        if terminated or truncated:
            self._episode = None
        return messages, float(out.reward), terminated, truncated, info


def turn_limit(attempts: int | None, max_turns: int | None, default: int) -> int:
    """The turns of an env whose own option is ``attempts`` and that takes every multi-turn env's
    ``max_turns`` too: the one given (``default`` when neither is); both at once must agree."""
    if attempts is not None and max_turns is not None and attempts != max_turns:
        raise ValueError(f"attempts={attempts!r} and max_turns={max_turns!r} name the same limit: give one")
    name, turns = ("attempts", attempts) if attempts is not None else ("max_turns", max_turns)
    if turns is None:
        return default
    if not isinstance(turns, int) or isinstance(turns, bool) or turns < 1:
        raise ValueError(f"{name} must be an int >= 1, got {turns!r}")
    return turns


def is_multiturn(env: Any) -> bool:
    """Whether ``env`` (or the env a view such as ``WithValidation`` wraps) runs multi-turn episodes."""
    return isinstance(getattr(env, "env", env), MultiTurnEnv) or isinstance(env, MultiTurnEnv)
