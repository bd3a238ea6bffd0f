"""The RL trainers' models and optimizer: the trainable policy (fp32 master weights), its frozen
reference (the KL anchor), PPO's critic trunk, AdamW, and one optimizer step over accumulated
micro-batches.

Precision (``--dtype``): the trainable models keep fp32 master weights, fp32 gradients and an fp32
optimizer, and compute in the run's dtype under autocast (``trainers/common/precision.py`` decides it: bf16 on
CUDA, on CPU what its probe measured faster); losses and log-softmax are fp32. The frozen reference is loaded in the compute dtype.

Memory per parameter of the base model (weights and optimizer state; activations and the
generation cache come on top): the policy 16 bytes (fp32 weights 4, fp32 gradients 4, AdamW's two
moments 8); the reference 2 in bf16, 4 in fp32; PPO's separate critic another 16 (a second
trainable trunk). So GRPO ~18 bytes/parameter in bf16, PPO ~34 (~18 with ``--shared-critic``).

With LoRA adapters (``--lora-rank``) the base is frozen weights in the compute dtype (2 bytes/parameter
in bf16, 4 in fp32; no gradients, no optimizer state) and only the adapters pay the 16 bytes; the KL reference is the
policy with its adapters disabled (``adapters.BaseOf``: no second copy), and PPO's critic is a
second adapter on the same frozen base.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from trainers.common import adapters
from trainers.common.adapters import LoraOptions
from trainers.common.models import load_model, resolve_device, set_compute_dtype


def load_policy(name_or_path: str, device: str | None = None, gradient_checkpointing: bool = False,
                compute: torch.dtype | None = None, lora: LoraOptions | None = None, seed: int = 0,
                base: str | None = None, frozen_in_compute: bool = True):
    """The trainable policy: fp32 master weights, computing in ``compute`` (None: fp32) under autocast
    (``compute_context``). With ``lora`` (``--lora-rank`` > 0) only LoRA adapters train (fp32), the
    base frozen, its weights in ``compute`` (bf16: 2 bytes per parameter; ``frozen_in_compute=False``
    keeps them fp32: several processes, where FSDP2 shards one dtype per layer): fresh adapters drawn
    from ``seed`` on the base model (recorded as ``base``), or the ones a checkpoint holds (every
    adapter it saved: PPO's critic too)."""
    adapted = lora is not None and lora.lora
    weights = compute if adapted and frozen_in_compute and compute is not None else torch.float32
    model, tokenizer = load_model(name_or_path, device=device, dtype=weights)
    if adapters.has_adapters(model):  # a checkpoint of an adapter run
        adapters.load_saved_adapters(model, name_or_path)
        adapters.train_adapters_only(model, tuple(model.peft_config))
    elif adapted:
        model = adapters.attach(model, lora, seed, base or name_or_path)
    else:
        model.requires_grad_(True)
    set_compute_dtype(model, compute)
    if gradient_checkpointing:
        enable_checkpointing(model)
    return model, tokenizer


def enable_checkpointing(model) -> None:
    """Recompute ``model``'s activations in its backward passes (``--gradient-checkpointing``): each
    layer keeps only its input (the default model's forward over a 10,109-token row kept 13 GB
    without). Idempotent."""
    if getattr(model, "is_gradient_checkpointing", False):
        return
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):  # the name in recent transformers
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    model.config.use_cache = False


def load_reference(name_or_path: str, device: str | None = None, compute: torch.dtype | None = None):
    """A frozen copy of the base model (the KL anchor), with weights in the policy's compute dtype
    (``compute``, None: fp32; bf16 takes 2 bytes per parameter instead of 4, and the reference is
    only read); load it only when beta > 0."""
    model, _ = load_model(name_or_path, device=resolve_device(device), dtype=compute or torch.float32)
    model.requires_grad_(False)
    model.eval()
    return model


def load_critic_trunk(name_or_path: str, device: str | None = None, gradient_checkpointing: bool = False,
                      compute: torch.dtype | None = None):
    """A trainable copy of the base model without its LM head (``base_model``: the transformer that
    yields hidden states), fp32 master weights computing in ``compute`` like the policy: the trunk
    of PPO's separate critic."""
    model, _ = load_policy(name_or_path, device, gradient_checkpointing, compute)
    set_compute_dtype(model.base_model, compute)
    return model.base_model


