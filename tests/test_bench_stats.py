"""The bench's intervals and paired differences (pure functions, exact numbers)."""

from __future__ import annotations

import math

from evaluation.bench_stats import format_difference, paired_difference, proportion_cell, wilson_interval


def test_wilson_interval_matches_the_textbook_values():
    low, high = wilson_interval(50, 100)
    assert math.isclose(low, 0.4038, abs_tol=1e-4) and math.isclose(high, 0.5962, abs_tol=1e-4)
    low, high = wilson_interval(0, 300)  # never a zero-width interval at 0
    assert low == 0.0 and 0.0 < high < 0.02
    assert wilson_interval(0, 0) == (0.0, 1.0)


def test_three_seeds_of_a_hundred_episodes_give_a_half_width_under_six_points():
    cell = proportion_cell([1.0] * 150 + [0.0] * 150)  # the worst case, p = 0.5
    assert cell["n"] == 300 and cell["mean"] == 0.5 and cell["half_width"] <= 0.06
    assert proportion_cell([1.0] * 50 + [0.0] * 50)["half_width"] > 0.06  # one seed alone is not enough


def test_paired_difference_uses_only_shared_keys_and_flags_a_clear_gain():
    a = {(0, f"t{i}"): 1.0 for i in range(60)} | {(0, "only_a"): 0.0}
    b = {(0, f"t{i}"): float(i % 3 == 0) for i in range(60)}  # b solves a third of the shared tasks
    diff = paired_difference(a, b)
    assert diff["n"] == 60 and math.isclose(diff["mean"], 40 / 60)
    assert diff["significant"] and diff["low"] > 0
    same = paired_difference(b, b)
    assert same["mean"] == 0.0 and not same["significant"]
    assert paired_difference({(0, "x"): 1.0}, {(0, "x"): 0.0}) is None  # one pair: no interval
    assert format_difference(diff).endswith("*") and format_difference(None) == "-"
