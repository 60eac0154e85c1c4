"""Shared metrics against direct computation."""

from __future__ import annotations

import math
from itertools import combinations

import pytest

from agentgym_opd.metrics import mean_stderr, pass_at_k


@pytest.mark.parametrize("n, c, k", [(5, 0, 1), (5, 2, 1), (5, 2, 2), (6, 3, 3), (4, 4, 2), (10, 1, 5)])
def test_pass_at_k_matches_the_combinatorial_definition(n, c, k):
    samples = [1] * c + [0] * (n - c)
    subsets = list(combinations(range(n), k))
    direct = sum(any(samples[i] for i in s) for s in subsets) / len(subsets)
    assert pass_at_k(n, c, k) == pytest.approx(direct)
    assert pass_at_k(n, c, k) == pytest.approx(1 - math.comb(n - c, k) / math.comb(n, k))


def test_pass_at_k_rejects_impossible_counts():
    with pytest.raises(ValueError, match="at least 3 samples"):
        pass_at_k(2, 1, 3)
    with pytest.raises(ValueError, match="0 <= c <= n"):
        pass_at_k(2, 3, 1)


def test_mean_stderr():
    mean, se = mean_stderr([1.0, 0.0, 1.0, 0.0])
    assert mean == 0.5 and se == pytest.approx(math.sqrt((4 * 0.25 / 3) / 4))
    assert mean_stderr([0.3]) == (0.3, 0.0)
