"""The batched multi-turn rollout: many episodes of a ``MultiTurnEnv`` advance in lockstep, one
engine call per turn, the one path from a model to episode returns (``trainers.common.rollout``
calls it for multi-turn envs, so ES, the RL trainers and ``python -m eval`` all go through it).

Each turn, every active episode is one row whose prompt is its conversation so far as token ids
(``TokenIds``): the first prompt rendered with the chat template, then each model turn's exact
sampled ids (never decoded and re-encoded: BPE is not a bijection, and RL's log-probs must be of
the tokens the model conditioned on), then the env's reply as bridge ids. The bridge is the text
the chat template puts after an assistant turn's end-of-turn token for the env's messages plus the
next generation prompt, found by diffing a dummy conversation (``bridge_ids``; TRL and verifiers do
the same), and is masked 0 for the loss. The env processes all rows' turns in one
``score_batch`` call of the run's ``BatchScorer`` (bounded in time, see ``llm_envs.multiturn``).

**Turns end** at the model's stop token or at one of the env's ``stop_strings`` (every engine
stops there; the turn is its text up to and including the string). A turn that did not end on
the chat template's own end-of-turn token (a stop string, or another stop token such as
SmolLM2's ``<|endoftext|>``) is closed with that token (``closing_ids``: ``<|im_end|>``), masked 0,
before the env's reply, so the conversation the model trains on is the template's.

An episode leaves the batch when the env ends it (``terminated``), or a limit does
(``truncated``): ``max_turns``, the token budget ``episode_tokens(max_new_tokens)`` (model and env
tokens after the first prompt), or a turn cut at ``max_new_tokens`` without a stop token or
string (``cut``: its text is still processed, but nothing can be stitched after it). The env's
reply to the last turn stays in the episode's ``messages`` (the record), never in its ids.

**Statistics** (``EpisodeTally``): mean turns, tool calls, tool errors, the truncated fraction and
the mean return, under the names eval's summaries use (``EPISODE_STATS``), which every trainer
logs per iteration; ``cut_short`` is the one-line warning for runs whose episodes mostly end cut
at their first turn (the model does not end its turns where the env expects).

Sampling: row k's turn t draws from a seed derived from (its seed, t) alone (turn 0 from its seed
itself, as a single-turn rollout does), so its tokens do not depend on the other rows. An ES
low-rank population (rows member-major, equally many per member) stays valid as rows leave: each
turn's call takes the members with active rows, each padded to as many rows as the busiest with
repeats of its own rows, whose outputs are dropped.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from llm_envs import BatchScorer, Example, Score
from llm_envs.multiturn import TurnExample, TurnScore
from trainers.engines.base import Engine
from trainers.engines.generation import END_OF_TURN_TOKENS, TokenIds, encode_prompts
from trainers.engines.sampling import Seeds, row_seeds
from trainers.es.noise.members import BATCHED, LowRankMembers, Perturbation

#: A dummy assistant reply no chat template writes itself (a one-letter reply would be found inside
#: the template's own markers: the "x" of "<|endoftext|>").
_REPLY = "llm-envs-dummy-reply"
_DUMMY = [{"role": "user", "content": "u"}, {"role": "assistant", "content": _REPLY}]
#: The numbers an episode adds to its run's statistics (``EpisodeTally``), in this order.
_SUMMED = ("episodes", "turns", "tool_calls", "tool_errors", "truncated", "return", "first_turn_cut")
#: The statistics every log records for multi-turn episodes: eval's summary keys.
EPISODE_STATS = ("turns_mean", "tool_calls_mean", "tool_errors_mean", "truncated_rate", "return_mean")


@dataclass
class Episode:
    """One episode: its conversation as messages and as exact token ids, with the loss mask."""

    example: Example
    state: Any
    messages: list[dict[str, str]]  # the prompt (an opening merged into the first turn), then the turns
    prompt_ids: list[int]  # the first prompt as the model saw it
    ids: list[int] = field(default_factory=list)  # everything after it: model turns and bridges
    mask: list[int] = field(default_factory=list)  # per id: 1 = sampled by the model, 0 = env's
    rewards: list[float] = field(default_factory=list)  # per turn
    turns: int = 0
    correct: bool = False
    parts: dict[str, float] = field(default_factory=dict)
    terminated: bool = False
    truncated: bool = False
    error: str | None = None
    tool_calls: int = 0
    tool_errors: int = 0
    last_text: str = ""  # the model's text of the last turn (after the opening, on a first turn)
    cut: bool = False  # the last turn was cut at the token limit, before a stop token or string

    @property
    def done(self) -> bool:
        return self.terminated or self.truncated

    @property
    def episode_return(self) -> float:
        return float(sum(self.rewards))

    @property
    def model_tokens(self) -> int:
        return int(sum(self.mask))

    def score(self) -> Score:
        """The episode as a ``Score``: its return, whether it was solved, the last turn's parts."""
        return Score(self.episode_return, self.correct, dict(self.parts), self.error)


