"""The bench's intervals and paired differences (pure functions, exact numbers)."""

from __future__ import annotations

import math

from evaluation.bench.stats import (binomial_cdf, clopper_pearson, format_difference, mcnemar_exact_p, paired_difference,
                                    proportion_cell, wilson_interval)


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
    same = paired_difference(b, b)  # no pair differs: an honest width, not zero
    assert same["mean"] == 0.0 and not same["significant"]
    assert math.isclose(same["high"], 1 - 0.025 ** (1 / 60), abs_tol=1e-6) and same["low"] == -same["high"]
    assert paired_difference({(0, "x"): 1.0}, {(0, "x"): 0.0}) is None  # one pair: no interval
    assert format_difference(diff).endswith("*") and format_difference(None) == "-"


def test_clopper_pearson_matches_the_textbook_values():
    low, high = clopper_pearson(3, 10)  # R: binom.test(3, 10)$conf.int
    assert math.isclose(low, 0.06673951, abs_tol=1e-6) and math.isclose(high, 0.65245285, abs_tol=1e-6)
    assert clopper_pearson(0, 4)[0] == 0.0 and math.isclose(clopper_pearson(0, 4)[1], 0.6023646, abs_tol=1e-6)
    assert math.isclose(mcnemar_exact_p(0, 4), 0.125) and mcnemar_exact_p(0, 0) == 1.0
    assert math.isclose(binomial_cdf(150, 300, 0.5), 0.5230, abs_tol=1e-4)  # large m: no overflow


def test_a_few_one_way_discordant_pairs_are_not_significant():
    """The LOPD case of the bench: 4 of 300 episodes lost, none won. A normal interval on the mean of the
    differences (-0.013 +- 0.013) called it significant; the exact test does not (p = 0.125)."""
    keys = [(s, f"t{i}") for s in range(3) for i in range(100)]
    base = {k: float(i % 3 == 0) for i, k in enumerate(keys)}
    worse = dict(base)
    for k in [k for k in keys if base[k] == 1.0][:4]:
        worse[k] = 0.0
    diff = paired_difference(worse, base)
    assert diff["discordant"] == 4 and math.isclose(diff["mean"], -4 / 300)
    assert math.isclose(diff["p_value"], 0.125) and not diff["significant"]
    assert diff["low"] < 0 < diff["high"] and diff["high"] < 0.01  # one-way: almost all the interval below 0
    clear = dict(base)
    for k in [k for k in keys if base[k] == 1.0][:20]:
        clear[k] = 0.0
    assert paired_difference(clear, base)["significant"] and paired_difference(clear, base)["p_value"] < 1e-5


def test_scores_keep_the_normal_interval():
    a = {(0, f"t{i}"): 0.5 + 0.01 * i for i in range(30)}
    b = {(0, f"t{i}"): 0.5 for i in range(30)}
    diff = paired_difference(a, b)
    assert diff["method"] == "normal" and math.isclose(diff["high"] - diff["mean"], diff["mean"] - diff["low"])
