"""SAGE-OPD's judge as a record states it: the ``training`` diagnostics a run's metrics give about the judge,
and whether a row's runs tested the judge at all.

Why its own place: a SAGE-OPD run whose teacher cannot answer the judge's question (unreadable verdicts, which
default to one label) or answers every turn alike weights turns by execution errors only. The bench's claims
table and the leaderboard's tables both say so (`judge_untested`) instead of presenting that as SAGE-OPD's
result.
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Mapping

DEFAULTED_WARN_SHARE = 0.2


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def training_diagnostics(metrics_lines: list[dict[str, Any]]) -> dict[str, float]:
    """The record's ``training`` field from a run's ``metrics.jsonl`` rows: the mean of each diagnostic the
    rows report. Warns when SAGE-OPD's judge defaulted more than ``DEFAULTED_WARN_SHARE`` of its verdicts
    (its turn weights then say little about the teacher's judgement)."""
    import warnings

    out: dict[str, float] = {}
    values = [float(row["judge_defaulted_share"]) for row in metrics_lines if _is_number(row.get("judge_defaulted_share"))]
    if values:
        out["judge_defaulted_share"] = sum(values) / len(values)
        if out["judge_defaulted_share"] > DEFAULTED_WARN_SHARE:
            warnings.warn(f"the judge defaulted {out['judge_defaulted_share']:.0%} of its verdicts in training "
                          f"(above {DEFAULTED_WARN_SHARE:.0%}): SAGE-OPD's turn labels were mostly the default",
                          stacklevel=2)
    modal = [float(row["judge_modal_label_share"]) for row in metrics_lines
             if _is_number(row.get("judge_modal_label_share")) and float(row.get("turns_judged", 0) or 0) > 0]
    if modal:
        out["judge_modal_label_share"] = sum(modal) / len(modal)
    return out


# a judge whose readable verdicts are (almost) all one label distinguishes nothing (zero-shot SmolLM2 on ALFWorld:
# 42 of 42 readable answers were "Weak", copied from the question's definitions)
ONE_LABEL_SHARE = 0.95


def judge_untested(trainings: Iterable[Mapping[str, Any]]) -> str | None:
    """Why SAGE-OPD runs with these ``training`` diagnostics did not test its judge, or None: their judge
    defaulted more than ``DEFAULTED_WARN_SHARE`` of its verdicts (unreadable answers), or gave (almost) every
    turn one label. Its turn weights were then errors-only weighting, and a table or claim must say so rather
    than present that as SAGE-OPD's result."""
    trainings = [t or {} for t in trainings]
    shares = [float(t["judge_defaulted_share"]) for t in trainings if _is_number(t.get("judge_defaulted_share"))]
    if shares and max(shares) > DEFAULTED_WARN_SHARE:
        return (f"judge not tested: {max(shares):.0%} of the teacher's verdicts were unreadable and defaulted, so "
                "SAGE-OPD weighted turns by execution errors only")
    modal = [float(t["judge_modal_label_share"]) for t in trainings if _is_number(t.get("judge_modal_label_share"))]
    if modal and max(modal) >= ONE_LABEL_SHARE:
        return (f"judge not tested: the teacher gave {max(modal):.0%} of the turns it judged the same label, so its "
                "verdicts separated no turns and SAGE-OPD weighted turns by execution errors only")
    return None
