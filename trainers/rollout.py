"""Generate completions for an environment's examples and score them: the one path from a
model to rewards, shared by every trainer and the evaluation harness."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from llm_envs import Example, Score, TaskEnv
from trainers.generation import generate


def batch_for(examples: Sequence[Example], size: int, seed: int, step: int) -> list[Example]:
    """The prompts of one step: ``size`` distinct training examples drawn from (seed, step)
    (all of them, in order, when ``size`` covers the split)."""
    if size >= len(examples):
        return list(examples)
    rng = np.random.default_rng([seed, step])
    return [examples[i] for i in sorted(rng.choice(len(examples), size, replace=False))]


@dataclass
class Rollout:
    texts: list[str]
    scores: list[Score]
    num_tokens: list[int]
    seconds: float

    @property
    def mean_reward(self) -> float:
        return sum(s.reward for s in self.scores) / max(1, len(self.scores))

    @property
    def accuracy(self) -> float:
        return sum(s.correct for s in self.scores) / max(1, len(self.scores))


def rollout(
    model,
    tokenizer,
    env: TaskEnv,
    examples: Sequence[Example],
    max_new_tokens: int,
    batch_size: int = 32,
    temperature: float = 0.0,
    seed: int | None = None,
    score_workers: int | None = None,
    sort: bool = True,
) -> Rollout:
    """Completions of ``examples`` (greedy unless ``temperature > 0``) and their scores
    (``sort=False``: generate in the given order, see ``generate``)."""
    start = time.perf_counter()
    out = generate(model, tokenizer, [e.prompt for e in examples], max_new_tokens=max_new_tokens,
                   batch_size=batch_size, temperature=temperature, seed=seed, sort=sort)
    scores = env.score_batch(out.texts, list(examples), workers=score_workers)
    return Rollout(out.texts, scores, out.num_tokens, time.perf_counter() - start)


def evaluate(model, tokenizer, env: TaskEnv, split: str = "test", max_new_tokens: int | None = None,
             batch_size: int = 32, limit: int | None = None, score_workers: int | None = None) -> dict[str, float]:
    """Greedy pass@1 and mean reward on ``split`` (the paper's protocol)."""
    examples = list(env.examples(split))[:limit]
    r = rollout(model, tokenizer, env, examples, max_new_tokens or env.max_new_tokens, batch_size,
                score_workers=score_workers)
    return {"pass@1": r.accuracy, "reward": r.mean_reward, "n": len(examples),
            "tokens": sum(r.num_tokens), "seconds": r.seconds}
