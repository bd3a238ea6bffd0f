"""Perturb / restore / update: exactness and the paper's formula, on small tensors."""

import numpy as np
import pytest
import torch

from trainers import noise


def make_params(dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    shapes = {"a.weight": (64, 32), "b.weight": (64, 32), "c.bias": (64,), "tiny": (3, 1)}
    # a mix of scales, values near zero and exact powers of two: the hard cases for rounding
    params = [(n, (torch.randn(s, generator=g) * 0.05).to(dtype)) for n, s in shapes.items()]
    params[2][1][:8] = torch.tensor([0.0, 1e-8, -1e-8, 2.0**-10, 0.5, -0.25, 1e-4, -3e-4]).to(dtype)
    return params


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_restore_is_bit_exact_after_many_cycles(dtype):
    params = make_params(dtype)
    original = [p.clone() for _, p in params]
    inexact = 0
    for cycle in range(200):
        seed = noise.member_seed(1, cycle, 0)
        sigma, sign = [1e-3, 5e-4, 3e-2][cycle % 3], (-1.0) ** cycle
        patches = noise.perturb(params, seed, sigma, sign)
        assert any(not torch.equal(p, o) for (_, p), o in zip(params, original))
        noise.restore(params, seed, sigma, patches, sign)
        inexact += sum(pt.numel for pt in patches)
        for (_, p), o in zip(params, original):
            assert torch.equal(p, o)
    assert inexact > 0  # arithmetic alone would not have restored the weights


def test_update_equals_explicit_formula():
    params = make_params()
    before = [p.clone().double() for _, p in params]
    seeds = [noise.member_seed(0, 1, n) for n in range(5)]
    coefs = [0.3e-3, -1e-3, 0.0, 2e-4, 5e-4]
    noise.apply_update(params, seeds, coefs)
    for i, ((_, p), b) in enumerate(zip(params, before)):
        expected = b + sum(c * noise.noise(p, s, i).double() for s, c in zip(seeds, coefs))
        assert torch.allclose(p.double(), expected, rtol=0, atol=1e-7)


def test_update_through_es_coefficients():
    """theta_new = theta + alpha/N * sum Z_n eps_n with Z the z-scored rewards."""
    from trainers.es import normalise, update_coefficients

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
    from trainers.es import normalise

    assert normalise(np.array([0.5, 0.5, 0.5])) is None
    assert np.allclose(normalise(np.array([3.0, 1.0, 2.0]), rank_shaping=True), [0.5, -0.5, 0.0])


def test_seeds_distinct_and_deterministic():
    seeds = {noise.member_seed(0, it, n) for it in range(300) for n in range(30)}
    assert len(seeds) == 300 * 30
    assert noise.member_seed(5, 3, 2) == noise.member_seed(5, 3, 2)
    assert noise.member_seed(5, 3, 2) != noise.member_seed(6, 3, 2)
    assert all(0 <= s < 2**63 for s in seeds)


def test_noise_independent_per_tensor_unless_shared():
    params = make_params()
    a, b = params[0][1], params[1][1]  # same shape
    assert not torch.equal(noise.noise(a, 42, 0), noise.noise(b, 42, 1))
    assert torch.equal(noise.noise(a, 42, 0, shared=True), noise.noise(b, 42, 1, shared=True))
    assert torch.equal(noise.noise(a, 42, 0), noise.noise(a, 42, 0))
    eps = noise.noise(torch.empty(200_000), 3, 0)
    assert abs(eps.mean()) < 0.01 and abs(eps.std() - 1) < 0.01
