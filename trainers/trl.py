"""Our environments in TRL's ``GRPOTrainer`` (``pip install -e '.[trl]'``): the one home of TRL
interop, single-turn and multi-turn.

**Single-turn.** ``dataset(env, tokenizer, split)`` is a ``datasets.Dataset`` with one row per example: ``prompt``,
the text our engines generate from, and ``split`` and ``index``, which name the example;
``EnvReward(env)`` is a reward function that looks each example up from those two columns and
scores TRL's completions with the env's ``score_batch`` (bounded in time; model text is data).

Why text prompts, not chat messages: ``GRPOTrainer`` renders a chat prompt with
``add_generation_prompt=True`` whatever its last message is, so an opening of the assistant's
turn (Countdown's, Sudoku's, every ``rg/`` task's "Let me solve this step by step.\\n<think>")
would be closed and followed by a new, empty assistant turn. Rendered here, as our engines render
it, the prompt ends with the opening; TRL's completion is the text after it, and ``score_batch``
puts the opening in front of it, as in our rollouts.

**Multi-turn.** ``EpisodeRollout(env, tokenizer)`` is a ``rollout_func``: for the prompts of a step (the text
prompts of ``trainers.trl.dataset``, group repeats included) it runs the episodes with our batched
runner (``trainers.common.episodes``) on the trainer's own model (the hf engine) and returns their
exact token ids: ``prompt_ids`` (the first prompt), ``completion_ids`` (model turns and env
replies), ``env_mask`` (1 on the model's tokens, which TRL uses as its tool mask: the loss covers
them only) and each episode's ``episode_return``, ``episode_correct`` and ``episode_stats`` (its
``episode_row`` numbers: turns, tool calls and errors, truncated, cut), which TRL forwards to the
reward functions. ``EpisodeReturn()`` is the reward function that reads the return back, and logs
the episodes' statistics by the names every trainer and eval use (``turns_mean``, ...). ``logprobs`` is ``None``: TRL then computes the old log-probs itself.

A prompt names its example by its text, within one split: training draws (the model in train mode)
come from ``train_split`` only, evaluation draws from ``eval_split``, so no held-out example is
ever trained on. Examples with the same prompt text (a hidden-state env's: every GuessNumber-v0
example, the secret being the env's) are told apart by drawing one of them per group from (the
seed, the call, the group) alone, with groups numbered over every process's prompts together (TRL
hands each process a contiguous share of the step's prompts), so the responses of one group share
their example even when a group spans two processes.

Set ``max_completion_length`` to at least ``env.episode_tokens(max_new_tokens)`` (model and env
tokens of an episode); each turn generates at most ``max_new_tokens`` (default: the env's) and ends
at the env's stop strings as in every rollout here.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from llm_envs import BatchScorer
from llm_envs.core import TaskEnv
from llm_envs.templates import render_chat
from llm_envs.types import Example
from trainers.common.episodes import EpisodeTally, episode_row, run_episodes
from trainers.engines.hf import HFEngine

__all__ = ["EnvReward", "EpisodeReturn", "EpisodeRollout", "dataset", "prompt_text"]


# ----- single-turn: a dataset and a reward function ----------------------------------------------

def prompt_text(tokenizer: Any, example: Example) -> str:
    """``example``'s prompt as the text TRL should tokenize to get the token ids our engines feed
    the model (``trainers.engines.generation.encode_prompts``).

    The rendering is the engines' rule (``llm_envs.templates.render_chat``): the chat template with
    the assistant's generation prompt, or, for an example with an opening, continuing that final
    assistant message so the text ends with it.
    """
    text = render_chat(tokenizer, example.prompt)
    # TRL tokenizes a text prompt with the tokenizer's special tokens; our engines add none, the
    # template writes its own. A tokenizer that adds a BOS (Llama 3's) would give two: drop the
    # template's, and TRL's ids are ours.
    added = tokenizer("")["input_ids"]
    bos = tokenizer.bos_token
    if added == [tokenizer.bos_token_id] and bos and text.startswith(bos):
        return text[len(bos):]
    if added:
        warnings.warn(f"the tokenizer adds special tokens {added} to every text, which TRL keeps and our engines "
                      f"do not: the model sees them in front of the prompt under TRL only", stacklevel=2)
    return text


def dataset(env: TaskEnv, tokenizer: Any, split: str = "train", limit: int | None = None):
    """The first ``limit`` (all when ``None``) examples of ``split`` as a ``datasets.Dataset`` for
    ``GRPOTrainer``: columns ``prompt`` (``prompt_text``), ``split``, ``index`` (the example's
    position in ``env.examples(split)``, what ``EnvReward`` scores against) and ``example_id``."""
    from datasets import Dataset

    env = env.unwrapped
    examples = list(env.examples(split))[:limit]
    return Dataset.from_dict({
        "prompt": [prompt_text(tokenizer, e) for e in examples],
        "split": [split] * len(examples),
        "index": list(range(len(examples))),
        "example_id": [e.id for e in examples],
    })


class EnvReward:
    """A TRL reward function: the env's reward of each completion.

    TRL calls it with the batch's prompts and completions and, per completion, the dataset's
    columns; ``split`` and ``index`` (from ``dataset``) pick the example. Scoring is the env's
    ``score_batch`` of ``(completion, example)``: the scorer sees ``example.opening + completion``
    and each item is bounded by ``timeout`` (default: the env's ``score_timeout``); a completion
    that fails or times out scores 0. ``workers``: scoring processes (default: the env's).

    Besides the reward, it logs with TRL's ``log_metric`` the fraction ``correct``, the fraction
    with a scoring error (``score_errors``) and the mean of each part of the reward (``parts/...``,
    e.g. Countdown's ``format`` and ``answer``), so they show without being trained on. TRL names
    the reward ``rewards/<env id>/mean`` in its logs. Close the env after training to stop the
    scoring processes (``env.close()``).
    """

    def __init__(self, env: TaskEnv, workers: int | None = None, timeout: float | None = None):
        self.env = env.unwrapped
        self.workers = workers
        self.timeout = timeout
        spec = getattr(self.env, "spec", None)
        self.__name__ = spec.id if spec is not None else type(self.env).__name__  # TRL's name for it

    def __call__(self, prompts: Sequence[Any], completions: Sequence[str], split: Sequence[str] | None = None,
                 index: Sequence[int] | None = None, log_metric: Callable[[str, float], None] | None = None,
                 **columns: Any) -> list[float]:
        if split is None or index is None:
            raise KeyError("EnvReward needs the dataset's 'split' and 'index' columns: build the dataset with "
                           "trainers.trl.dataset(env, tokenizer, split)")
        if any(not isinstance(c, str) for c in completions):
            raise TypeError("EnvReward scores text completions: give GRPOTrainer trainers.trl.dataset's text "
                            "prompts, not chat messages")
        examples = [self.env.examples(s)[i] for s, i in zip(split, index)]
        scores = self.env.score_batch(list(completions), examples, self.workers, self.timeout)
        if log_metric is not None:
            n = len(scores)
            log_metric("correct", sum(bool(s.correct) for s in scores) / n)
            log_metric("score_errors", sum(s.error is not None for s in scores) / n)
            for part in sorted({k for s in scores for k in s.parts}):
                log_metric(f"parts/{part}", sum(s.parts.get(part, 0.0) for s in scores) / n)
        return [float(s.reward) for s in scores]


# ----- multi-turn: our episode runner as TRL's rollout_func -------------------------------------

class EpisodeRollout:
    """A TRL ``rollout_func`` running ``env``'s episodes (module docstring)."""

    def __init__(self, env, tokenizer, train_split: str = "train", eval_split: str = "test",
                 max_new_tokens: int | None = None, temperature: float = 1.0, seed: int = 0, workers: int | None = None):
        self.env, self.tokenizer = env.unwrapped, tokenizer
        self.max_new_tokens = max_new_tokens or self.env.max_new_tokens
        self.temperature, self.seed = temperature, seed
        self.splits = {True: train_split, False: eval_split}  # by the model's training mode
        self.by_prompt: dict[str, dict[str, list]] = {}
        for split in dict.fromkeys(self.splits.values()):
            by_text = self.by_prompt[split] = {}
            for example in self.env.examples(split):
                by_text.setdefault(prompt_text(tokenizer, example), []).append(example)
        self.scorer = BatchScorer(self.env, workers)
        self.calls = 0

    def example_of(self, prompt: str, group: int, split: str | None = None):
        """The example of ``split`` (default: the training split) a prompt stands for: one per
        group, drawn from (seed, call, group) among that split's examples with that text."""
        split = split or self.splits[True]
        candidates = self.by_prompt[split].get(prompt) if isinstance(prompt, str) else None
        if not candidates:
            raise KeyError(f"EpisodeRollout: a prompt that is no {split} example's: build the dataset with "
                           f"trainers.trl.dataset(env, tokenizer, {split!r})")
        pick = np.random.SeedSequence([self.seed, self.calls, group]).generate_state(1)[0] % len(candidates)
        return candidates[int(pick)]

    def draw(self, prompts: Sequence[str], trainer) -> tuple[list[Example], list[int]]:
        """The examples this process's ``prompts`` stand for (of the training split while the model
        trains, else of the evaluation split) and each response's sampling seed, both numbered over
        all processes' prompts: a group (``num_generations`` responses) shares its example and
        draws every response from (seed, call, its place in the step) alone."""
        training = bool(trainer.model.training)
        G = max(1, getattr(trainer, "num_generations", 1) if training else
                getattr(trainer, "num_generations_eval", 1) or 1)
        start = _offset(trainer, len(prompts))  # this process's first prompt among the step's, all processes'
        examples = [self.example_of(p, (start + i) // G, self.splits[training]) for i, p in enumerate(prompts)]
        seeds = [int(np.random.SeedSequence([self.seed, self.calls, start + i]).generate_state(2, np.uint32)
                     .view(np.uint64)[0] >> 1) for i in range(len(prompts))]
        self.calls += 1
        return examples, seeds

    def __call__(self, prompts: Sequence[str], trainer) -> dict[str, Any]:
        examples, seeds = self.draw(prompts, trainer)
        model = trainer.accelerator.unwrap_model(trainer.model)
        episodes = run_episodes(HFEngine(model, self.tokenizer), self.scorer, examples, self.max_new_tokens,
                                batch_size=len(examples), temperature=self.temperature, seed=seeds)
        return {"prompt_ids": [e.prompt_ids for e in episodes], "completion_ids": [e.ids for e in episodes],
                "logprobs": None, "env_mask": [e.mask for e in episodes],
                "episode_return": [e.episode_return for e in episodes],
                "episode_correct": [float(e.correct) for e in episodes],
                "episode_stats": [{k: v for k, v in episode_row(e).items() if k != "messages"} for e in episodes]}

    def close(self) -> None:
        self.scorer.close()


def _offset(trainer, count: int) -> int:
    """Where this process's ``count`` prompts start among all processes' (their counts gathered;
    TRL's sampler hands process p the p-th contiguous share of a step's prompts)."""
    accelerator = trainer.accelerator
    if getattr(accelerator, "num_processes", 1) <= 1:
        return 0
    from accelerate.utils import gather_object

    counts = gather_object([count])
    return int(sum(counts[:accelerator.process_index]))


class EpisodeReturn:
    """TRL reward function: each episode's return (``EpisodeRollout``'s ``episode_return``); logs
    the fraction solved (``correct``) and the episodes' statistics (``EPISODE_STATS``: turns, tool
    calls, tool errors, truncated, return) with TRL's ``log_metric``."""

    __name__ = "episode_return"

    def __call__(self, prompts, completions, episode_return=None, episode_correct=None, episode_stats=None,
                 log_metric=None, **columns) -> list[float]:
        if episode_return is None:
            raise KeyError("EpisodeReturn needs EpisodeRollout as the trainer's rollout_func")
        if log_metric is not None and episode_correct is not None:
            log_metric("correct", sum(episode_correct) / len(episode_correct))
            tally = EpisodeTally()
            tally.add(episode_stats)
            for name, value in tally.means().items():
                log_metric(name, value)
        return [float(r) for r in episode_return]