def make_optimizer(groups: list[dict[str, Any]], lr: float, weight_decay: float = 0.0,
                   betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8) -> torch.optim.AdamW:
    """AdamW over parameter groups (``{"params": [...], "lr": optional}``)."""
    return torch.optim.AdamW(groups, lr=lr, weight_decay=weight_decay, betas=betas, eps=eps)


def micro_batches(n: int, count: int) -> list[slice]:
    """``count`` contiguous, near-equal slices of ``range(n)`` (gradient accumulation)."""
    bounds = np.linspace(0, n, min(count, n) + 1).round().astype(int)
    return [slice(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:]) if b > a]


def units_of(prompt_ids: Sequence[Sequence[int]], shared: bool) -> list[slice]:
    """What a micro-batch is made of: whole groups (runs of rows with one prompt) with the shared
    prefix, else single rows."""
    starts = [i for i in range(len(prompt_ids)) if not shared or i == 0 or list(prompt_ids[i]) != list(prompt_ids[i - 1])]
    return [slice(a, b) for a, b in zip(starts, starts[1:] + [len(prompt_ids)])]


def unit_tokens(prompt_ids, completion_ids, unit: slice, shared: bool) -> int:
    """Tokens the forward pass sees for ``unit``: its prompt once and every completion (shared), or
    prompt + completion per row."""
    completions = sum(len(c) for c in completion_ids[unit])
    prompts = len(prompt_ids[unit.start]) if shared else sum(len(p) for p in prompt_ids[unit])
    return prompts + completions


def split_batch(prompt_ids, completion_ids, shared: bool, count: int = 1, max_tokens: int | None = None,
                agree: Callable[[int], int] | None = None) -> list[slice]:
    """The micro-batches of a step (gradient accumulation): contiguous runs of whole units
    (``units_of``), either ``count`` of them balanced by tokens, or, with ``max_tokens``, packed in
    order so that each holds at most ``max_tokens`` tokens (a unit larger than that alone). ``agree(k)`` -> the
    largest k over processes: every process then takes that many parts (FSDP's forward passes are
    collectives, so each process must run as many). Without the shared prefix and ``max_tokens``,
    ``count`` near-equal slices of rows, as before it existed."""
    units = units_of(prompt_ids, shared)
    if not shared and max_tokens is None:
        return micro_batches(len(prompt_ids), count)
    cost = [unit_tokens(prompt_ids, completion_ids, u, shared) for u in units]
    packed = None
    if max_tokens is not None:  # greedy: a new part when the next unit would not fit
        packed, held = [0], 0
        for i, c in enumerate(cost):
            if held and held + c > max_tokens:
                packed.append(i)
                held = 0
            held += c
        count = len(packed)
    # every process: the most parts any needs, at most as many as the process with the fewest units has
    agreed = min(agree(count), -agree(-len(units))) if agree else min(count, len(units))
    if packed is not None and agreed == count:
        return [slice(units[a].start, units[b - 1].stop) for a, b in zip(packed, packed[1:] + [len(units)])]
    count = agreed
    # cut at the unit boundary nearest each k/count of the total: parts balanced by tokens
    total, bounds, running = sum(cost), [0], 0
    for i, c in enumerate(cost):
        target = total * len(bounds) / count
        if len(bounds) < count and running + c >= target:
            cut = i if i > bounds[-1] and target - running < running + c - target else i + 1
            if cut < len(units):
                bounds.append(cut)
        running += c
    bounds.append(len(units))
    while len(bounds) < count + 1:  # fewer cuts than asked (a few very large units): split the largest
        widest = max(range(len(bounds) - 1), key=lambda k: bounds[k + 1] - bounds[k])
        bounds.insert(widest + 1, (bounds[widest] + bounds[widest + 1]) // 2)
    return [slice(units[a].start, units[b - 1].stop) for a, b in zip(bounds[:-1], bounds[1:]) if b > a]


def clip_and_step(optimizer, max_grad_norm: float | None) -> list[float]:
    """Clip the gradient norm of each parameter group on its own (when ``max_grad_norm``; a critic's
    large value-loss gradients never shrink the policy's), step, zero the gradients; returns each
    group's norm before clipping."""
    limit = max_grad_norm if max_grad_norm else float("inf")
    norms = [float(torch.nn.utils.clip_grad_norm_(group["params"], limit)) for group in optimizer.param_groups]
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return norms
