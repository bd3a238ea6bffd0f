"""Multi-turn envs in TRL's ``GRPOTrainer`` (TRL 1.16's experimental ``rollout_func``).

``EpisodeRollout(env, tokenizer)`` is a ``rollout_func``: for the prompts of a step (the text
prompts of ``llm_envs.trl.dataset``, group repeats included) it runs the episodes with our batched
runner (``trainers.common.episodes``) on the trainer's own model (the hf engine) and returns their
exact token ids: ``prompt_ids`` (the first prompt), ``completion_ids`` (model turns and env
replies), ``env_mask`` (1 on the model's tokens, which TRL uses as its tool mask: the loss covers
them only) and each episode's ``episode_return``, ``episode_correct`` and ``episode_turns``,
which TRL forwards to the reward functions. ``EpisodeReturn()`` is the reward function that reads
the return back. ``logprobs`` is ``None``: TRL then computes the old log-probs itself.

A prompt names its example by its text: examples with the same prompt text (every
GuessNumber-v0 example: the secret is the env's) are told apart by drawing one of them per group
from (the step, the group) alone, so the responses of one group share their example.

Set ``max_completion_length`` to at least ``env.episode_tokens()`` (model and env tokens of an
episode); each turn generates at most ``max_new_tokens`` (default: the env's).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from llm_envs import BatchScorer
from llm_envs.trl import prompt_text
from trainers.common.episodes import run_episodes
from trainers.engines.hf import HFEngine


class EpisodeRollout:
    """A TRL ``rollout_func`` running ``env``'s episodes (module docstring)."""

    def __init__(self, env, tokenizer, splits: Sequence[str] = ("train", "test"), max_new_tokens: int | None = None,
                 temperature: float = 1.0, seed: int = 0, workers: int | None = None):
        self.env, self.tokenizer = env.unwrapped, tokenizer
        self.max_new_tokens = max_new_tokens or self.env.max_new_tokens
        self.temperature, self.seed = temperature, seed
        self.by_prompt: dict[str, list] = {}
        for split in splits:
            for example in self.env.examples(split):
                self.by_prompt.setdefault(prompt_text(tokenizer, example), []).append(example)
        self.scorer = BatchScorer(self.env, workers)
        self.calls = 0

    def example_of(self, prompt: str, group: int):
        """The example a prompt stands for (one per group among examples with that text)."""
        if not isinstance(prompt, str) or prompt not in self.by_prompt:
            raise KeyError("EpisodeRollout: a prompt that is no example's: build the dataset with "
                           "llm_envs.trl.dataset(env, tokenizer, split) for one of the splits it was given")
        candidates = self.by_prompt[prompt]
        pick = np.random.SeedSequence([self.seed, self.calls, group]).generate_state(1)[0] % len(candidates)
        return candidates[int(pick)]

    def __call__(self, prompts: Sequence[str], trainer) -> dict[str, Any]:
        G = max(1, getattr(trainer, "num_generations", 1) if trainer.model.training else
                getattr(trainer, "num_generations_eval", 1) or 1)
        examples = [self.example_of(p, i // G) for i, p in enumerate(prompts)]
        seeds = [int(np.random.SeedSequence([self.seed, self.calls, i]).generate_state(2, np.uint32).view(np.uint64)[0] >> 1)
                 for i in range(len(prompts))]
        self.calls += 1
        model = trainer.accelerator.unwrap_model(trainer.model)
        episodes = run_episodes(HFEngine(model, self.tokenizer), self.scorer, examples, self.max_new_tokens,
                                batch_size=len(examples), temperature=self.temperature, seed=seeds)
        return {"prompt_ids": [e.prompt_ids for e in episodes], "completion_ids": [e.ids for e in episodes],
                "logprobs": None, "env_mask": [e.mask for e in episodes],
                "episode_return": [e.episode_return for e in episodes],
                "episode_correct": [float(e.correct) for e in episodes], "episode_turns": [e.turns for e in episodes]}

    def close(self) -> None:
        self.scorer.close()


class EpisodeReturn:
    """TRL reward function: each episode's return (``EpisodeRollout``'s ``episode_return``); logs
    the fraction solved and the mean turns with TRL's ``log_metric``."""

    __name__ = "episode_return"

    def __call__(self, prompts, completions, episode_return=None, episode_correct=None, episode_turns=None,
                 log_metric=None, **columns) -> list[float]:
        if episode_return is None:
            raise KeyError("EpisodeReturn needs EpisodeRollout as the trainer's rollout_func")
        if log_metric is not None and episode_correct is not None:
            log_metric("correct", sum(episode_correct) / len(episode_correct))
            log_metric("turns", sum(episode_turns) / len(episode_turns))
        return [float(r) for r in episode_return]
