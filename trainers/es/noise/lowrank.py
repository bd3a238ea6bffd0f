"""Low-rank population noise (EGGROLL, arXiv 2511.16652): a whole ES population in one batched
forward pass, on a Hugging Face causal LM whose weight matrices are ``nn.Linear`` (or GPT-2
``Conv1D``) modules that see every token: dense models (Llama, Qwen2, GPT-2 layouts are tested).

Member n perturbs every selected weight matrix W (d_out x d_in) by sigma * E_n with

    E_n = A_n B_n^T / sqrt(R),   A_n (d_out x R), B_n (d_in x R) standard normal,

regenerated from ``(member seed, layer index)``. E_n is never formed and W is never modified
during evaluation: a forward hook on each selected layer adds, to the rows of member n (sign s),

    s * sigma / sqrt(R) * (x B_n) A_n^T

so ``y = x W^T (+ b) + s * sigma * x E_n^T`` exactly, with two small batched matrix products per
layer for all members at once. Rows are laid out member-major (member n owns rows
``n * P .. n * P + P - 1``), which lets every product be a plain ``bmm`` over members: no
gather, no Python loop over members, and the KV cache of each row holds its own member's keys
and values. The update ``theta_W += sum_n c_n E_n`` is one product of the stacked factors per
layer, in fp32.

What is perturbed: the weight matrices of every ``nn.Linear`` (and GPT-2 ``Conv1D``) module,
i.e. all projections of the transformer blocks, except the output embedding (``lm_head``, also
when tied to the input embedding). Embeddings, norms and biases keep their values, as in
EGGROLL's LLM runs: they are vectors or lookup tables, where a low-rank perturbation means
nothing, and they hold a few % of the parameters. Nor is any other parameter: MoE experts that
transformers stores as fused 3-D tensors (Mixtral, Qwen-MoE, DeepSeek, OLMoE in current versions)
keep their values, so such a model is mostly not perturbed (the trainer prints the share and warns);
experts that are separate ``nn.Linear`` modules see only the tokens routed to them, which breaks the
member-major row layout, and ``check_rows`` refuses them.
"""

from __future__ import annotations

import contextlib
import math
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch

from trainers.es.noise.fullrank import Params, tensor_seed


#: Up to this rank, the CPU hook adds each of the R rank-1 terms with broadcast products (faster
#: than bmm on CPU); above it, and on CUDA, two batched matrix products.
ELEMENTWISE_MAX_RANK = 4


class LayerError(ValueError):
    """The model cannot take the low-rank options asked for (``--rank``, ``--param-filter``, its
    layer types); commands report it in one line, as a bad option."""


@dataclass
class Layer:
    """One perturbed weight matrix and the module whose output the hook corrects."""

    name: str  # the weight's parameter name, e.g. "model.layers.0.self_attn.q_proj.weight"
    module: torch.nn.Module
    weight: torch.Tensor
    d_out: int
    d_in: int
    transposed: bool  # GPT-2's Conv1D stores W^T (d_in x d_out)


def _is_conv1d(module: torch.nn.Module) -> bool:
    return type(module).__name__ == "Conv1D" and hasattr(module, "nf")


def select_layers(model: torch.nn.Module, pattern: str | None = None, rank: int = 1) -> list[Layer]:
    """The layers low-rank noise perturbs, in a fixed order (their index seeds their noise).

    Every ``nn.Linear`` / ``Conv1D`` whose weight name matches ``pattern`` (all when ``None``),
    except the output embedding. Raises ``LayerError`` when nothing is left or when ``rank``
    exceeds ``min(d_out, d_in)`` of a layer."""
    if rank < 1:
        raise LayerError(f"--rank: must be >= 1, got {rank}")
    skip = set()
    for emb in (model.get_output_embeddings(), model.get_input_embeddings()):
        if emb is not None and getattr(emb, "weight", None) is not None:
            skip.add(emb.weight.data_ptr())
    layers = []
    for name, module in model.named_modules():
        linear = isinstance(module, torch.nn.Linear)
        if not (linear or _is_conv1d(module)) or module.weight.data_ptr() in skip:
            continue
        weight_name = f"{name}.weight"
        if pattern is not None and not re.search(pattern, weight_name):
            continue
        d_out, d_in = module.weight.shape if linear else module.weight.shape[::-1]
        if rank > min(d_out, d_in):
            raise LayerError(f"--rank {rank} exceeds what layer {weight_name} allows "
                               f"(min(d_out, d_in) = {min(d_out, d_in)})")
        layers.append(Layer(weight_name, module, module.weight, d_out, d_in, not linear))
    if not layers:
        what = f"--param-filter {pattern!r} matches no" if pattern else "the model has no"
        raise LayerError(f"{what} linear layer to perturb with low-rank noise "
                           f"(embeddings, lm_head and norms are never perturbed in this mode)")
    return layers


