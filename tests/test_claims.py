"""The papers'-claims table: verdict rules and the comparisons it reads from a bench summary."""

import pytest

from evaluation.bench.claims import CLAIMS, check_claims, curve_success, format_claims, verdict

ENV = "household/valid_unseen"


@pytest.mark.parametrize("low, high, gain, expected", [
    (0.01, 0.2, 0.08, "reproduced"),
    (-0.2, -0.01, 0.08, "not reproduced"),
    (-0.03, 0.05, 0.08, "not reproduced"),          # contains 0 but rules out the paper's +0.08
    (-0.03, 0.12, 0.08, "inconclusive at this power"),
    (-0.03, 0.05, None, "inconclusive at this power"),  # no paper number to rule out
])
def test_verdict_reads_the_interval_against_zero_and_the_papers_gain(low, high, gain, expected):
    assert verdict(low, high, gain) == expected


def _summary():
    paired = [{"env_id": ENV, "algorithm": "sage_opd", "baseline": "opd", "mean": 0.1, "low": 0.04, "high": 0.16, "n": 300},
              {"env_id": ENV, "algorithm": "vpd", "baseline": "sdpo", "mean": -0.1, "low": -0.15, "high": -0.05, "n": 300},
              {"env_id": "household/valid_seen", "algorithm": "vpd", "baseline": "grpo", "mean": 0.3, "low": 0.2,
               "high": 0.4, "n": 300}]
    rows = [{"algorithm": a, "env_id": ENV, "seeds": [0, 1, 2], "metrics": {"mean_turns": {"mean": t, "stderr": 0.5}}}
            for a, t in (("sage_opd", 12.0), ("opd", 15.0))]
    return {"settings": {"steps": 10, "episodes_per_step": 10}, "paired": paired, "rows": rows}


def _records():
    curve = {"lopd": [[0.1, 0.5, 0.6], [0.1, 0.55, 0.6], [0.1, 0.45, 0.6]], "grpo": [[0.1, 0.2, 0.3], [0.1, 0.2, 0.32],
                                                                                   [0.1, 0.2, 0.28]]}
    return [{"algorithm": a, "curve": [{"rollouts": r, "success_rate": v} for r, v in zip((0, 30, 100), points)]}
            for a, runs in curve.items() for points in runs]


def test_check_claims_reads_paired_turns_and_curves():
    rows = {r["claim"]: r for r in check_claims(_summary(), _records(), env_id=ENV)}
    assert len(rows) == len(CLAIMS)
    sage = rows["SAGE-OPD beats OPD on unseen success"]
    assert (sage["diff"], sage["verdict"]) == (0.1, "reproduced")
    assert rows["VPD beats SDPO"]["verdict"] == "not reproduced"
    assert rows["VPD beats GRPO"]["verdict"] == "missing"  # only a valid_seen pair exists: never read for unseen
    turns = rows["SAGE-OPD solves unseen tasks in fewer turns than OPD"]
    assert turns["diff"] == pytest.approx(3.0) and turns["verdict"] == "reproduced"
    lopd = rows["LOPD beats GRPO with under 30% of GRPO's rollouts"]
    assert lopd["diff"] == pytest.approx(0.5 - 0.3)  # LOPD at 30 of 100 rollouts vs GRPO's end point
    assert lopd["verdict"] == "reproduced"
    table = format_claims(list(rows.values()))
    assert table.count("\n") == len(CLAIMS) + 1 and "not run" in table


def test_curve_success_needs_two_seeds():
    assert curve_success(_records()[:1], "lopd", None) is None
    mean, stderr, n = curve_success(_records(), "grpo", None)
    assert (round(mean, 6), n) == (0.3, 3) and stderr > 0
