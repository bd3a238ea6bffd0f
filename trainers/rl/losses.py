"""The pieces the RL losses are built from: reductions over completion tokens, KL estimators and
PPO's clipped surrogate. Each algorithm assembles its own loss from them (``grpo.py``, ``ppo.py``).

Per-token tensors are ``[B, T]`` over completion positions, with a ``mask`` that is 1 on
completion tokens and 0 on padding (see ``trainers.rl.logprobs``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

# ----- masks and reductions ----------------------------------------------------------------------


def masked_sum(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Sum of ``x`` where ``mask`` is set (pads contribute exactly 0 to the value, even NaN)."""
    return torch.where(mask.bool(), x, torch.zeros((), dtype=x.dtype, device=x.device)).sum()


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``x`` over the set positions of ``mask`` (0 when none is set)."""
    return masked_sum(x, mask) / mask.sum().clamp(min=1)


def masked_whiten(x: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8,
                  total: Callable[[torch.Tensor], torch.Tensor] | None = None) -> torch.Tensor:
    """``(x - mean) / std`` over the masked positions (population std); pads become 0. ``total``:
    a sum over processes (``Ranks.sum_tensor``), making mean and std those of every process's
    masked positions together."""
    total = total or (lambda t: t)
    n = total(mask.sum()).clamp(min=1)
    mean = total(masked_sum(x, mask)) / n
    var = total(masked_sum((x - mean) ** 2, mask)) / n
    return torch.where(mask.bool(), (x - mean) * torch.rsqrt(var + eps), torch.zeros_like(x))


# ----- KL estimators (Schulman, "Approximating KL divergence") ------------------------------------


def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimate of KL(policy || ref): ``exp(ref - logp) - (ref - logp) - 1`` (>= 0,
    unbiased for tokens sampled from the policy, exactly 0 where the two agree)."""
    d = ref_logp - logp
    return torch.expm1(d) - d  # = exp(d) - 1 - d, accurate near d = 0


def kl_k1(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Per-token k1 estimate ``logp - ref`` (unbiased, can be negative; the usual in-reward penalty)."""
    return logp - ref_logp


KL_ESTIMATORS = {"k1": kl_k1, "k3": kl_k3}


# ----- the clipped surrogate (PPO, GRPO) ----------------------------------------------------------


def clipped_surrogate(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor,
                      clip_eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO's per-token policy loss ``-min(r * A, clip(r, 1 - eps, 1 + eps) * A)`` with
    ``r = exp(logp - old_logp)``, and where the clip is active (for the clip fraction)."""
    ratio = torch.exp(logp - old_logp)
    unclipped = ratio * advantages
    clipped = torch.clamp(ratio, 1 - clip_eps, 1 + clip_eps) * advantages
    return -torch.minimum(unclipped, clipped), clipped < unclipped