#: Below this share of the model's parameters perturbed, the ES trainer warns (SmolLM2: 79 %).
SMALL_SHARE = 0.5


@torch.no_grad()
def check_rows(model: torch.nn.Module, layers: Sequence[Layer]) -> None:
    """Refuse layers that do not see every row of a forward pass (a routed MoE expert sees only its
    tokens): the hook adds member n's noise to rows by their position, so such a layer would give
    members each other's noise. One forward pass of 2 x 4 tokens, each layer's calls counted."""
    rows, seen = 8, {layer.name: [] for layer in layers}
    hooks = [layer.module.register_forward_hook(
        lambda module, args, output, layer=layer: seen[layer.name].append(args[0].numel() // layer.d_in))
        for layer in layers]
    try:
        device = next(model.parameters()).device
        vocab = model.get_input_embeddings().num_embeddings
        model(input_ids=torch.arange(1, rows + 1, device=device).remainder(vocab).view(2, rows // 2))
    finally:
        for h in hooks:
            h.remove()
    for name, calls in seen.items():
        if calls != [rows] * max(1, len(calls)):
            raise LayerError(f"low-rank noise cannot perturb {name}: it saw {'+'.join(map(str, calls)) or 'none'} of "
                              f"the {rows} token rows of a forward pass (a routed MoE expert?), and each member's "
                              f"noise goes to its own rows; use --noise full, or leave it out with --param-filter")


def factors(layer: Layer, index: int, seed: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(A, B) of member ``seed`` for layer ``index``: fp32 standard normal, (d_out x R), (d_in x R),
    on the weight's device. One draw of (d_out + d_in) x R, split."""
    device = layer.weight.device
    gen = torch.Generator(device=device).manual_seed(tensor_seed(seed, index))
    ab = torch.randn(layer.d_out + layer.d_in, rank, generator=gen, device=device, dtype=torch.float32)
    return ab[:layer.d_out], ab[layer.d_out:]


class Population:
    """The factors of some population members, ready to be added to a batched forward pass.

    ``seeds[k]`` and ``signs[k]`` describe the k-th member of a call; rows of the call are
    member-major, ``rows_per_member`` each. Factors are drawn in fp32 (the ones the update adds to
    the fp32 masters), with the sign and ``sigma / sqrt(R)`` folded into A:

        B[i]  (members, d_in, R)       At[i]  (members, R, d_out)

    The member's term ``s sigma (x B) A^T`` is added to the layer's output, never folded into a
    weight: in a bf16 model it is computed from bf16 copies of the factors (``in_dtype``) with fp32
    accumulation and added in the output's own rounding (``out + xb * A`` rounded once), so it
    keeps its size to bf16's relative precision (~0.4%), where a bf16 weight plus a perturbation of
    a few % of it would round most of the perturbation away (``benchmarks.speed.perturbation_cast``).
    Same-dtype products: mixed fp32/bf16 element-wise kernels ran 25x slower on CPU."""

    def __init__(self, layers: Sequence[Layer], seeds: Sequence[int], signs: Sequence[float], sigma: float,
                 rank: int):
        self.layers, self.members = list(layers), len(seeds)
        scale = sigma / math.sqrt(rank)
        self.B: list[torch.Tensor] = []
        self.At: list[torch.Tensor] = []
        for i, layer in enumerate(self.layers):
            drawn = {s: factors(layer, i, s, rank) for s in dict.fromkeys(seeds)}  # mirrored pairs: once
            self.B.append(torch.stack([drawn[s][1] for s in seeds]))
            self.At.append(torch.stack([(sign * scale) * drawn[s][0].T for s, sign in zip(seeds, signs)]))
        self._cast: dict[torch.dtype, tuple[list[torch.Tensor], list[torch.Tensor]]] = {torch.float32: (self.B, self.At)}

    def in_dtype(self, dtype: torch.dtype) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """(B, At) in ``dtype``, the dtype the model computes in (cast once, then kept)."""
        if dtype not in self._cast:
            self._cast[dtype] = ([b.to(dtype) for b in self.B], [a.to(dtype) for a in self.At])
        return self._cast[dtype]

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.B + self.At)

    def _hook(self, index: int):
        layer, n = self.layers[index], self.members
        rank = self.B[index].shape[-1]
        # On CPU, bmm with R columns is a poor GEMM shape: for small R, R broadcast multiply-sums
        # are 3-5x faster (measured for SmolLM2's layer shapes at 16 and 160 rows).
        by_columns = self.B[index].device.type == "cpu" and rank <= ELEMENTWISE_MAX_RANK

        def add_noise(module, args, output):
            x = args[0]
            if x.numel() % (n * layer.d_in):
                raise RuntimeError(f"low-rank noise: layer {layer.name} got input {tuple(x.shape)}, not "
                                   f"{n} members x equal rows (rows must be member-major, same count each)")
            Bs, Ats = self.in_dtype(output.dtype)  # the output's dtype: the weights' or autocast's
            B, At = Bs[index], Ats[index]
            xs = x.reshape(n, -1, layer.d_in).to(B.dtype)  # (n, rows*T, d_in)
            out = output.view(n, -1, layer.d_out)
            in_place = not output.requires_grad  # no output-sized temporary
            if by_columns:
                for r in range(rank):
                    xb = (xs * B[:, None, :, r]).sum(-1, keepdim=True)  # (n, rows*T, 1)
                    if in_place:
                        out.addcmul_(xb, At[:, r:r + 1])
                    else:
                        out = out + xb * At[:, r:r + 1]
                return output if in_place else out.view_as(output)
            xb = torch.bmm(xs, B)  # (n, rows*T, R)
            if not in_place:
                return (out + torch.bmm(xb, At)).view_as(output)
            out.baddbmm_(xb, At)
            return output

        return add_noise

    @contextlib.contextmanager
    def applied(self) -> Iterator[None]:
        """Within the block, the model computes every member's perturbed output on its own rows."""
        handles = [layer.module.register_forward_hook(self._hook(i)) for i, layer in enumerate(self.layers)]
        try:
            yield
        finally:
            for h in handles:
                h.remove()


@torch.no_grad()
def apply_lowrank_update(params: Params, layers: Sequence[Layer], seeds: Sequence[int], coefficients: Sequence[float],
                 rank: int) -> None:
    """theta_W += sum_n coefficients[n] * A_n B_n^T / sqrt(R) for every layer: one fp32 product of
    the stacked, coefficient-scaled factors per layer, added once (through ``params``, which
    keeps fp32 master copies of low-precision weights)."""
    pairs = [(s, c) for s, c in zip(seeds, coefficients) if c != 0.0]
    if not pairs:
        return
    for i, layer in enumerate(layers):
        drawn = [factors(layer, i, s, rank) for s, _ in pairs]
        coef = torch.tensor([c for _, c in pairs], dtype=torch.float32, device=layer.weight.device)
        a = torch.cat([(c * fa) for c, (fa, _) in zip(coef, drawn)], dim=1)  # (d_out, n*R)
        b = torch.cat([fb for _, fb in drawn], dim=1)  # (d_in, n*R)
        delta = (a @ b.T) / math.sqrt(rank)
        params.add_(i, delta.T if layer.transposed else delta)


def explicit_perturbation(layer: Layer, index: int, seed: int, rank: int) -> torch.Tensor:
    """E = A B^T / sqrt(R) as a dense fp32 matrix, shaped like the weight (tests and checks only)."""
    a, b = factors(layer, index, seed, rank)
    e = a @ b.T / math.sqrt(rank)
    return e.T if layer.transposed else e
