"""Unbiased pass@k (Chen et al., 2021, "Evaluating Large Language Models Trained on Code") and
pass^k (Yao et al., 2024, "tau-bench": all of k attempts correct, which tells a reliable model
from a lucky one).

With ``n`` samples of which ``c`` are correct, the probability that at least one of ``k`` samples
drawn without replacement is correct is ``1 - C(n - c, k) / C(n, k)``, and that all ``k`` are is
``C(c, k) / C(n, k)``; averaged over problems each is an unbiased estimate (of pass@k, of pass^k).
Both are computed as products to stay exact for large ``n``. pass@1 = pass^1 = the correct rate.
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one problem with ``c`` correct out of ``n`` samples (``1 <= k <= n``)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"need 0 <= c <= n and 1 <= k <= n; got n={n}, c={c}, k={k}")
    if n - c < k:  # every k-subset holds a correct sample
        return 1.0
    # C(n-c, k) / C(n, k) = prod_{i=n-c+1}^{n} (1 - k / i)
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def pass_hat_k(n: int, c: int, k: int) -> float:
    """Unbiased pass^k of one problem with ``c`` correct out of ``n`` samples (``1 <= k <= n``): the
    probability that ``k`` samples drawn without replacement are all correct."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"need 0 <= c <= n and 1 <= k <= n; got n={n}, c={c}, k={k}")
    # C(c, k) / C(n, k) = prod_{i=0}^{k-1} (c - i) / (n - i): 0 as soon as c < k
    return math.prod((c - i) / (n - i) for i in range(k)) if c >= k else 0.0


def _mean_over_problems(estimate, correct: Sequence[Sequence[bool]], ks: Sequence[int] | None) -> dict[int, float]:
    if not correct:
        return {}
    sizes = {len(c) for c in correct}
    if len(sizes) != 1 or 0 in sizes:
        raise ValueError(f"every problem needs the same, non-zero number of samples; got sizes {sorted(sizes)}")
    n = sizes.pop()
    ks = list(range(1, n + 1)) if ks is None else list(ks)
    return {k: sum(estimate(n, sum(map(bool, c)), k) for c in correct) / len(correct) for k in ks}


def pass_at_ks(correct: Sequence[Sequence[bool]], ks: Sequence[int] | None = None) -> dict[int, float]:
    """Mean pass@k over problems, for each k in ``ks`` (default 1..n), from per-problem verdicts.

    Every problem must have the same number of samples ``n``.
    """
    return _mean_over_problems(pass_at_k, correct, ks)


def pass_hat_ks(correct: Sequence[Sequence[bool]], ks: Sequence[int] | None = None) -> dict[int, float]:
    """Mean pass^k over problems, for each k in ``ks`` (default 1..n), as ``pass_at_ks``."""
    return _mean_over_problems(pass_hat_k, correct, ks)


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (ddof=1: over 2-4 seeds the population std understates it
    by 13-29%); std 0.0 for fewer than two values, mean 0.0 for none."""
    if not values:
        return 0.0, 0.0
    mean = sum(values) / len(values)
    if len(values) < 2:
        return mean, 0.0
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))
