"""ES on LoRA adapters (``--lora-rank R``): members perturb the adapter factors only, and a whole
population is evaluated in one batched generation, member n's adapter on its own rows.

The adapter of a layer (PEFT's LoRA, ``trainers/common/adapters.py``) computes
``W x + scale * B A x`` with A (R x d_in), B (d_out x R), scale = alpha / R. ES treats the factors
as its parameters: tensor 2i is layer i's A, tensor 2i + 1 its B (``fullrank.Params``, a fixed
order), and member n (seed s, sign g) draws ``g * sigma * eps(s, index)`` for each, the very noise
``fullrank`` draws, so the update ``theta += sum_n c_n eps_n`` is ``fullrank.apply_update`` on the
same tensors, and the seeds alone rebuild a run. Adapters start as PEFT starts them (B = 0, A
random): a member's output then moves by ``g sigma scale * eps_B A x`` at first order, nonzero from
the first iteration (noise on A alone would do nothing while B = 0).

The population never touches the weights. Within ``AdapterPopulation.applied()`` each adapter
layer's own adapter is disabled (its output is the base's ``W x``) and a forward hook adds, to the
rows of member n (rows member-major, as for low-rank noise),

    scale * (x A_n^T) B_n^T,   A_n = A + g_n sigma eps_A,n,   B_n = B + g_n sigma eps_B,n

with two batched products per layer over all members (``lowrank.Population``'s hook: the stacked
factors ``(members, d_in, R)`` and ``(members, R, d_out)``; no Python loop over members). So the
same member-major row layout serves the hf engine (hooks) and the native one (``rows.RowNoise``,
which also applies a plain adapter in its decode loop: ``AdapterPopulation.own``). Full-rank noise
on an adapter of rank R is a perturbation of W of rank <= 2R.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch

from trainers.es.noise.fullrank import Params, noise
from trainers.es.noise.lowrank import LayerError, Population


@dataclass
class AdapterLayer:
    """One LoRA-wrapped projection: the module whose output the population corrects, and its factors."""

    name: str  # the module's name, e.g. "base_model.model.model.layers.0.self_attn.q_proj"
    module: torch.nn.Module  # PEFT's LoRA layer (its output is the base's while its adapter is disabled)
    A: torch.Tensor  # (R, d_in)
    B: torch.Tensor  # (d_out, R)
    scale: float  # alpha / R
    d_out: int
    d_in: int
    transposed: bool = False


def adapter_layers(model: torch.nn.Module, adapter: str = "default") -> list[AdapterLayer]:
    """Every LoRA layer of ``model`` holding ``adapter``, in the model's order (their index seeds
    their noise). A ``LayerError`` when the model has none."""
    from peft.tuners.lora import LoraLayer

    layers = []
    for name, module in model.named_modules():
        if isinstance(module, LoraLayer) and adapter in module.lora_A:
            if not isinstance(module.lora_A[adapter], torch.nn.Linear):  # (GPT-2's Conv1D: Linear factors too)
                raise LayerError(f"--lora-rank: ES batches adapters of Linear layers; {name} is "
                                 f"{type(module.get_base_layer()).__name__}")
            A, B = module.lora_A[adapter].weight, module.lora_B[adapter].weight
            layers.append(AdapterLayer(name, module, A, B, float(module.scaling[adapter]), B.shape[0], A.shape[1]))
    if not layers:
        raise LayerError("--lora-rank: the model has no LoRA adapter layers")
    return layers


def params_of(layers: Sequence[AdapterLayer], fp32_master: bool = True) -> Params:
    """What ES perturbs and updates: each layer's A, then its B (tensor 2i and 2i + 1)."""
    named = [(f"{layer.name}.{factor}", t) for layer in layers for factor, t in (("lora_A", layer.A), ("lora_B", layer.B))]
    return Params(named, fp32_master)


def own_layers(model: torch.nn.Module) -> list[AdapterLayer]:
    """The active adapter's layers of a PEFT model (its adapters enabled), else []: what an engine
    that runs its own decode loop must add to the base's products."""
    if not hasattr(model, "peft_config"):
        return []
    layers = adapter_layers(model, model.active_adapter)
    return [] if any(getattr(layer.module, "disable_adapters", False) for layer in layers) else layers


@torch.no_grad()
def member_factors(params: Params, layers: Sequence[AdapterLayer], seeds: Sequence[int], signs: Sequence[float],
                   sigma: float) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Every member's factors, per layer ``A (members, R, d_in)`` and ``B (members, d_out, R)``:
    member k's are the masters + ``signs[k] * sigma * eps(seeds[k], index)`` (fp32)."""
    A, B = [], []
    for i in range(len(layers)):
        factors = []
        for index in (2 * i, 2 * i + 1):
            value = params.values(index).float()
            drawn = {s: noise(value, s, index) for s in dict.fromkeys(seeds)}  # mirrored pairs: once
            factors.append(torch.stack([value + (sign * sigma) * drawn[s] for s, sign in zip(seeds, signs)]))
        A.append(factors[0])
        B.append(factors[1])
    return A, B


class AdapterPopulation(Population):
    """Per-member adapters ready to be added to a batched forward pass (rows member-major).

    ``A[i] (members, R, d_in)`` and ``B[i] (members, d_out, R)`` are member k's factors of layer i;
    stored as ``lowrank.Population`` stores its factors, the down product first,
    ``self.B[i] = A^T (members, d_in, R)``, and ``self.At[i] = scale * B^T (members, R, d_out)``, so
    its hook (two ``bmm`` over members) and the native engine's per-row products serve both."""

    def __init__(self, layers: Sequence[AdapterLayer], A: Sequence[torch.Tensor], B: Sequence[torch.Tensor]):
        self.layers, self.members = list(layers), A[0].shape[0]
        self.B = [a.transpose(1, 2).contiguous() for a in A]
        self.At = [(layer.scale * b).transpose(1, 2).contiguous() for layer, b in zip(self.layers, B)]
        self._cast = {torch.float32: (self.B, self.At)}

    @classmethod
    @torch.no_grad()
    def of_members(cls, params: Params, layers: Sequence[AdapterLayer], seeds: Sequence[int], signs: Sequence[float],
                   sigma: float) -> AdapterPopulation:
        """Member k: every factor + ``signs[k] * sigma * eps(seeds[k])`` (fp32, from the masters)."""
        return cls(layers, *member_factors(params, layers, seeds, signs, sigma))

    @classmethod
    @torch.no_grad()
    def own(cls, layers: Sequence[AdapterLayer]) -> AdapterPopulation:
        """One member: the adapter itself (an engine's plain generation with a PEFT model)."""
        return cls(layers, [layer.A.detach().float()[None] for layer in layers],
                   [layer.B.detach().float()[None] for layer in layers])

    @property
    def rank(self) -> int:
        return self.B[0].shape[-1]

    @contextlib.contextmanager
    def applied(self) -> Iterator[None]:
        """Within the block each member's adapter acts on its own rows (the layers' own adapters off)."""
        with own_adapters_off(self.layers), super().applied():
            yield


@contextlib.contextmanager
def own_adapters_off(layers: Sequence[AdapterLayer]) -> Iterator[None]:
    """The layers' own adapters disabled within the block (their ``requires_grad`` flags kept)."""
    flags = [(t, t.requires_grad) for layer in layers for t in (layer.A, layer.B)]
    for layer in layers:
        layer.module.enable_adapters(False)
    try:
        yield
    finally:
        for layer in layers:
            layer.module.enable_adapters(True)
        for t, flag in flags:
            t.requires_grad_(flag)
