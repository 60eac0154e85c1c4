"""What a bench hands back: its records (files and leaderboard), the per-seed summary, the pooled intervals,
the paired comparisons and the terminal tables."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from evaluation.bench.settings import BenchSettings

if TYPE_CHECKING:  # jobs imports this module: the name is for annotations only
    from evaluation.bench.jobs import JobOutcome


def bench_section(settings: BenchSettings, **extra: Any) -> dict[str, Any]:
    return {"budget_episodes": settings.budget, "steps": settings.steps, "episodes_per_step": settings.episodes_per_step,
            "group_size": settings.group_size, "lr": settings.lr, "temperature": settings.temperature,
            "seeds": list(settings.seeds), "train_env": settings.env, "env_args": settings.resolved_env_args(),
            "warm_start": {"steps": settings.warm_steps, "lr": settings.warm_lr,
                           "context_fraction": settings.warm_context_fraction, "skipped": settings.skip_warm_start},
            "eval_episodes": settings.eval_episodes, "eval_seed": settings.eval_seed,
            "max_turns": settings.max_turns, "max_new_tokens": settings.max_new_tokens,
            **({"track": settings.track} if settings.track else {}), **extra}


def build_record(env_id: str, episodes: list[Any], *, algorithm: str, student: str, teacher: str | None,
                 algorithm_config: dict[str, Any], seed: int, wall_time_s: float, curve: list | None) -> dict[str, Any]:
    from evaluation.runner import make_record

    return make_record(env_id, episodes[0].task.split, episodes, algorithm=algorithm, student=student, teacher=teacher,
                       algorithm_config=algorithm_config, seed=seed, wall_time_s=wall_time_s, curve=curve or None)


def save_records(records: list[dict[str, Any]], out: Path) -> Path:
    """This bench's records as files, ``<out>/records/<algorithm>__<env>__seed<N>.json`` (the previous
    bench's files are replaced: the folder always holds exactly one bench's results)."""
    records_dir = out / "records"
    shutil.rmtree(records_dir, ignore_errors=True)
    records_dir.mkdir(parents=True)
    for r in records:
        name = f"{r['algorithm']}__{r['env_id'].replace('/', '_')}__seed{r['seed']}.json"
        (records_dir / name).write_text(json.dumps(r, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return records_dir


def update_leaderboard(records: list[dict[str, Any]], out: Path, *, publish: bool, log: Callable[[str], None]) -> Path:
    """Put the records on the bench's leaderboard (replacing records of the same run identity: that folder
    is the bench's own) and build it; with ``publish`` also on the repo's ``leaderboard/`` (never replacing)."""
    from evaluation.leaderboard import IDENTITY_FIELDS, Leaderboard
    from evaluation.records import RecordError, dirty_problem

    board = Leaderboard(out / "leaderboard")
    identities = {tuple(r[f] for f in IDENTITY_FIELDS) for r in records}
    for old in sorted(board.records_dir.glob("*.json")) if board.records_dir.is_dir() else []:
        try:
            if tuple(json.loads(old.read_text(encoding="utf-8")).get(f) for f in IDENTITY_FIELDS) in identities:
                old.unlink()
        except (json.JSONDecodeError, UnicodeDecodeError):
            continue  # not ours to judge; build() names it
    for r in records:
        board.add(r)
    board.build()
    if publish:
        repo = Leaderboard("leaderboard")
        for r in records:
            problem = dirty_problem(f"{r['algorithm']} {r['env_id']} seed {r['seed']}", r)
            if problem:  # the command refuses a dirty tree up front; a record from another checkout may still be
                log(f"publish: skipped {problem}")
                continue
            try:
                repo.add(r)
            except RecordError as err:
                log(f"publish: skipped {r['algorithm']} {r['env_id']} seed {r['seed']}: {err}")
        repo.build()
        log("published to leaderboard/")
    return board.root


def summarise_over_seeds(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per algorithm x env split: mean over seeds and standard error across seeds (the leaderboard's rule)."""
    from evaluation.leaderboard import Leaderboard

    rows = []
    for row in Leaderboard.rows(records):
        rows.append({"algorithm": row.algorithm, "env_id": row.env_id, "split": row.split, "student": row.student,
                     "teacher": row.teacher, "seeds": row.seeds, "n_episodes": row.n_episodes,
                     "metrics": {k: {"mean": m, "stderr": s} for k, (m, s) in row.metrics.items()}})
    return rows


def pooled_outcomes(jobs: list[Any], outcomes: list[JobOutcome]) -> dict[str, dict[str, dict[tuple[int, str], float]]]:
    """Per algorithm and env: {(seed, task): success} of every evaluation episode, all seeds together."""
    pooled: dict[str, dict[str, dict[tuple[int, str], float]]] = {}
    for job, outcome in zip(jobs, outcomes):
        for env_id, episodes in outcome.outcomes.items():
            pooled.setdefault(job.name, {}).setdefault(env_id, {}).update(episodes)
    return pooled