def _turn_end(tokenizer) -> tuple[str, int, int]:
    """The dummy conversation as text, where its assistant reply's content ends, and where the
    template's end-of-turn token after it ends (the bridge starts there)."""
    before = tokenizer.apply_chat_template(_DUMMY, tokenize=False)
    content = before.rfind(_REPLY) + len(_REPLY)
    ends = [before.find(t, content) + len(t) for t in (tokenizer.eos_token, *END_OF_TURN_TOKENS)
            if t and before.find(t, content) >= 0]
    return before, content, min(ends) if ends else content


def bridge_ids(tokenizer, messages: Sequence[dict[str, str]]) -> list[int]:
    """The ids the chat template puts after an assistant turn's end-of-turn token for the env's
    ``messages`` and the next assistant generation prompt (a dummy conversation's diff)."""
    before, _, cut = _turn_end(tokenizer)
    after = tokenizer.apply_chat_template(_DUMMY + list(messages), tokenize=False, add_generation_prompt=True)
    if not after.startswith(before[:cut]):
        raise ValueError("the chat template rewrites earlier turns when a message is added, so multi-turn token ids "
                         "cannot be kept exact; use a template that preserves the conversation's prefix")
    return tokenizer(after[cut:], add_special_tokens=False)["input_ids"]


def closing_ids(tokenizer) -> list[int]:
    """The ids the chat template ends an assistant turn with (``<|im_end|>`` in ChatML): what a
    turn that stopped otherwise (a stop string, another stop token) is closed with."""
    before, content, cut = _turn_end(tokenizer)
    return tokenizer(before[content:cut], add_special_tokens=False)["input_ids"] if cut > content else []


def turn_seed(seed: int, turn: int) -> int:
    """Row seed of turn ``turn``: the row's own seed on turn 0, else one drawn from (seed, turn)."""
    if turn == 0:
        return seed
    return int(np.random.SeedSequence([seed, turn]).generate_state(2, np.uint32).view(np.uint64)[0] >> 1)


