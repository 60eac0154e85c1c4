"""The bench's statistics: a 95% interval for every success cell and paired differences between methods.

Why these intervals. A bench cell pools the greedy evaluation episodes of all its seeds (each seed
evaluates its own held-out tasks), so its success rate is a proportion over n episodes: the Wilson score
interval is the standard 95% interval for that, and unlike the normal approximation it stays inside
[0, 1] and does not collapse to zero width at 0 or 1. It measures the evaluation's sampling noise; the
spread between training seeds is reported beside it (the leaderboard's standard error across seeds).

Why paired. Two methods evaluated on the same tasks under the same seeds differ by much less noise than
their two intervals suggest, because the task's difficulty is shared: the difference is estimated from
the per-(seed, task) differences.

Why exact for success. With 0/1 outcomes only the discordant pairs carry information: of the m pairs where
the two methods differ, b are won by the first. The difference is (2b - m) / n, and given m, b is
binomial(m, pi) with pi = 1/2 when the methods are equal. Its Clopper-Pearson interval for pi, mapped to the
difference, is the interval reported, and it excludes 0 exactly when the exact McNemar test rejects at 5%.
A normal interval on the mean of the differences is far too narrow when m is small: two methods that differ
on 4 of 300 episodes, all one way, get -0.013 +- 0.013 "significant", where the exact test gives p = 0.125.
When no pair differs the interval is +- the exact upper bound of the discordant share (0 of n), not a
zero-width one. Non-binary outcomes (a score) keep the normal interval on the mean difference.
"""

from __future__ import annotations

import math
from typing import Callable, Iterable, Mapping

Z95 = 1.959963984540054


def wilson_interval(successes: float, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval of a proportion; (0, 1) when there are no trials."""
    if n <= 0:
        return 0.0, 1.0
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    low = 0.0 if successes <= 0 else max(0.0, centre - half)  # exact at the ends (no rounding residue)
    high = 1.0 if successes >= n else min(1.0, centre + half)
    return low, high


def proportion_cell(outcomes: Iterable[float]) -> dict[str, float]:
    """Mean success of pooled episodes with its Wilson 95% interval and the interval's half-width."""
    values = [float(v) for v in outcomes]
    n = len(values)
    mean = sum(values) / n if n else math.nan
    low, high = wilson_interval(sum(values), n)
    return {"mean": mean, "low": low, "high": high, "half_width": (high - low) / 2, "n": n}


def binomial_cdf(k: int, m: int, p: float) -> float:
    """P(X <= k) for X ~ binomial(m, p), summed in log space (no overflow for large m)."""
    if k < 0:
        return 0.0
    if k >= m:
        return 1.0
    if p <= 0.0:
        return 1.0
    if p >= 1.0:
        return 0.0
    log_p, log_q = math.log(p), math.log1p(-p)
    terms = [math.lgamma(m + 1) - math.lgamma(i + 1) - math.lgamma(m - i + 1) + i * log_p + (m - i) * log_q
             for i in range(k + 1)]
    top = max(terms)
    return min(1.0, math.exp(top) * sum(math.exp(t - top) for t in terms))


def clopper_pearson(successes: int, m: int, alpha: float = 0.05) -> tuple[float, float]:
    """Exact (Clopper-Pearson) interval of a binomial proportion, by bisection on the binomial tails."""
    def solve(tail: Callable[[float], float]) -> float:  # tail(p) rises with p; the p where it reaches alpha / 2
        low, high = 0.0, 1.0
        for _ in range(60):
            mid = (low + high) / 2
            low, high = (mid, high) if tail(mid) < alpha / 2 else (low, mid)
        return (low + high) / 2

    lower = 0.0 if successes <= 0 else solve(lambda p: 1.0 - binomial_cdf(successes - 1, m, p))
    upper = 1.0 if successes >= m else 1.0 - solve(lambda q: binomial_cdf(successes, m, 1.0 - q))
    return lower, upper


def mcnemar_exact_p(wins: int, losses: int) -> float:
    """Two-sided exact McNemar p-value: the discordant pairs split as binomial(m, 1/2) under no difference."""
    m = wins + losses
    if m == 0:
        return 1.0
    return min(1.0, 2.0 * binomial_cdf(min(wins, losses), m, 0.5))


def paired_difference(a: Mapping[tuple, float], b: Mapping[tuple, float], z: float = Z95) -> dict[str, float] | None:
    """Mean of a - b over the keys both have ((seed, task) pairs) with a 95% interval; None if < 2 pairs.

    0/1 outcomes: the exact interval from the discordant pairs (module docstring) and McNemar's exact p;
    other outcomes: a normal interval on the mean difference. ``significant``: the interval excludes 0.
    """
    keys = sorted(set(a) & set(b))
    n = len(keys)
    if n < 2:
        return None
    diffs = [float(a[k]) - float(b[k]) for k in keys]
    mean = sum(diffs) / n
    if all(float(a[k]) in (0.0, 1.0) and float(b[k]) in (0.0, 1.0) for k in keys):
        wins, losses = diffs.count(1.0), diffs.count(-1.0)
        m = wins + losses
        alpha = math.erfc(z / math.sqrt(2))  # the two-sided level that z stands for (0.05 at Z95)
        if m:
            pi_low, pi_high = clopper_pearson(wins, m, alpha)
            low, high = m * (2 * pi_low - 1) / n, m * (2 * pi_high - 1) / n
        else:  # no pair differs: |difference| <= the discordant share, whose exact upper bound at 0 of n is this
            high = clopper_pearson(0, n, alpha)[1]
            low = -high
        p_value = mcnemar_exact_p(wins, losses)
        return {"mean": mean, "low": low, "high": high, "half_width": (high - low) / 2, "n": n,
                "discordant": m, "p_value": p_value, "significant": bool(low > 0 or high < 0),
                "method": "exact McNemar"}
    var = sum((d - mean) ** 2 for d in diffs) / (n - 1)
    half = z * math.sqrt(var / n)
    return {"mean": mean, "low": mean - half, "high": mean + half, "half_width": half, "n": n,
            "significant": bool(mean - half > 0 or mean + half < 0), "method": "normal"}


def format_cell(cell: Mapping[str, float]) -> str:
    return f"{cell['mean']:.3f} [{cell['low']:.2f},{cell['high']:.2f}]"


def format_difference(diff: Mapping[str, float] | None) -> str:
    if diff is None:
        return "-"
    star = "*" if diff["significant"] else ""
    return f"{diff['mean']:+.3f} [{diff['low']:+.3f},{diff['high']:+.3f}]{star}"