def interval_cells(pooled: dict[str, dict[str, dict[tuple[int, str], float]]]) -> dict[str, dict[str, dict[str, float]]]:
    """Per algorithm and env: pooled success with its Wilson 95% interval (`evaluation.bench.stats`).

    A reference row (greedy, evaluated once) counts each distinct task once; a trained row counts every
    (seed, task) episode."""
    from evaluation.bench.stats import proportion_cell

    cells: dict[str, dict[str, dict[str, float]]] = {}
    for algo, by_env in pooled.items():
        for env_id, episodes in by_env.items():
            if algo in ("warm_start", "warm_start+context", "teacher"):
                values = list({task: v for (_, task), v in episodes.items()}.values())
            else:
                values = list(episodes.values())
            cells.setdefault(algo, {})[env_id] = proportion_cell(values)
    return cells


def paired_comparisons(pooled: dict[str, dict[str, dict[tuple[int, str], float]]], env_ids: list[str],
                       baselines: tuple[str, ...]) -> list[dict[str, Any]]:
    """Each algorithm minus each baseline on the same (seed, task) episodes of each held-out env."""
    from evaluation.bench.stats import paired_difference

    rows = []
    for baseline in baselines:
        for env_id in env_ids:
            base = pooled.get(baseline, {}).get(env_id)
            if not base:
                continue
            for algo, by_env in pooled.items():
                if algo == baseline or env_id not in by_env:
                    continue
                diff = paired_difference(by_env[env_id], base)
                if diff is not None:
                    rows.append({"env_id": env_id, "algorithm": algo, "baseline": baseline, **diff})
    return rows


def format_paired(comparisons: list[dict[str, Any]], order: list[str]) -> str:
    """Paired differences (mean [95% interval]; * = the interval excludes 0), one block per baseline."""
    from evaluation.bench.stats import format_difference

    blocks = []
    for baseline in dict.fromkeys(c["baseline"] for c in comparisons):
        rows = [c for c in comparisons if c["baseline"] == baseline]
        env_ids = list(dict.fromkeys(c["env_id"] for c in rows))
        head = [f"minus {baseline}", *[f"paired diff {e}" for e in env_ids]]
        lines = []
        for algo in [a for a in order if a != baseline]:
            got = {c["env_id"]: c for c in rows if c["algorithm"] == algo}
            if got:
                lines.append([algo, *[format_difference(got.get(e)) for e in env_ids]])
        widths = [max(len(r[i]) for r in [head, *lines]) for i in range(len(head))]
        fmt = lambda r: "  ".join(c.ljust(widths[i]) for i, c in enumerate(r)).rstrip()  # noqa: E731
        blocks.append("\n".join([fmt(head), fmt(["-" * w for w in widths]), *map(fmt, lines)]))
    return "\n\n".join(blocks) + "\n(* the 95% interval of the paired difference excludes 0; success: exact, from the discordant pairs)"


def format_table(summary: list[dict[str, Any]], failures: dict[str, str], env_ids: list[str], order: list[str],
                 intervals: dict[str, dict[str, dict[str, float]]] | None = None) -> str:
    """The terminal table: success rate (mean +- se over seeds, and the pooled episodes' 95% interval) per env
    split, one line per algorithm."""
    cells: dict[str, dict[str, str]] = {}
    seeds: dict[str, str] = {}
    for row in summary:
        m = row["metrics"]["success_rate"]
        ci = (intervals or {}).get(row["algorithm"], {}).get(row["env_id"])
        band = f" [{ci['low']:.2f},{ci['high']:.2f}]" if ci else ""
        cells.setdefault(row["algorithm"], {})[row["env_id"]] = f"{m['mean']:.3f} +- {m['stderr']:.3f}{band}"
        seeds[row["algorithm"]] = ",".join(map(str, row["seeds"]))
    head = ["algorithm", "seeds", *[f"success {e}" for e in env_ids]]
    lines = []
    for name in order:
        if name in cells:
            lines.append([name, seeds[name], *[cells[name].get(e, "-") for e in env_ids]])
        if name in failures:
            lines.append([name, "FAILED", failures[name][:100]])
    widths = [max(len(r[i]) for r in [head, *lines] if i < len(r)) for i in range(len(head))]
    fmt = lambda r: "  ".join(c.ljust(widths[i]) if i < len(widths) else c for i, c in enumerate(r)).rstrip()  # noqa: E731
    return "\n".join([fmt(head), fmt(["-" * w for w in widths]), *map(fmt, lines)])


def mean_success(summary: dict[str, Any], algorithm: str, env_id: str) -> float:
    """Convenience for scripts and tests: an algorithm's mean success on one env split, NaN if absent."""
    for row in summary["rows"]:
        if row["algorithm"] == algorithm and row["env_id"] == env_id:
            return row["metrics"]["success_rate"]["mean"]
    return math.nan
