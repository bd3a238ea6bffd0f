"""KL divergence of a model from its base on the model's own sampled responses (the paper's
conciseness metric, after Schulman's "Approximating KL divergence").

Per completion token, with ``r = p_base(y_t | x, y_<t) / p_model(y_t | x, y_<t)``, the k3
estimator ``r - log r - 1`` is non-negative and unbiased for KL[model || base] when the tokens are
sampled from the model. It is averaged over the tokens of a response, then over responses.
Log-probabilities are those of the raw models (temperature 1), whatever temperature sampled the
responses.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def k3(logp_base: torch.Tensor, logp_model: torch.Tensor) -> torch.Tensor:
    """Elementwise ``r - log r - 1`` with ``log r = logp_base - logp_model`` (float64)."""
    log_r = logp_base.double() - logp_model.double()
    return torch.expm1(log_r) - log_r  # = r - 1 - log r, accurate near r = 1


@torch.inference_mode()
def token_logprobs(model, prompts: Sequence[Sequence[int]], completions: Sequence[Sequence[int]],
                   batch_size: int = 8, pad_id: int = 0) -> list[torch.Tensor]:
    """Log-probability of every completion token given its prompt and the tokens before it.

    Each batch is one right-padded forward pass over ``prompt + completion`` (an attention mask
    hides the padding); returns one float32 CPU tensor per completion (empty for an empty one).
    """
    if len(prompts) != len(completions):
        raise ValueError(f"{len(prompts)} prompts for {len(completions)} completions")
    device = next(model.parameters()).device
    out: list[torch.Tensor] = []
    for start in range(0, len(prompts), batch_size):
        rows = [(list(p), list(c)) for p, c in zip(prompts[start:start + batch_size], completions[start:start + batch_size])]
        width = max(len(p) + len(c) for p, c in rows)
        ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for r, (p, c) in enumerate(rows):
            ids[r, :len(p) + len(c)] = torch.tensor(p + c, dtype=torch.long)
            mask[r, :len(p) + len(c)] = 1
        # Only positions from the shortest prompt's end on predict completion tokens: keep just those
        # logits (a full vocabulary row per position is the memory hog).
        first = min(len(p) for p, _ in rows) - 1
        try:
            logits = model(input_ids=ids.to(device), attention_mask=mask.to(device), logits_to_keep=width - first).logits
        except TypeError:  # a model without logits_to_keep
            logits = model(input_ids=ids.to(device), attention_mask=mask.to(device)).logits[:, first:]
        for r, (p, c) in enumerate(rows):
            if not c:
                out.append(torch.zeros(0))
                continue
            # the token at position i is predicted by the logits at position i - 1
            logp = torch.log_softmax(logits[r, len(p) - 1 - first:len(p) + len(c) - 1 - first].float(), dim=-1)
            targets = torch.tensor(c, dtype=torch.long, device=logp.device)
            out.append(logp.gather(1, targets[:, None])[:, 0].cpu())
    return out


def response_kl(model, base, prompts: Sequence[Sequence[int]], completions: Sequence[Sequence[int]],
                batch_size: int = 8, pad_id: int = 0) -> list[float]:
    """Mean per-token k3 KL[model || base] of each completion (0.0 for an empty completion)."""
    if model.get_input_embeddings().num_embeddings != base.get_input_embeddings().num_embeddings:
        raise ValueError("the model and the base model have different vocabularies; KL needs the same tokenizer")
    lp_model = token_logprobs(model, prompts, completions, batch_size, pad_id)
    lp_base = token_logprobs(base, prompts, completions, batch_size, pad_id)
    return [float(k3(b, m).mean()) if len(m) else 0.0 for m, b in zip(lp_model, lp_base)]
