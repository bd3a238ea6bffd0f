"""Perturb / restore / update: exactness and the paper's formula, on small tensors."""

import numpy as np
import pytest
import torch

from trainers.es.noise import fullrank


def make_params(dtype=torch.float32, seed=0, fp32_master=True) -> fullrank.Params:
    g = torch.Generator().manual_seed(seed)
    shapes = {"a.weight": (64, 32), "b.weight": (64, 32), "c.bias": (64,), "tiny": (3, 1)}
    # a mix of scales, values near zero and exact powers of two: the hard cases for rounding
    named = [(n, (torch.randn(s, generator=g) * 0.05).to(dtype)) for n, s in shapes.items()]
    named[2][1][:8] = torch.tensor([0.0, 1e-8, -1e-8, 2.0**-10, 0.5, -0.25, 1e-4, -3e-4]).to(dtype)
    return fullrank.Params(named, fp32_master)


@pytest.mark.parametrize("fp32_master", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_restore_is_bit_exact_after_many_cycles(dtype, fp32_master):
    params = make_params(dtype, fp32_master=fp32_master)
    original = [p.clone() for p in params.tensors]
    inexact = 0
    for cycle in range(200):
        seed = fullrank.member_seed(1, cycle, 0)
        sigma, sign = [1e-3, 5e-4, 3e-2][cycle % 3], (-1.0) ** cycle
        patches = fullrank.perturb(params, seed, sigma, sign)
        assert any(not torch.equal(p, o) for p, o in zip(params.tensors, original))
        fullrank.restore(params, seed, sigma, patches, sign)
        inexact += sum(pt.numel for pt in patches if pt is not None)
        for p, o in zip(params.tensors, original):
            assert torch.equal(p, o)
    if dtype == torch.float32 or not fp32_master:
        assert inexact > 0  # arithmetic alone would not have restored the weights


def test_update_equals_explicit_formula():
    params = make_params()
    before = [p.clone().double() for p in params.tensors]
    seeds = [fullrank.member_seed(0, 1, n) for n in range(5)]
    coefs = [0.3e-3, -1e-3, 0.0, 2e-4, 5e-4]
    fullrank.apply_update(params, seeds, coefs)
    for i, (p, b) in enumerate(zip(params.tensors, before)):
        expected = b + sum(c * fullrank.noise(p, s, i).double() for s, c in zip(seeds, coefs))
        assert torch.allclose(p.double(), expected, rtol=0, atol=1e-7)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_updates_below_half_a_step_are_not_lost(dtype):
    """Each update is below half a bf16/fp16 step for almost every weight. With the fp32 master
    the low-precision model moves exactly as the fp32 reference does (it is the reference,
    rounded); without it (the reference code's way) the updates are rounded away."""
    start = (0.5 + 0.49 * torch.rand(4096, generator=torch.Generator().manual_seed(0))).to(dtype)  # in [0.5, 1)
    step = float(torch.finfo(dtype).eps) / 2  # the spacing of dtype's values in [0.5, 1)
    reference = fullrank.Params([("w", start.float())])
    kept = fullrank.Params([("w", start.clone())])
    lossy = fullrank.Params([("w", start.clone())], fp32_master=False)
    seeds = [fullrank.member_seed(0, 0, 0), fullrank.member_seed(0, 0, 1)]
    for _ in range(50):  # the same direction every time: the reference drifts by ~10 steps
        for params in (reference, kept, lossy):
            fullrank.apply_update(params, seeds, [0.2 * step, 0.1 * step])
    assert torch.equal(kept.tensors[0], reference.tensors[0].to(dtype)), "the model must be the fp32 reference, rounded"
    assert (kept.tensors[0] != start).float().mean() > 0.9
    assert (lossy.tensors[0] != start).float().mean() < 0.1


def test_update_through_es_coefficients():
    """theta_new = theta + alpha/N * sum Z_n eps_n with Z the z-scored rewards."""
    from trainers.es.train import normalise, update_coefficients

    rewards = np.array([1.0, 0.5, 0.0, 2.0])
    seeds = [11, 12, 13, 14]
    z = normalise(rewards)
    assert np.allclose(z, (rewards - rewards.mean()) / rewards.std())
    s, c = update_coefficients(seeds, [1.0] * 4, z, alpha=0.01)
    assert s == seeds and np.allclose(c, 0.01 / 4 * z)
    # mirrored pairs merge into one coefficient per seed: alpha/N * (Z+ - Z-)
    s, c = update_coefficients([7, 7, 8, 8], [1.0, -1.0, 1.0, -1.0], z, alpha=0.01)
    assert s == [7, 8] and np.allclose(c, [0.01 / 4 * (z[0] - z[1]), 0.01 / 4 * (z[2] - z[3])])


def test_zero_std_guard_and_rank_shaping():
    from trainers.es.train import normalise

    assert normalise(np.array([0.5, 0.5, 0.5])) is None
    assert np.allclose(normalise(np.array([3.0, 1.0, 2.0]), rank_shaping=True), [0.5, -0.5, 0.0])


def test_rank_shaping_ties_share_their_average_rank():
    from trainers.es.train import normalise, update_coefficients

    ranks = normalise(np.array([1.0, 1.0, 0.0, 2.0, 1.0]), rank_shaping=True)
    assert np.allclose(ranks, [0.0, 0.0, -0.5, 0.5, 0.0])
    # a mirrored pair with tied rewards moves nothing, whichever member comes first
    z = normalise(np.array([0.3, 0.3, 0.1, 0.9]), rank_shaping=True)
    _, coefs = update_coefficients([7, 7, 8, 8], [1.0, -1.0, 1.0, -1.0], z, alpha=1.0)
    assert coefs[0] == 0.0 and coefs[1] == -0.25  # (Z(+eps) - Z(-eps)) / N = (-0.5 - 0.5) / 4
    # the stated scale: std sqrt((N + 1) / (12 (N - 1))) of the z-scores' 1
    n = 30
    assert np.isclose(normalise(np.arange(n, dtype=float), rank_shaping=True).std(), np.sqrt((n + 1) / (12 * (n - 1))))


def test_seeds_distinct_and_deterministic():
    seeds = {fullrank.member_seed(0, it, n) for it in range(300) for n in range(30)}
    assert len(seeds) == 300 * 30
    assert fullrank.member_seed(5, 3, 2) == fullrank.member_seed(5, 3, 2)
    assert fullrank.member_seed(5, 3, 2) != fullrank.member_seed(6, 3, 2)
    assert all(0 <= s < 2**63 for s in seeds)


def test_noise_independent_per_tensor_unless_shared():
    params = make_params()
    a, b = params.tensors[0], params.tensors[1]  # same shape
    assert not torch.equal(fullrank.noise(a, 42, 0), fullrank.noise(b, 42, 1))
    assert torch.equal(fullrank.noise(a, 42, 0, shared=True), fullrank.noise(b, 42, 1, shared=True))
    assert torch.equal(fullrank.noise(a, 42, 0), fullrank.noise(a, 42, 0))
    eps = fullrank.noise(torch.empty(200_000), 3, 0)
    assert abs(eps.mean()) < 0.01 and abs(eps.std() - 1) < 0.01
