"""`bench --status`: what a resumable bench (every track) has so far, without running anything.

A real-LM track takes several sittings. Between them a researcher wants the rows that are finished, their
intervals and the paired differences already measurable, and what is left: this reads the outcomes and parts the
bench keeps under ``<out>/jobs`` (`evaluation.bench.job_store`) and the run folders' checkpoints, and prints the
same tables the finished bench prints, over what exists. It checks no job key (that needs the base pair the
bench resolves when it runs): what it shows is what the folder holds; a rerun reuses only the outcomes whose
settings still match.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from evaluation.bench.job_store import job_file_stem, outcome_pairs, part_path, read_eval_progress
from evaluation.bench.jobs import RUN_KEY_FILE, RunJob, latest_checkpoint_step, run_dir_of
from evaluation.bench.pipeline import plan_jobs
from evaluation.bench.results import (format_paired, format_table, interval_cells, paired_comparisons,
                                      summarise_over_seeds)
from evaluation.bench.settings import BenchSettings, algorithm_flags, evaluation_envs, selected_algorithms

STATUS_BASELINES = ("warm_start", "opd", "sft")  # the paired blocks printed: the issue's and the papers' baselines


def _read(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _games(folder: Path, job: Any, env_id: str) -> str:
    """``done/total`` of a split a job is playing now (or was, when it was stopped), '' when none."""
    games = read_eval_progress(folder, job, env_id)
    return f"{games[0]}/{games[1]}" if games else ""


def bench_status(settings: BenchSettings) -> str:
    """The finished rows' table (Wilson intervals), the paired differences measurable so far and each job's state."""
    out = Path(settings.output_dir)
    folder = out / "jobs"
    env_ids = evaluation_envs(settings)
    jobs = plan_jobs(settings, {name: algorithm_flags(name) for name in selected_algorithms(settings)})
    records: list[dict[str, Any]] = []
    pooled: dict[str, dict[str, dict[tuple[int, str], float]]] = {}
    states: list[str] = []
    finished = 0
    for job in jobs:
        label = job.name + (f" seed {job.seed}" if isinstance(job, RunJob) else "")
        kept = _read(folder / f"{job_file_stem(job)}.json")
        if kept is not None:
            outcome = kept["outcome"]
            records += outcome["records"]
            for env_id, rows in outcome["outcomes"].items():
                pooled.setdefault(job.name, {}).setdefault(env_id, {}).update(outcome_pairs(rows))
            states.append(f"{label}: finished ({outcome['wall_s']:.0f} s)")
            finished += 1
            continue
        done = []
        for env_id in env_ids:
            part = _read(part_path(folder, job, env_id))
            if part is not None:
                records += part["value"]["records"]
                pooled.setdefault(job.name, {}).setdefault(env_id, {}).update(outcome_pairs(part["value"]["outcomes"]))
                done.append(env_id)
        step = latest_checkpoint_step(run_dir_of(out, job)) if isinstance(job, RunJob) else None
        playing = [f"playing {env_id}: {games} games ended (a rerun starts this split over)" for env_id in env_ids
                   if env_id not in done and (games := _games(folder, job, env_id))]
        if not done and step is None and not playing:
            started = isinstance(job, RunJob) and (run_dir_of(out, job) / RUN_KEY_FILE).is_file()
            states.append(f"{label}: " + ("training, no step kept yet" if started else "not started"))
            continue
        kept = [f"trained {step} of {settings.steps} steps" if step is not None else "",
                f"evaluated on {', '.join(done)}" if done else ""]
        kept_text = "; ".join(x for x in kept if x)
        said = [kept_text + " (kept; a rerun goes on from there)"] if kept_text else []
        states.append(f"{label}: " + "; ".join(said + playing))
    lines = [f"bench status of {out} ({finished} of {len(jobs)} jobs finished; outcomes as kept under jobs/, not checked against these settings' keys):"]
    lines += [f"  {s}" for s in states]
    if not records:
        return "\n".join(lines + ["", "no evaluation is kept yet"])
    order = [job.name for job in jobs]
    lines += ["", format_table(summarise_over_seeds(records), {}, env_ids, list(dict.fromkeys(order)),
                               intervals=interval_cells(pooled))]
    comparisons = paired_comparisons(pooled, env_ids[1:], baselines=STATUS_BASELINES)
    if comparisons:
        lines += ["", format_paired(comparisons, list(dict.fromkeys(order)))]
    return "\n".join(lines)