def _lowrank_call(perturbation: LowRankMembers, rows: int, active: list[int]) -> tuple[list[int], LowRankMembers]:
    """The rows of one turn's call under a low-rank population of ``rows`` rows (member-major):
    each member with active rows, its rows padded with repeats to the busiest member's count."""
    per = perturbation.rows_per_member(rows)
    by_member: dict[int, list[int]] = {}
    for r in active:
        by_member.setdefault(r // per, []).append(r)
    width = max(len(v) for v in by_member.values())
    members = sorted(by_member)
    call_rows = [own[k % len(own)] for m in members for own in [by_member[m]] for k in range(width)]
    return call_rows, perturbation.subset(members)


def run_episodes(engine: Engine, scorer: BatchScorer, examples: Sequence[Example], max_new_tokens: int,
                 batch_size: int = 32, temperature: float = 0.0, seed: Seeds = None, samples: int = 1,
                 top_p: float = 1.0, progress: bool | str = False, sort: bool = True,
                 on_progress: Callable[[float, int, float], None] | None = None,
                 perturbation: Perturbation | None = None) -> list[Episode]:
    """``samples`` episodes of each of ``examples`` (example-major) of the multi-turn env
    ``scorer.env``; arguments as ``trainers.common.rollout.rollout`` (``seed``: one per episode or
    one for the call; ``max_new_tokens``: per turn)."""
    env, tokenizer = getattr(scorer, "env", scorer), engine.tokenizer  # a BatchScorer, or an env itself
    per_row = [e for e in examples for _ in range(samples)]
    first = encode_prompts(tokenizer, [e.prompt for e in examples])
    episodes = [Episode(e, env.begin(e), [dict(m) for m in e.prompt], list(first[i // samples]))
                for i, e in enumerate(per_row)]
    seeds = row_seeds(seed, len(episodes)) if temperature > 0 else None
    budget = env.episode_tokens(max_new_tokens)  # the run's per-turn budget, not the env's default
    closer = closing_ids(tokenizer)
    active = list(range(len(episodes)))
    turn = 0
    while active:
        rows, call_pert = active, perturbation
        if isinstance(perturbation, BATCHED):
            rows, call_pert = _lowrank_call(perturbation, len(episodes), active)
        left = {r: min(max_new_tokens, budget - len(episodes[r].ids)) for r in active}
        out = engine.generate([TokenIds(episodes[r].prompt_ids + episodes[r].ids) for r in rows],
                              max_new_tokens=max(left.values()), batch_size=batch_size, temperature=temperature,
                              top_p=top_p, seed=None if seeds is None else [turn_seed(seeds[r], turn) for r in rows],
                              progress=progress, sort=sort, on_progress=on_progress, perturbation=call_pert,
                              stop_strings=env.stop_strings)
        texts, finished = {}, {}
        for k, r in enumerate(rows):
            if r in texts:  # a repeat that pads a low-rank member: dropped
                continue
            ids = out.token_ids[k][:left[r]]
            finished[r] = out.finished[k] and len(ids) == len(out.token_ids[k])
            text = out.texts[k] if len(ids) == len(out.token_ids[k]) else \
                tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)
            ep = episodes[r]
            ep.ids += ids
            ep.mask += [1] * len(ids)
            texts[r] = (ep.example.opening if ep.turns == 0 else "") + text
        turn_examples = [TurnExample(episodes[r].example.id, [], None, example=episodes[r].example,
                                     state=episodes[r].state, turn=episodes[r].turns) for r in active]
        results = scorer.score_batch([texts[r] for r in active], turn_examples)
        for r, result in zip(active, results):
            _advance(episodes[r], texts[r], result, finished[r], env.max_turns, budget, tokenizer, closer)
        active = [r for r in active if not episodes[r].done]
        turn += 1
    return episodes


def _advance(ep: Episode, text: str, result: Score, finished: bool, max_turns: int, budget: int, tokenizer,
             closer: Sequence[int]) -> None:
    """Record one processed turn in ``ep`` (the env's reply kept in its messages); stitch the reply
    into its ids, the turn closed with the template's ``closer`` when it stopped otherwise, or end
    the episode."""
    if ep.turns == 0 and ep.messages and ep.messages[-1].get("role") == "assistant":
        ep.messages.pop()  # the opening: the first turn's text holds it
    ep.messages.append({"role": "assistant", "content": text})
    ep.last_text = text[len(ep.example.opening):] if ep.turns == 0 else text
    ep.turns += 1
    ep.cut = not finished
    ep.rewards.append(float(result.reward))
    ep.correct, ep.parts = bool(result.correct), dict(result.parts)
    if not isinstance(result, TurnScore):  # the turn failed (timeout, worker death, a bug): the episode ends
        ep.error, ep.terminated = result.error or "turn failed", True
        return
    ep.messages += [dict(m) for m in result.messages]  # the record holds the env's last reply too
    ep.state = result.state
    ep.tool_calls += result.tool_calls
    ep.tool_errors += result.tool_errors
    if result.done or not result.messages:
        ep.terminated = True
        return
    if not finished or ep.turns >= max_turns:
        ep.truncated = True
        return
    close = [] if ep.ids[len(ep.ids) - len(closer):] == list(closer) else list(closer)
    bridge = bridge_ids(tokenizer, result.messages)
    if len(ep.ids) + len(close) + len(bridge) >= budget:
        ep.truncated = True
        return
    ep.ids += close + bridge
    ep.mask += [0] * (len(close) + len(bridge))


def generation_of(episodes: Sequence[Episode], seconds: float):
    """A ``GenerationResult`` standing for the episodes (what single-turn code reads of a rollout):
    the last turn's text, the model's tokens, the episode's ids after its first prompt."""
    from trainers.engines.generation import GenerationResult

    return GenerationResult(texts=[e.last_text for e in episodes], num_tokens=[e.model_tokens for e in episodes],
                            finished=[e.terminated for e in episodes], token_ids=[list(e.ids) for e in episodes],
                            prompt_tokens=[len(e.prompt_ids) for e in episodes], seconds=seconds)


def episode_row(ep: Episode) -> dict[str, Any]:
    """An episode's record for the eval harness's per-example file: its length in turns, its tool
    calls and errors, how it ended (``cut``: its last turn at the token limit) and its conversation
    (the env's last reply included)."""
    return {"turns": ep.turns, "tool_calls": ep.tool_calls, "tool_errors": ep.tool_errors,
            "return": ep.episode_return, "terminated": ep.terminated, "truncated": ep.truncated, "cut": ep.cut,
            "messages": ep.messages}


class EpisodeTally:
    """The multi-turn statistics of one iteration (or evaluation): sums over episodes (``add``),
    which several processes add up (``sums``, an array, through their all-reduce) before ``means``."""

    def __init__(self):
        self.sums = np.zeros(len(_SUMMED))

    def add(self, episodes: Sequence[Episode | dict[str, Any]] | None) -> None:
        """Count ``episodes`` (``Episode`` objects or their ``episode_row`` records)."""
        for ep in episodes or ():
            row = episode_row(ep) if isinstance(ep, Episode) else ep
            self.sums += [1, row["turns"], row["tool_calls"], row["tool_errors"], bool(row["truncated"]),
                          row["return"], row["turns"] == 1 and bool(row.get("cut"))]

    @property
    def episodes(self) -> int:
        return int(self.sums[0])

    @property
    def first_turn_cut(self) -> int:
        """Episodes whose only turn was cut at the token limit."""
        return int(self.sums[_SUMMED.index("first_turn_cut")])

    def means(self) -> dict[str, float]:
        """``EPISODE_STATS``: means per episode of turns, tool calls, tool errors and return, and the
        fraction truncated ({} with no episode)."""
        if not self.episodes:
            return {}
        n, *totals = self.sums[:6]
        return {name: float(total / n) for name, total in zip(EPISODE_STATS, totals)}


def cut_short(tally: EpisodeTally, max_new_tokens: int, stop_strings: Sequence[str], check: str | None) -> str | None:
    """The one-line warning when most episodes ended cut at their first turn (the model did not
    end a turn within ``max_new_tokens``: it never hears the env), naming the command that shows
    why (``check``: ``python -m llm_envs.check ...``); None otherwise."""
    if not tally.episodes or 2 * tally.first_turn_cut <= tally.episodes:
        return None
    strings = f" or stop string ({', '.join(map(repr, stop_strings))})" if stop_strings else " (the env has no stop strings)"
    return (f"warning: {tally.first_turn_cut} of {tally.episodes} episodes ended at their first turn, cut at "
            f"{max_new_tokens} new tokens before a stop token{strings}, so the env never answered them"
            + (f"; see what the env expects and what the model writes: {check}" if check else ""))


def episode_line(tally: EpisodeTally) -> str:
    """The statistics for a progress line: ``; turns 2.50, tool calls 0.75 (errors 0.25), truncated 0.40``."""
    m = tally.means()
    if not m:
        return ""
    return (f"; turns {m['turns_mean']:.2f}, tool calls {m['tool_calls_mean']:.2f} (errors {m['tool_errors_mean']:.2f}), "
            f"truncated {m['truncated_rate']:.2f}")


def check_command(env_id: str, env_args: str | dict | None, model: str, max_new_tokens: int | None) -> str:
    """The ``python -m llm_envs.check`` line that steps ``env_id`` (with its options) and samples a
    few episodes of ``model`` as a run does, for warnings to name."""
    args = env_args if isinstance(env_args, str) or env_args is None else json.dumps(env_args)
    words = ["python", "-m", "llm_envs.check", env_id, *(["--env-args", args] if args else []), "--model", model,
             *(["--max-new-tokens", str(max_new_tokens)] if max_new_tokens else [])]
    return shlex.join(words)


def episode_summary(rows: Sequence[dict[str, Any]]) -> dict[str, float]:
    """``EPISODE_STATS`` (means per episode of turns, tool calls, tool errors and return, and the
    fraction truncated) and the fraction of episodes solved at each turn (``solved_at_turn``, turn ->
    fraction: whether the env's answers help), over rows that hold them (``episode_row``); ``{}``
    for single-turn rows. Pass@k is the harness's own."""
    if not rows or "turns" not in rows[0]:
        return {}
    tally = EpisodeTally()
    tally.add(rows)
    n = len(rows)
    solved = [r["turns"] for r in rows if r.get("correct")]
    return {**tally.means(),
            "solved_at_turn": {str(t): solved.count(t) / n for t in range(1, max(r["turns"] for r in rows) + 1)}}
