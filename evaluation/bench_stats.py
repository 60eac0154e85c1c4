"""The bench's statistics: a 95% interval for every success cell and paired differences between methods.

Why these intervals. A bench cell pools the greedy evaluation episodes of all its seeds (each seed
evaluates its own held-out tasks), so its success rate is a proportion over n episodes: the Wilson score
interval is the standard 95% interval for that, and unlike the normal approximation it stays inside
[0, 1] and does not collapse to zero width at 0 or 1. It measures the evaluation's sampling noise; the
spread between training seeds is reported beside it (the leaderboard's standard error across seeds).

Why paired. Two methods evaluated on the same tasks under the same seeds differ by much less noise than
their two intervals suggest, because the task's difficulty is shared: the difference is estimated from
the per-(seed, task) differences, with a normal interval on their mean (n is ~100 per seed).
"""

from __future__ import annotations

import math
from typing import Iterable, Mapping

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


def paired_difference(a: Mapping[tuple, float], b: Mapping[tuple, float], z: float = Z95) -> dict[str, float] | None:
    """Mean of a - b over the keys both have ((seed, task) pairs), with a normal 95% interval; None if < 2 pairs."""
    keys = sorted(set(a) & set(b))
    n = len(keys)
    if n < 2:
        return None
    diffs = [float(a[k]) - float(b[k]) for k in keys]
    mean = sum(diffs) / n
    var = sum((d - mean) ** 2 for d in diffs) / (n - 1)
    half = z * math.sqrt(var / n)
    return {"mean": mean, "low": mean - half, "high": mean + half, "half_width": half, "n": n,
            "significant": bool(mean - half > 0 or mean + half < 0)}


def format_cell(cell: Mapping[str, float]) -> str:
    return f"{cell['mean']:.3f} [{cell['low']:.2f},{cell['high']:.2f}]"


def format_difference(diff: Mapping[str, float] | None) -> str:
    if diff is None:
        return "-"
    star = "*" if diff["significant"] else ""
    return f"{diff['mean']:+.3f} +-{diff['half_width']:.3f}{star}"
