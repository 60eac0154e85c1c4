"""Ranks from the evidence: rank groups and each row's paired difference from the warm start and from OPD.

A rank claims that a row beat the row below it. The claim is made only where the evidence says so: walking
down a track's table (best first), a row starts a new rank group when its difference from the row above is
significant at 5%, else it shares the group above (labels "1", "2-5"). The difference is

- paired, where both rows keep per-episode outcomes (the record's ``outcomes``) over the same (seed, task)
  episodes: `evaluation.bench.stats.paired_difference`, exact (McNemar-consistent) for 0/1 outcomes, the
  interval the bench prints;
- otherwise unpaired: Newcombe's hybrid score interval of the difference of two proportions, built from the two
  cells' Wilson intervals. It ignores the shared task difficulty, so it is wider than the paired one: a rank
  group from it errs towards ties, never towards a claim the evidence does not carry.

The paired columns (difference from the warm start, from OPD) are shown only where the rows are paired; OPD is
the track's OPD row at the same budget, else its best-ranked OPD row.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from evaluation.bench.stats import paired_difference

if TYPE_CHECKING:
    from evaluation.leaderboard_tables import FamilyTable, Method, Row

REFERENCES = ("warm_start", "opd")  # the paired columns: the start every method leaves from, the method to beat


@dataclass
class Difference:
    """A row's difference from another on one metric, with its 95% interval."""

    mean: float
    low: float
    high: float
    n: int  # paired episodes, or the smaller row's episodes for an unpaired one
    paired: bool

    @property
    def significant(self) -> bool:
        return self.low > 0 or self.high < 0

    def text(self) -> str:
        star = "*" if self.significant else ""
        return f"{self.mean:+.3f} [{self.low:+.3f}, {self.high:+.3f}]{star}"


def paired(a: "Row | None", b: "Row | None") -> Difference | None:
    """a - b over the (seed, task) episodes both rows recorded; None without at least two shared episodes."""
    if a is None or b is None:
        return None
    diff = paired_difference(a.outcomes, b.outcomes)
    if diff is None:
        return None
    return Difference(diff["mean"], diff["low"], diff["high"], int(diff["n"]), True)


def unpaired(a: "Row", b: "Row", metric: str) -> Difference | None:
    """a - b from the two cells alone (Newcombe's hybrid score interval over their Wilson intervals)."""
    ca, cb = a.interval(metric), b.interval(metric)
    if ca is None or cb is None or metric not in a.pooled or metric not in b.pooled:
        return None
    (pa, la, ua), (pb, lb, ub) = ca, cb
    d = pa - pb
    low = d - math.sqrt((pa - la) ** 2 + (ub - pb) ** 2)
    high = d + math.sqrt((ua - pa) ** 2 + (pb - lb) ** 2)
    return Difference(d, low, high, min(a.episodes_behind(metric), b.episodes_behind(metric)), False)


def difference(a: "Row | None", b: "Row | None", metric: str) -> Difference | None:
    """The paired difference where the rows are paired, else the unpaired one, else None."""
    if a is None or b is None:
        return None
    return paired(a, b) or unpaired(a, b, metric)


def rank_groups(table: "FamilyTable") -> list[str]:
    """Each ranked method's rank group on the ranking split ("1", "2-5"), in the table's order (module
    docstring): a new group starts only below a significant difference."""
    methods = table.methods
    starts = [0]
    for i in range(1, len(methods)):
        above, here = methods[i - 1].by_env.get(table.ranking_env), methods[i].by_env.get(table.ranking_env)
        diff = difference(above, here, table.metric)
        if diff is None or diff.significant:  # nothing to compare (a missing cell) is not a tie either
            starts.append(i)
    labels: list[str] = []
    for k, first in enumerate(starts):
        last = (starts[k + 1] if k + 1 < len(starts) else len(methods)) - 1
        label = str(first + 1) if first == last else f"{first + 1}-{last + 1}"
        labels += [label] * (last - first + 1)
    return labels


def reference_method(table: "FamilyTable", algorithm: str, budget: Any) -> "Method | None":
    """The track's ``algorithm`` row to pair against: the one at ``budget``, else the best-ranked one."""
    candidates = [m for m in table.methods if m.algorithm == algorithm]
    return next((m for m in candidates if m.budget[0] == budget), candidates[0] if candidates else None)


def reference_differences(table: "FamilyTable", method: "Method") -> dict[str, Difference | None]:
    """``{reference: paired difference of method minus it on the ranking split}`` (None where not paired,
    and for the reference itself)."""
    out: dict[str, Difference | None] = {}
    here = method.by_env.get(table.ranking_env)
    for name in REFERENCES:
        ref = reference_method(table, name, method.budget[0])
        out[name] = None if ref is None or ref is method else paired(here, ref.by_env.get(table.ranking_env))
    return out


def paired_words() -> str:
    """The captions' sentence on rank groups and the paired columns (one place, so it matches the code)."""
    return ("Rank: rows share a rank group unless the difference from the row above is significant at 5% (paired "
            "exact McNemar interval over the same (seed, task) episodes where both rows keep per-episode "
            "outcomes, else Newcombe's unpaired interval from the two Wilson intervals, which errs towards ties). "
            "vs warm_start / vs opd: the row minus that row of its track over the same (seed, task) episodes, "
            "with the exact paired 95% interval (* : excludes 0); '-' where the records keep no per-episode "
            "outcomes to pair.")
