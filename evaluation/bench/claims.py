"""The papers' headline claims (``../shared/METHODS.md``) checked against one bench run, with a plain verdict.

Each claim is a comparison the bench can make on its held-out split: a method against a baseline on
success (paired over the same seeds and tasks, `evaluation.bench.stats.paired_difference`), on turns, or
at a fraction of the baseline's rollout budget (the training curves). The verdict reads the 95% interval
of the difference against zero and against the gain the paper reports:

* ``reproduced``: the interval lies above zero (the method is better, as claimed);
* ``not reproduced``: the interval lies below zero (the baseline is better), or it lies below the paper's
  reported gain while still containing zero (a gain as large as the paper's is ruled out);
* ``inconclusive at this power``: the interval contains both zero and the paper's gain.

The papers' numbers come from other benchmarks and far larger models; what transfers is the direction and
whether an effect of that size would be visible here, which is all the verdict claims.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from evaluation.bench.stats import Z95

HELD_OUT = "household/valid_unseen"


@dataclass(frozen=True)
class Claim:
    """One headline claim: ``method`` beats ``baseline`` on ``measure``, by ``paper_gain`` in the paper."""

    text: str
    method: str
    baseline: str
    measure: str  # "success" (paired), "turns" (fewer is better) or "success_at_budget_fraction"
    paper_gain: float | None  # the paper's reported gain as a fraction (None: the paper gives no number)
    source: str
    budget_fraction: float = 1.0


CLAIMS: tuple[Claim, ...] = (
    Claim("SAGE-OPD beats OPD on unseen success", "sage_opd", "opd", "success", 0.0821,
          "SAGE-OPD, ALFWorld unseen 61.94% -> 70.15%"),
    Claim("SAGE-OPD solves unseen tasks in fewer turns than OPD", "sage_opd", "opd", "turns", None,
          "SAGE-OPD (turn-level selection)"),
    Claim("LOPD beats GRPO with under 30% of GRPO's rollouts", "lopd", "grpo", "success_at_budget_fraction", None,
          "LOPD, EnvScaler / ACEBench", budget_fraction=0.3),
    Claim("VPD beats SDPO", "vpd", "sdpo", "success", 0.0229, "VPD, LiveCodeBench 47.33% -> 49.62%"),
    Claim("VPD beats GRPO", "vpd", "grpo", "success", 0.0401, "VPD, LiveCodeBench 45.61% -> 49.62%"),
    Claim("OPD beats SFT at an equal rollout budget", "opd", "sft", "success", None,
          "on-policy distillation vs off-policy SFT"),
)


def verdict(low: float, high: float, paper_gain: float | None) -> str:
    """The plain-words reading of a 95% interval of (method - baseline), higher = better for the method."""
    if low > 0:
        return "reproduced"
    if high < 0:
        return "not reproduced"
    if paper_gain is not None and paper_gain > 0 and high < paper_gain:
        return "not reproduced"
    return "inconclusive at this power"


def _paired(summary: Mapping[str, Any], claim: Claim, env_id: str) -> dict[str, Any] | None:
    for row in summary.get("paired", []):
        if row["env_id"] == env_id and row["algorithm"] == claim.method and row["baseline"] == claim.baseline:
            return {"diff": row["mean"], "low": row["low"], "high": row["high"], "n": row["n"]}
    return None


def _row_metric(summary: Mapping[str, Any], algorithm: str, env_id: str, metric: str) -> tuple[float, float, int] | None:
    for row in summary.get("rows", []):
        if row["algorithm"] == algorithm and row["env_id"] == env_id and metric in row["metrics"]:
            m = row["metrics"][metric]
            return float(m["mean"]), float(m["stderr"]), len(row["seeds"])
    return None


def _independent(a: tuple[float, float, int] | None, b: tuple[float, float, int] | None,
                 sign: float) -> dict[str, Any] | None:
    """sign * (a - b) with a normal 95% interval from the two seed standard errors; None if either is missing."""
    if a is None or b is None or min(a[2], b[2]) < 2:
        return None
    diff = sign * (a[0] - b[0])
    half = Z95 * math.sqrt(a[1] ** 2 + b[1] ** 2)
    return {"diff": diff, "low": diff - half, "high": diff + half, "n": min(a[2], b[2])}


def curve_success(records: Sequence[Mapping[str, Any]], algorithm: str, max_rollouts: float | None
                  ) -> tuple[float, float, int] | None:
    """Mean over seeds of an algorithm's curve point at the last rollout count <= max_rollouts (None: the end),
    with its standard error across seeds."""
    values = []
    for record in records:
        if record.get("algorithm") != algorithm or not record.get("curve"):
            continue
        points = [p for p in record["curve"] if max_rollouts is None or p["rollouts"] <= max_rollouts]
        if points:
            values.append(float(points[-1]["success_rate"]))
    if len(values) < 2:
        return None
    mean = sum(values) / len(values)
    stderr = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1) / len(values))
    return mean, stderr, len(values)


def check_claims(summary: Mapping[str, Any], records: Sequence[Mapping[str, Any]] = (),
                 env_id: str = HELD_OUT) -> list[dict[str, Any]]:
    """One row per claim: the measured difference with its interval and the verdict (``missing`` when the
    bench did not run both methods)."""
    rows = []
    for claim in CLAIMS:
        one_seed = False
        if claim.measure == "success":
            got = _paired(summary, claim, env_id)
        elif claim.measure == "turns":  # fewer turns is the claim: method - baseline is reported as baseline - method
            pair = (_row_metric(summary, claim.method, env_id, "mean_turns"),
                    _row_metric(summary, claim.baseline, env_id, "mean_turns"))
            got = _independent(*pair, sign=-1.0)
            one_seed = got is None and None not in pair
        else:
            budget = _budget(summary.get("settings") or {}) or _budget_of(records)
            early = curve_success(records, claim.method, claim.budget_fraction * budget if budget else None)
            got = _independent(early, curve_success(records, claim.baseline, None), sign=1.0)
        row = {"claim": claim.text, "source": claim.source, "method": claim.method, "baseline": claim.baseline,
               "measure": claim.measure, "paper_gain": claim.paper_gain}
        untested = judge_not_tested(records) if "sage_opd" in (claim.method, claim.baseline) else None
        if untested:
            row["judge"] = untested
        if got is None and one_seed:  # both ran; the interval is across seeds
            rows.append({**row, "verdict": "needs 2+ seeds"})
        elif got is None:
            rows.append({**row, "verdict": "missing"})
        else:
            said = verdict(got["low"], got["high"], claim.paper_gain)
            rows.append({**row, **got, "verdict": f"{said}; judge not tested" if untested else said})
    return rows


def judge_not_tested(records: Sequence[Mapping[str, Any]]) -> str | None:
    """Why SAGE-OPD's rows do not test its judge, or None (`evaluation.judge_diagnostics.judge_untested` on its runs)."""
    from evaluation.judge_diagnostics import judge_untested

    return judge_untested(r.get("training") or {} for r in records if r.get("algorithm") == "sage_opd")


