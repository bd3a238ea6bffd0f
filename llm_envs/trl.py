"""Our environments in TRL's ``GRPOTrainer`` (``pip install -e '.[trl]'``).

``dataset(env, tokenizer, split)`` is a ``datasets.Dataset`` with one row per example: ``prompt``,
the text our engines generate from, and ``split`` and ``index``, which name the example;
``EnvReward(env)`` is a reward function that looks each example up from those two columns and
scores TRL's completions with the env's ``score_batch`` (bounded in time; model text is data).

Why text prompts, not chat messages: ``GRPOTrainer`` renders a chat prompt with
``add_generation_prompt=True`` whatever its last message is, so an opening of the assistant's
turn (Countdown's, Sudoku's, every ``rg/`` task's "Let me solve this step by step.\\n<think>")
would be closed and followed by a new, empty assistant turn. Rendered here, as our engines render
it, the prompt ends with the opening; TRL's completion is the text after it, and ``score_batch``
puts the opening in front of it, as in our rollouts.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any

from llm_envs.core import TaskEnv
from llm_envs.templates import render_chat
from llm_envs.types import Example

__all__ = ["EnvReward", "dataset", "prompt_text"]


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
                           "llm_envs.trl.dataset(env, tokenizer, split)")
        if any(not isinstance(c, str) for c in completions):
            raise TypeError("EnvReward scores text completions: give GRPOTrainer llm_envs.trl.dataset's text "
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
