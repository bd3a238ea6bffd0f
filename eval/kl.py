"""KL divergence of a model from its base on the model's own sampled responses (the paper's
conciseness metric, after Schulman's "Approximating KL divergence").

Per completion token, with ``r = p_base(y_t | x, y_<t) / p_model(y_t | x, y_<t)``, the k3
estimator ``r - log r - 1`` is non-negative and unbiased for KL[model || base] when the tokens are
sampled from the model's distribution ``p_model``. It is averaged over the tokens of a response,
then over responses.

Responses sampled at temperature T come from the tempered distribution softmax(logits / T), so
both log-probabilities are taken at that same T (``temperature``): the estimate is then unbiased
for KL[model_T || base_T], which is the paper's KL[model || base] at T = 1 (the conciseness
preset). Greedy or nucleus (top_p < 1) responses are not samples of any such distribution: the
harness refuses KL for them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from eval.cache import cache_key
from trainers.rl.logprobs import LENGTH_BUCKETS, batch_of, token_logprobs
from trainers.rl.losses import kl_k3

#: Responses per forward pass at most (the evaluation's ``--batch-size`` when smaller).
KL_BATCH = 8


def kl_batch_size(batch_size: int) -> int:
    """Responses per forward pass for an evaluation's ``--batch-size``."""
    return min(batch_size, KL_BATCH)


def kl_cache_key(generation: str, base: str, base_runtime: dict[str, str], temperature: float,
                 batch_size: int) -> str:
    """The cache key of the KL of the responses ``generation`` names (its key holds the model's
    fingerprint, device, dtype and engine) to the ``base`` fingerprint: everything else that changes
    the numbers too. The base's device and dtype; the temperature; the forward passes' batch size,
    which decides which responses share a pass and so the layout (the shared prefix for the samples
    of one prompt in one pass, else one padded row each; in bf16 the two differ by up to ~0.015 nats
    per token) and the padding; and the layout's length buckets."""
    layout: dict[str, Any] = {"batch_size": kl_batch_size(batch_size), "length_buckets": LENGTH_BUCKETS}
    return cache_key(kind="kl", generation=generation, base=base, base_runtime=base_runtime, temperature=temperature,
                     layout=layout)


def k3(logp_base: torch.Tensor, logp_model: torch.Tensor) -> torch.Tensor:
    """Elementwise ``r - log r - 1`` with ``log r = logp_base - logp_model``, in float64 (the
    trainers' ``kl_k3``, the one implementation of the estimator)."""
    return kl_k3(logp_model.double(), logp_base.double())


@torch.inference_mode()
def completion_logprobs(model, prompts: Sequence[Sequence[int]], completions: Sequence[Sequence[int]],
                        batch_size: int = 8, pad_id: int = 0, temperature: float = 1.0) -> list[torch.Tensor]:
    """Log-probability of every completion token given its prompt and the tokens before it, under
    ``softmax(logits / temperature)``, in batches of ``batch_size`` (``trainers.rl.logprobs``, the
    trainers' own computation: samples of one prompt in a batch share its pass); one float32 CPU
    tensor per completion (empty for an empty one)."""
    if len(prompts) != len(completions):
        raise ValueError(f"{len(prompts)} prompts for {len(completions)} completions")
    device = next(model.parameters()).device
    out: list[torch.Tensor] = []
    for start in range(0, len(prompts), batch_size):
        chunk = [list(c) for c in completions[start:start + batch_size]]
        logp = token_logprobs(model, batch_of(prompts[start:start + batch_size], chunk, pad_id, device), temperature)
        out += [logp[i, :len(c)].float().cpu() for i, c in enumerate(chunk)]
    return out


def response_kl(model, base, prompts: Sequence[Sequence[int]], completions: Sequence[Sequence[int]],
                batch_size: int = 8, pad_id: int = 0, temperature: float = 1.0) -> list[float]:
    """Mean per-token k3 KL[model_T || base_T] of each completion (0.0 for an empty one), both
    models tempered by the ``temperature`` the completions were sampled at."""
    if not temperature > 0:
        raise ValueError(f"KL needs responses sampled at a temperature > 0, got {temperature}")
    if model.get_input_embeddings().num_embeddings != base.get_input_embeddings().num_embeddings:
        raise ValueError("the model and the base model have different vocabularies; KL needs the same tokenizer")
    lp_model = completion_logprobs(model, prompts, completions, batch_size, pad_id, temperature)
    lp_base = completion_logprobs(base, prompts, completions, batch_size, pad_id, temperature)
    return [float(k3(b, m).mean()) if len(m) else 0.0 for m, b in zip(lp_model, lp_base)]
