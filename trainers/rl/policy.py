"""The RL trainers' models and optimizer: the trainable policy (fp32 master weights), its frozen
reference (the KL anchor), PPO's critic trunk, AdamW, and one optimizer step over accumulated
micro-batches.

Memory per parameter of the base model (weights and optimizer state; activations and the
generation cache come on top): the policy 16 bytes (fp32 weights 4, fp32 gradients 4, AdamW's two
moments 8); the reference 2 on CUDA (bf16), 4 on CPU; PPO's separate critic another 16 (a second
trainable trunk). So GRPO ~18 bytes/parameter on CUDA, PPO ~34 (~18 with ``--shared-critic``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from trainers.common.models import load_model, resolve_device


def load_policy(name_or_path: str, device: str | None = None, gradient_checkpointing: bool = False):
    """The trainable policy: fp32 master weights (bf16 compute on CUDA through ``compute_context``)."""
    model, tokenizer = load_model(name_or_path, device=device, dtype=torch.float32)
    model.requires_grad_(True)
    if gradient_checkpointing:
        kwargs = {"use_reentrant": False}
        if hasattr(model, "activation_checkpointing_enable"):  # the name in recent transformers
            model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
        model.config.use_cache = False
    return model, tokenizer


def reference_dtype(device: torch.device) -> torch.dtype:
    """The frozen reference model's dtype: bf16 on CUDA (2 bytes per parameter instead of 4; it is
    only read, in the same bf16 autocast the policy computes in), fp32 on CPU (no fast bf16)."""
    return torch.bfloat16 if device.type == "cuda" else torch.float32


def load_reference(name_or_path: str, device: str | None = None):
    """A frozen copy of the base model (the KL anchor), in ``reference_dtype``; load it only when
    beta > 0."""
    dev = resolve_device(device)
    model, _ = load_model(name_or_path, device=dev, dtype=reference_dtype(dev))
    model.requires_grad_(False)
    model.eval()
    return model


def load_critic_trunk(name_or_path: str, device: str | None = None, gradient_checkpointing: bool = False):
    """A trainable copy of the base model without its LM head (``base_model``: the transformer that
    yields hidden states), fp32 master weights like the policy: the trunk of PPO's separate critic."""
    model, _ = load_policy(name_or_path, device, gradient_checkpointing)
    return model.base_model


def make_optimizer(groups: list[dict[str, Any]], lr: float, weight_decay: float = 0.0,
                   betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8) -> torch.optim.AdamW:
    """AdamW over parameter groups (``{"params": [...], "lr": optional}``)."""
    return torch.optim.AdamW(groups, lr=lr, weight_decay=weight_decay, betas=betas, eps=eps)


def micro_batches(n: int, count: int) -> list[slice]:
    """``count`` contiguous, near-equal slices of ``range(n)`` (gradient accumulation)."""
    bounds = np.linspace(0, n, min(count, n) + 1).round().astype(int)
    return [slice(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:]) if b > a]


def clip_and_step(optimizer, max_grad_norm: float | None) -> list[float]:
    """Clip the gradient norm of each parameter group on its own (when ``max_grad_norm``; a critic's
    large value-loss gradients never shrink the policy's), step, zero the gradients; returns each
    group's norm before clipping."""
    limit = max_grad_norm if max_grad_norm else float("inf")
    norms = [float(torch.nn.utils.clip_grad_norm_(group["params"], limit)) for group in optimizer.param_groups]
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return norms
