"""The RL trainers' training batch: ``group_size`` sampled responses per prompt, scored, with the
exact token ids the model conditioned on and produced (what the losses are computed on)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from llm_envs import BatchScorer, Example
from trainers.common.episodes import EpisodeTally
from trainers.common.rollout import rollout
from trainers.engines.base import Engine
from trainers.engines.generation import encode_prompts
from trainers.engines.sampling import Seeds


@dataclass
class Samples:
    """``len(examples) * group_size`` responses, prompt-major: the responses to prompt ``i`` are rows
    ``i * G : (i + 1) * G``. Token ids are exactly what the model conditioned on and produced (a
    completion ends with its stop token when it stopped)."""

    examples: list[Example]  # one per response
    prompt_ids: list[list[int]]
    completion_ids: list[list[int]]
    texts: list[str]
    rewards: torch.Tensor  # [B] float32
    correct: torch.Tensor  # [B] bool
    group_size: int
    # Multi-turn episodes (``trainers.rl.masking``): a completion is everything after the first
    # prompt, model turns and env turns; per token 1 = the model's (trained on), 0 = the env's.
    loss_masks: list[list[int]] | None = None
    # Their statistics' sums on this process (``EpisodeTally.sums``), for the log.
    episode_sums: list[float] | None = None
    # The most tokens the model may write in one response: max_new_tokens, or over an episode's
    # turns (``MultiTurnEnv.model_tokens``); Dr.GRPO's default normaliser. None: max_new_tokens.
    response_budget: int | None = None

    def __len__(self) -> int:
        return len(self.completion_ids)

    @property
    def num_tokens(self) -> int:
        """The model's tokens (the env's tokens of an episode are context, not counted)."""
        if self.loss_masks is not None:
            return sum(sum(m) for m in self.loss_masks)
        return sum(len(c) for c in self.completion_ids)


def sample(engine: Engine, scorer: BatchScorer, examples: Sequence[Example], group_size: int, max_new_tokens: int,
           batch_size: int = 32, temperature: float = 1.0, seed: Seeds = None, progress: bool | str = False,
           on_progress: Callable[[float, int, float], None] | None = None) -> Samples:
    """Sample ``group_size`` completions per example and score them (the shared ``rollout``;
    ``seed``: one per completion, example-major (``response_seeds``), or one for the call;
    ``progress`` and ``on_progress`` as in ``generate``)."""
    r = rollout(engine, scorer, examples, max_new_tokens, batch_size, temperature, seed, group_size,
                progress=progress, on_progress=on_progress)
    if r.episodes is not None:  # a multi-turn env: the exact ids of each episode, the env's masked
        tally = EpisodeTally()
        tally.add(r.episodes)
        return Samples(r.examples, [e.prompt_ids for e in r.episodes], [e.ids for e in r.episodes], r.texts,
                       torch.tensor([s.reward for s in r.scores], dtype=torch.float32),
                       torch.tensor([bool(s.correct) for s in r.scores]), group_size, [e.mask for e in r.episodes],
                       tally.sums.tolist(), getattr(scorer, "env", scorer).model_tokens(max_new_tokens))
    prompt_ids = [ids for ids in encode_prompts(engine.tokenizer, [e.prompt for e in examples]) for _ in range(group_size)]
    return Samples(r.examples, prompt_ids, r.generation.token_ids, r.texts,
                   torch.tensor([s.reward for s in r.scores], dtype=torch.float32),
                   torch.tensor([bool(s.correct) for s in r.scores]), group_size, response_budget=max_new_tokens)


def step_seed(seed: int, step: int) -> int:
    """The sampling seed of one step (independent of every other step's, reproducible on resume)."""
    return int(np.random.SeedSequence([seed, step]).generate_state(1)[0])


def response_seeds(seed: int, step: int, prompts: range, group_size: int) -> list[int]:
    """The sampling seed of each response of a step's ``prompts`` (indices into the step's whole
    list of prompts), example-major: response ``j`` of prompt ``i`` gets a 63-bit seed drawn from
    (``step_seed(seed, step)``, i, j) alone, so its sample is the same whichever process draws it
    and however the prompts are shared out."""
    base = step_seed(seed, step)
    return [int(np.random.SeedSequence([base, i, j]).generate_state(2, np.uint32).view(np.uint64)[0] >> 1)
            for i in prompts for j in range(group_size)]
