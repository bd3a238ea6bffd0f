"""Which engine runs LoRA adapters how (``--lora-rank``), and the one-line refusals.

- ``hf``: the PEFT model's own forward; an ES population as per-member hooks (two batched products
  per layer, ``trainers/es/noise/adapters.py``).
- ``native``: the adapters added per row in its decode loop (``native/rows.py``), the plain adapter
  as a population of one; it does this on the q/k/v/o/gate/up/down projections, so other targets
  are refused.
- ``vllm``: generation with an adapter gets the merged weights W + scale B A (``merged_weights``),
  loaded like any other weights after each update (RL). An ES population of adapters is one
  ``LoRARequest`` per member over the unmerged base (``base_weights``; ``vllm_adapters.py``), on
  the projections vLLM's multi-LoRA serves (q/k/v/o/gate/up/down).
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from trainers.engines.native.rows import PROJECTIONS


def engine_refuses(engine: str, opts, es: bool = False) -> str | None:
    """Why ``engine`` cannot run the adapters ``opts`` (a ``LoraOptions``) asks for, in one line; None
    when it can. ``es``: an ES population of adapters."""
    if not opts.lora:
        return None
    other = ", ".join(t for t in opts.target_list or () if t not in PROJECTIONS)
    who = {"native": "--engine native applies adapters to",
           "vllm": "ES on adapters with --engine vllm serves adapters on" if es else None}.get(engine)
    if who and other:
        return f"--lora-targets {opts.lora_targets}: {who} {', '.join(PROJECTIONS)} only, not {other}; use --engine hf"
    return None


def merged_weights(model) -> Iterator[tuple[str, torch.Tensor]]:
    """A PEFT model's weights as its base model names them, each adapter merged in
    (W + scale * B A, computed in fp32): what an engine that loads plain weights generates with."""
    from peft.tuners.lora import LoraLayer

    base = model.get_base_model()
    lora = {name: m for name, m in base.named_modules() if isinstance(m, LoraLayer)}
    active = model.active_adapter
    for name, p in base.named_parameters():
        if ".lora_" in name:
            continue
        owner, _, leaf = name.rpartition(".")
        layer_name = owner.removesuffix(".base_layer")
        if owner.endswith(".base_layer") and layer_name in lora and leaf == "weight" and active in lora[layer_name].lora_A:
            m = lora[layer_name]
            delta = m.scaling[active] * (m.lora_B[active].weight.float() @ m.lora_A[active].weight.float())
            yield f"{layer_name}.{leaf}", (p.detach().float() + (delta.T if m.fan_in_fan_out else delta)).to(p.dtype)
        else:
            yield name.replace(".base_layer.", "."), p.detach()


def base_weights(model) -> Iterator[tuple[str, torch.Tensor]]:
    """A PEFT model's base weights as its base model names them, the adapters left out: what an
    engine that serves the adapters apart (vLLM's ``LoRARequest``) loads."""
    for name, p in model.get_base_model().named_parameters():
        if ".lora_" not in name:
            yield name.replace(".base_layer.", "."), p.detach()
