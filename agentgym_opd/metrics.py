"""Pure metric functions shared by environments and evaluation: means with standard errors, pass@k.

pass@k uses the unbiased estimator of Chen et al. (2021): with n samples of which c are correct,
pass@k = 1 - C(n-c, k) / C(n, k), computed as 1 - prod_{i=n-c+1..n} (1 - k/i) to stay stable for large n.
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence


def mean_stderr(values: Sequence[float]) -> tuple[float, float]:
    """Sample mean and its standard error (sample std / sqrt(n)); stderr 0 for fewer than two values."""
    n = len(values)
    if n == 0:
        raise ValueError("mean_stderr of no values")
    mean = sum(values) / n
    if n < 2:
        return float(mean), 0.0
    var = sum((v - mean) ** 2 for v in values) / (n - 1)
    return float(mean), math.sqrt(var / n)


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k for one problem with n samples, c of them correct."""
    if not (0 <= c <= n) or k < 1:
        raise ValueError(f"pass_at_k needs 0 <= c <= n and k >= 1, got n={n}, c={c}, k={k}")
    if k > n:
        raise ValueError(f"pass@{k} needs at least {k} samples per problem, got n={n}")
    if n - c < k:
        return 1.0
    prod = 1.0
    for i in range(n - c + 1, n + 1):
        prod *= 1.0 - k / i
    return 1.0 - prod


def mean_pass_at_k(outcomes: Mapping[str, Sequence[bool]], ks: Sequence[int] = (1,)) -> dict[str, float]:
    """{"pass@k": mean over problems} for each k that every problem has enough samples for."""
    if not outcomes:
        raise ValueError("no problems to aggregate")
    fewest = min(len(samples) for samples in outcomes.values())
    return {
        f"pass@{k}": sum(pass_at_k(len(v), sum(v), k) for v in outcomes.values()) / len(outcomes)
        for k in ks
        if k <= fewest
    }
