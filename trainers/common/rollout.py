"""Generate completions for an environment's examples and score them: the one path from a
model to rewards, shared by every trainer and the evaluation harness.

``evaluate`` is the held-out measurement (greedy pass@1 and mean reward on the first ``limit``
examples of a split): trainers log it as ``eval_pass@1`` / ``eval_reward``, and ``python -m eval``
measures greedy pass@1 through the same ``eval_examples`` and ``rollout``, so the two agree on the
same model, split and ``max_new_tokens``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from llm_envs import BatchScorer, Example, Score, TaskEnv
from llm_envs.multiturn import is_multiturn
from trainers.common.episodes import Episode, EpisodeTally, generation_of, run_episodes
from trainers.engines.base import Engine
from trainers.engines.generation import GenerationResult
from trainers.engines.sampling import Seeds
from trainers.es.noise.members import Perturbation


def batch_for(examples: Sequence[Example], size: int, seed: int, step: int) -> list[Example]:
    """The prompts of one step: ``size`` distinct training examples drawn from (seed, step)
    (all of them, in order, when ``size`` covers the split)."""
    if size >= len(examples):
        return list(examples)
    rng = np.random.default_rng([seed, step])
    return [examples[i] for i in sorted(rng.choice(len(examples), size, replace=False))]


@dataclass
class Rollout:
    """Completions (``samples`` per example, example-major) and their scores."""

    examples: list[Example]  # one per completion
    generation: GenerationResult  # texts, token ids and counts, generation time
    scores: list[Score]
    seconds: float  # generation and scoring
    episodes: list[Episode] | None = None  # a multi-turn env's episodes (scores: their returns)

    @property
    def texts(self) -> list[str]:
        return self.generation.texts

    @property
    def openings(self) -> list[str]:
        """The opening of the assistant's turn each completion continues ("" for none): the scorer
        saw ``openings[i] + texts[i]``."""
        return [e.opening for e in self.examples]

    @property
    def num_tokens(self) -> list[int]:
        return self.generation.num_tokens

    @property
    def mean_reward(self) -> float:
        return sum(s.reward for s in self.scores) / max(1, len(self.scores))

    @property
    def accuracy(self) -> float:
        return sum(s.correct for s in self.scores) / max(1, len(self.scores))


def rollout(
    engine: Engine,
    scorer: BatchScorer,
    examples: Sequence[Example],
    max_new_tokens: int,
    batch_size: int = 32,
    temperature: float = 0.0,
    seed: Seeds = None,
    samples: int = 1,
    top_p: float = 1.0,
    progress: bool | str = False,
    sort: bool = True,
    on_progress: Callable[[float, int, float], None] | None = None,
    perturbation: Perturbation | None = None,
    score: bool = True,
) -> Rollout:
    """``samples`` completions of each of ``examples`` (greedy unless ``temperature > 0``) from
    ``engine`` (under an ES ``perturbation`` when given), each ending at its stop token or at one of
    the env's ``stop_strings``, scored by ``scorer`` (each example's opening + completion, never the
    user's prompt). ``seed``: the call's sampling seed, or one per
    completion (example-major); ``sort=False`` generates in the given order; ``progress`` and
    ``on_progress`` as in ``generate``. ``score=False`` (single-turn only) generates without
    scoring, for callers that cache generations and score every time (``eval.harness``)."""
    start = time.perf_counter()
    if is_multiturn(getattr(scorer, "env", scorer)):  # episodes of several turns; a score is an episode's return
        episodes = run_episodes(engine, scorer, examples, max_new_tokens, batch_size, temperature, seed, samples,
                                top_p, progress, sort, on_progress, perturbation)
        seconds = time.perf_counter() - start
        return Rollout([e.example for e in episodes], generation_of(episodes, seconds), [e.score() for e in episodes],
                       seconds, episodes)
    out = engine.generate([e.prompt for e in examples], max_new_tokens=max_new_tokens, batch_size=batch_size,
                          temperature=temperature, top_p=top_p, seed=seed, num_return_sequences=samples,
                          progress=progress, sort=sort, on_progress=on_progress, perturbation=perturbation,
                          stop_strings=getattr(scorer, "env", scorer).stop_strings)
    per_completion = [e for e in examples for _ in range(samples)]
    scores = scorer.score_batch(out.texts, per_completion) if score else []
    return Rollout(per_completion, out, scores, time.perf_counter() - start)


def eval_examples(env: TaskEnv, split: str = "test", limit: int | None = None) -> list[Example]:
    """The held-out examples: the first ``limit`` (all when ``None``) of ``split``."""
    return list(env.examples(split))[:limit]


def evaluate(engine: Engine, scorer: BatchScorer, split: str = "test", max_new_tokens: int | None = None,
             batch_size: int = 32, limit: int | None = None, rank: int = 0, world: int = 1,
             all_sum: Callable[[np.ndarray], np.ndarray] | None = None, progress: bool | str = False,
             on_progress: Callable[[float, int, float], None] | None = None) -> dict[str, float]:
    """Greedy pass@1 and mean reward on ``split`` (the paper's protocol); on a multi-turn env also
    ``episodes``, the ``EpisodeTally`` of the episodes.

    With ``world`` processes, each evaluates every ``world``-th example from ``rank`` and
    ``all_sum`` (a sum across processes) combines the counts, so all get the same numbers.
    ``progress`` and ``on_progress`` as in ``generate``."""
    env = scorer.env
    examples = eval_examples(env, split, limit)
    r = rollout(engine, scorer, examples[rank::world], max_new_tokens or env.max_new_tokens, batch_size,
                progress=progress, on_progress=on_progress)
    tally = EpisodeTally()
    tally.add(r.episodes)
    sums = np.array([sum(bool(s.correct) for s in r.scores), sum(s.reward for s in r.scores), len(r.scores),
                     sum(r.num_tokens), *tally.sums], dtype=np.float64)
    if all_sum is not None:
        sums = all_sum(sums)
    tally.sums = sums[4:]
    n = max(1.0, sums[2])
    return {"pass@1": sums[0] / n, "reward": sums[1] / n, "n": len(examples), "tokens": int(sums[3]),
            "seconds": r.seconds, **({"episodes": tally} if is_multiturn(env) else {})}
