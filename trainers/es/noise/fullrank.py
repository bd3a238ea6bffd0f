"""Gaussian parameter noise from seeds: perturb in place, restore exactly, apply the ES update.

Nothing model-sized is ever allocated: noise is regenerated tensor by tensor from
``(member seed, tensor index)``, so a seed alone stands for a full-size perturbation.

Exact restore. ``(w + s*e) - s*e`` is not ``w`` in floating point: about 3% of fp32 weights end
one rounding step off (the reference code accumulates such drift every cycle). ``perturb``
therefore records, for the few elements whose restore would be off, their original values
(a sparse patch, a few % of the tensor), and ``restore`` writes them back: bit-identical weights
after any number of cycles.

Low-precision weights (bf16 on GPU). A typical ES update (alpha/N * sum Z eps, ~1e-5 per weight
at the paper's settings) is below half a bf16 step of most weights: added to bf16 weights it is
rounded away, and about a third of the weights never move (the reference code's flaw).
``Params`` therefore keeps an fp32 master copy of every bf16/fp16 tensor: updates go to the
master, and the model's tensor is always the master rounded to its dtype. Perturbation writes
``round(master + sigma * eps)`` and restore re-casts the master: exact, with no noise pass.
Cost: 4 bytes per perturbed parameter (a 7B model: +28 GiB next to its 14 GiB of bf16 weights).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

_SEED_BITS = 63


def member_seed(run_seed: int, iteration: int, member: int) -> int:
    """The noise seed of population member ``member`` at ``iteration``.

    A hash of the triple (numpy's SeedSequence), so seeds of one run never repeat in practice
    (2**63 values) and runs with different seeds draw different noise."""
    state = np.random.SeedSequence([run_seed, iteration, member]).generate_state(2, np.uint32)
    return int((int(state[0]) << 32 | int(state[1])) >> (64 - _SEED_BITS))


def tensor_seed(seed: int, index: int, shared: bool = False) -> int:
    """Generator seed for tensor ``index`` under member ``seed``.

    ``shared=True`` reproduces the paper's code: the same seed for every tensor, so tensors of
    one shape get identical noise."""
    if shared:
        return seed
    state = np.random.SeedSequence([seed, index]).generate_state(2, np.uint32)
    return int(state[0]) << 32 | int(state[1])


def noise(param: torch.Tensor, seed: int, index: int, shared: bool = False) -> torch.Tensor:
    """Standard Gaussian noise (fp32) shaped like ``param``, on its device."""
    gen = torch.Generator(device=param.device).manual_seed(tensor_seed(seed, index, shared))
    return torch.randn(param.shape, generator=gen, device=param.device, dtype=torch.float32)


class Params:
    """The tensors ES perturbs and updates, in a fixed order (tensor ``i``'s noise is seeded by
    ``i``), with fp32 master copies of low-precision tensors (``fp32_master``, see above)."""

    def __init__(self, named: Sequence[tuple[str, torch.Tensor]], fp32_master: bool = True):
        self.names = [n for n, _ in named]
        self.tensors = [t for _, t in named]
        self.masters: list[torch.Tensor | None] = [
            t.detach().float().clone() if fp32_master and t.dtype != torch.float32 else None for t in self.tensors]

    def __len__(self) -> int:
        return len(self.tensors)

    def numel(self) -> int:
        return sum(t.numel() for t in self.tensors)

    def values(self, index: int) -> torch.Tensor:
        """The exact current values of tensor ``index`` (its fp32 master when it has one)."""
        master = self.masters[index]
        return self.tensors[index] if master is None else master

    @torch.no_grad()
    def add_(self, index: int, delta: torch.Tensor) -> None:
        """Tensor ``index`` += ``delta`` (fp32), rounded once; into the master when there is one."""
        p, master = self.tensors[index], self.masters[index]
        if master is not None:
            master.add_(delta)
            p.copy_(master)
        elif p.dtype == torch.float32:
            p.add_(delta)
        else:
            p.copy_((p.float() + delta).to(p.dtype))


@dataclass
class Patch:
    """Original values of the elements whose arithmetic restore would be inexact."""

    index: torch.Tensor
    value: torch.Tensor

    @property
    def numel(self) -> int:
        return self.index.numel()


def _shifted(param: torch.Tensor, eps: torch.Tensor, scale: float, out: torch.Tensor | None = None) -> torch.Tensor:
    """param + scale * eps, rounded to param's dtype; the one formula perturb and restore share,
    so the restore check in ``perturb`` predicts ``restore`` bit for bit."""
    if param.dtype == torch.float32:
        return torch.add(param, eps, alpha=scale, out=out)
    return (param.float() + scale * eps).to(param.dtype)


@torch.no_grad()
def perturbed_tensor(params: Params, index: int, seed: int, sigma: float, sign: float = 1.0,
                     shared: bool = False) -> torch.Tensor:
    """A new tensor holding what ``perturb`` writes into tensor ``index``: its master (or itself)
    plus sign * sigma * eps(seed), rounded to its dtype. For engines that hold their own copy of
    the weights."""
    p = params.tensors[index]
    return _shifted(params.values(index), noise(p, seed, index, shared), sign * sigma).to(p.dtype)


@torch.no_grad()
def perturb(params: Params, seed: int, sigma: float, sign: float = 1.0, shared: bool = False) -> list[Patch | None]:
    """theta += sign * sigma * eps(seed), in place; returns what ``restore`` needs."""
    patches: list[Patch | None] = []
    for index, p in enumerate(params.tensors):
        eps = noise(p, seed, index, shared)
        master = params.masters[index]
        if master is not None:  # restore re-casts the master: nothing to record
            p.copy_(torch.add(master, eps, alpha=sign * sigma))
            patches.append(None)
            continue
        moved = _shifted(p, eps, sign * sigma)
        # what restore will compute, written over eps (fp32) to spare a tensor-sized buffer
        back = _shifted(moved, eps, -sign * sigma, out=eps if p.dtype == torch.float32 else None)
        off = torch.ne(back, p).view(-1).nonzero().squeeze(1)
        patches.append(Patch(off, p.view(-1)[off].clone()))
        p.copy_(moved)
        del eps, moved, back
    return patches


@torch.no_grad()
def restore(params: Params, seed: int, sigma: float, patches: list[Patch | None], sign: float = 1.0,
            shared: bool = False) -> None:
    """Undo ``perturb`` exactly (bit for bit)."""
    for index, (p, patch) in enumerate(zip(params.tensors, patches)):
        master = params.masters[index]
        if master is not None:
            p.copy_(master)
            continue
        eps = noise(p, seed, index, shared)
        if p.dtype == torch.float32:
            _shifted(p, eps, -sign * sigma, out=p)  # in place: no tensor-sized temporary
        else:
            p.copy_(_shifted(p, eps, -sign * sigma))
        p.view(-1)[patch.index] = patch.value
        del eps


@torch.no_grad()
def apply_update(params: Params, seeds: Sequence[int], coefficients: Sequence[float], shared: bool = False) -> None:
    """theta += sum_n coefficients[n] * eps(seeds[n]), tensor by tensor.

    The sum is accumulated in an fp32 buffer of one tensor's size and added once (to the fp32
    master when there is one), so small updates are not lost to rounding seed by seed."""
    for index, p in enumerate(params.tensors):
        total = torch.zeros(p.shape, dtype=torch.float32, device=p.device)
        for seed, coef in zip(seeds, coefficients):
            if coef != 0.0:
                total.add_(noise(p, seed, index, shared), alpha=float(coef))
        params.add_(index, total)
        del total