def _budget(settings: Mapping[str, Any]) -> int | None:
    """The bench's rollout budget per run (steps x episodes per step) from its settings."""
    if settings.get("steps") and settings.get("episodes_per_step"):
        return int(settings["steps"]) * int(settings["episodes_per_step"])
    return None


def _budget_of(records: Sequence[Mapping[str, Any]]) -> int | None:
    for record in records:
        episodes = (record.get("budget") or {}).get("rollout_episodes")
        if episodes:
            return int(episodes)
    return None


def format_claims(rows: Sequence[Mapping[str, Any]]) -> str:
    """The README table: claim, paper, measured difference [95% interval], verdict."""
    lines = ["| claim | paper | measured here (method - baseline) [95% interval] | verdict |", "|---|---|---|---|"]
    for row in rows:
        if row["verdict"] == "missing":
            measured = "not run"
        elif row["verdict"] == "needs 2+ seeds":
            measured = "one seed per method: no interval"
        else:
            unit = " turns" if row["measure"] == "turns" else ""
            measured = f"{row['diff']:+.3f}{unit} [{row['low']:+.3f}, {row['high']:+.3f}] (n={row['n']})"
        paper = row["source"] + (f" (+{row['paper_gain']:.3f})" if row["paper_gain"] else "")
        verdict_text = row["verdict"]
        if row.get("judge"):  # the reason once: "not reproduced; judge not tested: 100% of ..." (not the words twice)
            reason = row["judge"].removeprefix("judge not tested: ")
            verdict_text = f"{verdict_text.removesuffix('; judge not tested')}; judge not tested: {reason}"
        lines.append(f"| {row['claim']} | {paper} | {measured} | {verdict_text} |")
    return "\n".join(lines)
