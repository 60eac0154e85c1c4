"""Shared metrics against direct computation."""

from __future__ import annotations

import math
from itertools import combinations

import pytest

from agentgym_opd.metrics import mean_pass_at_k, mean_stderr, pass_at_k


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


def test_pass_at_k_hand_values_and_per_problem_mean():
    assert pass_at_k(5, 2, 2) == pytest.approx(0.7)  # 1 - C(3,2)/C(5,2)
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3)
    assert pass_at_k(2000, 1000, 100) == pytest.approx(1.0)  # stable where C(n, k) overflows floats
    outcomes = {"a": [True, False, True], "b": [False, False, True]}
    # a: 1 - C(1,2)/C(3,2) = 1; b: 1 - C(2,2)/C(3,2) = 2/3
    assert mean_pass_at_k(outcomes, ks=(1, 2, 5)) == pytest.approx({"pass@1": 0.5, "pass@2": 5 / 6})
