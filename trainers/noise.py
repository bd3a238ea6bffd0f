"""Gaussian parameter noise from seeds: perturb in place, restore exactly, apply the ES update.

Nothing model-sized is ever allocated: noise is regenerated tensor by tensor from
``(member seed, tensor index)``, so a seed alone stands for a full-size perturbation.

Exact restore. ``(w + s*e) - s*e`` is not ``w`` in floating point: about 3% of fp32 weights end
one rounding step off (the reference code accumulates such drift every cycle). ``perturb``
therefore records, for the few elements whose restore would be off, their original values
(a sparse patch, a few % of the tensor), and ``restore`` writes them back: bit-identical weights
after any number of cycles.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

Params = Sequence[tuple[str, torch.Tensor]]

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
def perturb(params: Params, seed: int, sigma: float, sign: float = 1.0, shared: bool = False) -> list[Patch]:
    """theta += sign * sigma * eps(seed), in place; returns what ``restore`` needs."""
    patches = []
    for index, (_, p) in enumerate(params):
        eps = noise(p, seed, index, shared)
        moved = _shifted(p, eps, sign * sigma)
        # what restore will compute, written over eps (fp32) to spare a tensor-sized buffer
        back = _shifted(moved, eps, -sign * sigma, out=eps if p.dtype == torch.float32 else None)
        off = torch.ne(back, p).view(-1).nonzero().squeeze(1)
        patches.append(Patch(off, p.view(-1)[off].clone()))
        p.copy_(moved)
        del eps, moved, back
    return patches


@torch.no_grad()
def restore(params: Params, seed: int, sigma: float, patches: list[Patch], sign: float = 1.0,
            shared: bool = False) -> None:
    """Undo ``perturb`` exactly (bit for bit)."""
    for index, ((_, p), patch) in enumerate(zip(params, patches)):
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

    The sum is accumulated in an fp32 buffer of one tensor's size and added once, so small
    updates are not lost to rounding seed by seed."""
    for index, (_, p) in enumerate(params):
        total = torch.zeros(p.shape, dtype=torch.float32, device=p.device)
        for seed, coef in zip(seeds, coefficients):
            if coef != 0.0:
                total.add_(noise(p, seed, index, shared), alpha=float(coef))
        p.copy_((p.float() + total).to(p.dtype))
        del total
