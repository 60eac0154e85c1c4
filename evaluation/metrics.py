"""Episode-level metrics of an evaluation run, each as mean and standard error over episodes.

Every env gets the same core set: `success_rate`, `score` (the env's own units: 0-1 for most, 0-100 for
ScienceWorld), `mean_turns`, `error_rate` (share of turns whose action failed) and `error_rate/<kind>`
per StepError kind. An env adds its own numbers (exact match, F1, ...) by putting a `metrics` dict in
the final step's `info`; they are averaged the same way. With several samples of the same task,
`pass@k` (the unbiased estimator) is reported for each k that the sample count allows.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Iterable, Sequence

from agentgym_opd.metrics import mean_stderr, pass_at_k
from agentgym_opd.types import ERROR_KINDS, Episode


def _entry(values: Sequence[float]) -> dict[str, float]:
    mean, se = mean_stderr([float(v) for v in values])
    return {"mean": mean, "stderr": se}


def summarise(episodes: Sequence[Episode], k_values: Iterable[int] = (1, 5, 10)) -> dict[str, dict[str, float]]:
    if not episodes:
        raise ValueError("no episodes to summarise")
    metrics = {
        "success_rate": _entry([float(e.success) for e in episodes]),
        "score": _entry([e.score for e in episodes]),
        "mean_turns": _entry([e.num_turns for e in episodes]),
        "error_rate": _entry([len(e.errors()) / max(1, e.num_turns) for e in episodes]),
    }
    for kind in ERROR_KINDS:
        rates = [sum(err.kind == kind for err in e.errors()) / max(1, e.num_turns) for e in episodes]
        if any(rates):
            metrics[f"error_rate/{kind}"] = _entry(rates)
    extra: dict[str, list[float]] = defaultdict(list)
    for e in episodes:
        final = e.turns[-1].info.get("metrics", {}) if e.turns else {}
        for name, value in final.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                extra[name].append(float(value))
    for name, values in extra.items():
        if len(values) == len(episodes):
            metrics[name] = _entry(values)
    by_task: dict[str, list[bool]] = defaultdict(list)
    for e in episodes:
        by_task[e.task.id].append(e.success)
    n_min = min(len(v) for v in by_task.values())
    if n_min > 1:
        for k in k_values:
            if k <= n_min:
                metrics[f"pass@{k}"] = _entry([pass_at_k(len(v), sum(v), k) for v in by_task.values()])
    return metrics
