"""Per-token log-probabilities of completions under a model, from one padded forward pass: what
the RL losses train on and what the eval harness's KL measures.

Layout of a batch (the same as generation's): each row is a left-padded prompt followed by a
right-padded completion, so every completion starts at the same column ``P`` and the logits that
score it are the last ``T + 1`` positions of the forward pass (``logits_to_keep``)::

    [pad pad p0 p1 p2 | c0 c1 c2 pad]      position P-1+t predicts completion token t
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from trainers.common.models import compute_context


@dataclass
class Padded:
    """Token tensors of a batch of (prompt, completion) pairs, in the layout above."""

    input_ids: torch.Tensor  # [B, P + T]
    attention_mask: torch.Tensor  # [B, P + T]
    position_ids: torch.Tensor  # [B, P + T]
    completion_ids: torch.Tensor  # [B, T]
    mask: torch.Tensor  # [B, T] float: 1 on completion tokens, 0 on padding
    prompt_width: int  # P

    @property
    def width(self) -> int:  # T
        return self.completion_ids.shape[1]


def pad(prompt_ids: Sequence[Sequence[int]], completion_ids: Sequence[Sequence[int]], pad_id: int,
        device: torch.device | str = "cpu") -> Padded:
    """Left-pad the prompts and right-pad the completions into one batch."""
    P = max(len(p) for p in prompt_ids)
    T = max(1, max(len(c) for c in completion_ids))
    B = len(prompt_ids)
    input_ids = torch.full((B, P + T), pad_id, dtype=torch.long)
    attention = torch.zeros((B, P + T), dtype=torch.long)
    for i, (p, c) in enumerate(zip(prompt_ids, completion_ids)):
        input_ids[i, P - len(p):P] = torch.tensor(p, dtype=torch.long)
        input_ids[i, P:P + len(c)] = torch.tensor(c, dtype=torch.long)
        attention[i, P - len(p):P + len(c)] = 1
    position_ids = (attention.cumsum(-1) - 1).clamp(min=0)
    mask = attention[:, P:].float()
    return Padded(input_ids.to(device), attention.to(device), position_ids.to(device),
                  input_ids[:, P:].to(device), mask.to(device), P)


def token_logprobs(model, batch: Padded, temperature: float = 1.0, hidden: bool = False):
    """Per-token log-probs ``[B, T]`` of the completion tokens under ``model`` (at the sampling
    ``temperature``), from one forward pass; with ``hidden=True`` also the last hidden states
    ``[B, T, H]`` at the same positions (the states a value head reads). Pads hold garbage:
    always reduce with ``batch.mask``."""
    T, P = batch.width, batch.prompt_width
    inputs = dict(input_ids=batch.input_ids, attention_mask=batch.attention_mask, position_ids=batch.position_ids,
                  use_cache=False, output_hidden_states=hidden)
    with compute_context(model):
        try:
            out = model(**inputs, logits_to_keep=T + 1)
        except TypeError:  # a model without logits_to_keep: all positions, sliced below
            out = model(**inputs)
    logits = out.logits[:, -(T + 1):-1, :].float()
    if temperature != 1.0:
        logits = logits / temperature
    ids = batch.completion_ids.unsqueeze(-1)
    logp = logits.gather(-1, ids).squeeze(-1) - torch.logsumexp(logits, dim=-1)
    if hidden:
        return logp, out.hidden_states[-1][:, P - 1:P + T - 1, :]
    return logp


def completion_states(trunk, batch: Padded):
    """The last hidden states ``[B, T, H]`` of a transformer ``trunk`` (a model without LM head) at
    the positions that predict each completion token: the states a separate critic reads (the
    same positions as ``token_logprobs(..., hidden=True)``)."""
    T, P = batch.width, batch.prompt_width
    with compute_context(trunk):
        out = trunk(input_ids=batch.input_ids, attention_mask=batch.attention_mask, position_ids=batch.position_ids,
                    use_cache=False)
    return out.last_hidden_state[:, P - 1:P + T - 1, :]
