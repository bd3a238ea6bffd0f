"""The RL trainers' models and optimizer: the trainable policy (fp32 master weights), its frozen
reference (the KL anchor), AdamW, and one optimizer step over accumulated micro-batches."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from trainers.models import load_model, resolve_device


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


def make_optimizer(groups: list[dict[str, Any]], lr: float, weight_decay: float = 0.0,
                   betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8) -> torch.optim.AdamW:
    """AdamW over parameter groups (``{"params": [...], "lr": optional}``)."""
    return torch.optim.AdamW(groups, lr=lr, weight_decay=weight_decay, betas=betas, eps=eps)


def micro_batches(n: int, count: int) -> list[slice]:
    """``count`` contiguous, near-equal slices of ``range(n)`` (gradient accumulation)."""
    bounds = np.linspace(0, n, min(count, n) + 1).round().astype(int)
    return [slice(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:]) if b > a]


def clip_and_step(params: list[torch.nn.Parameter], optimizer, max_grad_norm: float | None) -> float:
    """Clip the gradient norm (when ``max_grad_norm``), step, zero the gradients; returns the norm
    before clipping."""
    norm = torch.nn.utils.clip_grad_norm_(params, max_grad_norm if max_grad_norm else float("inf"))
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return float(norm)
