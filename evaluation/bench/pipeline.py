"""`run_bench`: the bench from its settings to its summary, one step after the other (see the package's notes)."""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any, Callable

from evaluation.bench.jobs import (BaseModelJob, JobContext, JobOutcome, ReferenceJob, RunJob, SFTJob, default_workers,
                                   run_jobs)
from evaluation.bench.results import (bench_section, format_paired, format_table, interval_cells, paired_comparisons,
                                      pooled_outcomes, save_records, summarise_over_seeds, update_leaderboard)
from evaluation.bench.settings import (BenchError, BenchSettings, algorithm_flags, base_build_estimate,
                                       estimate_seconds, evaluation_envs, resolved_curve_env, selected_algorithms,
                                       uses_base_models)


def plan_jobs(settings: BenchSettings, flags: dict[str, tuple[bool, bool]], student: tuple[str, str] = ("", ""),
              teacher: tuple[str, str] = ("", "")) -> list[Any]:
    """The bench's jobs in its order: the reference rows (the warm start, with privileged context when it starts
    from a base pair, the teacher when there is one), then every algorithm x seed. ``student`` and ``teacher`` are
    (model path, record label); `bench --status` plans with them empty, as only the jobs' names matter there."""
    base = uses_base_models(settings)
    jobs: list[Any] = []
    if settings.references:
        jobs.append(ReferenceJob("warm_start", *student, curve=base))
        if base:  # can the student's own network use privileged context (what every self-teacher relies on)?
            jobs.append(ReferenceJob("warm_start+context", *student, context=True))
        if settings.teacher is not None or any(needs_teacher for needs_teacher, _ in flags.values()):
            jobs.append(ReferenceJob("teacher", *teacher))
    return jobs + [RunJob(name, seed, *flags[name]) for name in flags for seed in settings.seeds]


def run_bench(settings: BenchSettings, *, log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Warm start -> teacher -> every algorithm x seed -> evaluations -> records + leaderboard; the summary.

    Returns (and writes to ``<out>/summary.json``) the per algorithm x split aggregate, the failures,
    the leaderboard folder and the wall time.
    """
    from tqdm import tqdm

    log = log or (lambda text: tqdm.write(text, file=sys.stderr))
    started = time.perf_counter()
    if settings.threads is not None:
        # a tiny model gains nothing from intra-op threads, and on a shared machine they spin against
        # other processes: measured 10x slower rollouts with 2 threads than 1 on the 2-core build machine
        import torch

        torch.set_num_threads(settings.threads)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # dozens of "Loading weights" bars would bury the bench's own progress
    if not settings.seeds:
        raise BenchError("--seeds needs at least one seed")
    if settings.steps < 1 or settings.episodes_per_step < 1:
        raise BenchError("steps and episodes per step must be positive")
    if settings.eval_batch is not None and settings.eval_batch < 1:
        raise BenchError(f"--eval-batch must be at least 1 game, got {settings.eval_batch}")
    algos = selected_algorithms(settings)
    env_ids = evaluation_envs(settings)
    out = Path(settings.output_dir)
    out.mkdir(parents=True, exist_ok=True)

    flags: dict[str, tuple[bool, bool]] = {}
    failures: dict[str, str] = {}
    for name in algos:
        try:
            flags[name] = algorithm_flags(name)
        except Exception as err:  # a plugin that does not import fails its rows, not the bench
            failures[name] = f"{type(err).__name__}: {err}"
    if any(g for _, g in flags.values()) and (settings.group_size < 2 or settings.group_size > settings.episodes_per_step
                                              or settings.episodes_per_step % settings.group_size):
        raise BenchError(f"group algorithms need 2 <= group_size <= episodes_per_step, episodes_per_step a multiple "
                         f"of it; got group_size={settings.group_size}, episodes_per_step={settings.episodes_per_step}")
    want_teacher = any(t for t, _ in flags.values())
    train_teacher = want_teacher and settings.teacher is None
    workers = settings.jobs or default_workers(settings)
    estimate = estimate_seconds(settings, list(flags), len(env_ids), warm=not settings.skip_warm_start,
                                teacher=train_teacher, workers=workers)
    build = base_build_estimate(settings, teacher=train_teacher, workers=workers)
    log(f"bench: {len(flags)} algorithm(s) {list(flags)} x seeds {settings.seeds}, budget {settings.budget} rollout "
        f"episodes each ({settings.steps} steps x {settings.episodes_per_step}); eval on {env_ids}; "
        f"estimated wall time ~{(estimate + build) / 60:.1f} min with {workers} worker process(es)"
        + (f", of which ~{build / 60:.0f} min the one-time build of a base pair with these settings (the default "
           "pair ships with the repository)" if build else ""))

    # 1. warm start and teacher: the cached base pair (built once, timed apart from the bench), or two
    #    independent SFT runs of the base student (side by side with 2+ workers)
    base = uses_base_models(settings)
    base_name = settings.student if settings.student == "tiny" else Path(settings.student).name or settings.student
    if base:
        student_spec, teacher_spec = settings.base_specs()
        sft_jobs = [BaseModelJob("warm_start", student_spec)]
        sft_jobs += [BaseModelJob("teacher", teacher_spec)] if train_teacher else []
    else:
        sft_jobs = ([] if settings.skip_warm_start else
                    [SFTJob("warm_start", settings.warm_steps, settings.warm_lr, settings.warm_context_fraction)])
        sft_jobs += [SFTJob("teacher", settings.teacher_steps, settings.teacher_lr, 0.0)] if train_teacher else []
    build_started = time.perf_counter()
    # a teacher that learns from the student's rollouts needs the student first: then one build after the other
    dependent = base and train_teacher and teacher_spec.history_model is not None
    trained = {job.name: outcome.model_path for job, outcome in zip(sft_jobs, run_jobs(
        sft_jobs, JobContext(settings, env_ids, {}), workers=1 if dependent else min(workers, len(sft_jobs)),
        log=log, out=out))}
    base_build_s = time.perf_counter() - build_started if base else 0.0
    if base:
        log(f"base models ready in {base_build_s / 60:.1f} min (a one-time build when not cached; the bench's "
            "wall time below leaves it out): " + ", ".join(f"{name} {path}" for name, path in trained.items()))
        if settings.track:
            from evaluation.bench.tracks import get_track, pair_differences

            for line in pair_differences(get_track(settings.track), trained):
                log(line)
    from evaluation.bench.base_models import base_label

    student_path, student_label = settings.student, base_name
    if "warm_start" in trained:
        student_path, student_label = trained["warm_start"], (
            base_label(student_spec) if base else f"{base_name}+sft{settings.warm_steps}")
    from agentgym_opd.policy.loading import model_name

    teacher_path, teacher_label = settings.teacher, model_name(settings.teacher)  # a short name's record label
    if "teacher" in trained:
        teacher_path, teacher_label = trained["teacher"], (
            base_label(teacher_spec) if base else f"{base_name}+sft{settings.teacher_steps}")

    section = bench_section(settings)
    labels = {"student": student_label, "teacher": teacher_label}

    # 2. the reference rows (the warm start and the teacher, evaluated once: greedy has no seed to vary) and
    #    3. every algorithm x seed from the warm start with the same budget: independent jobs, run in parallel
    jobs = plan_jobs(settings, flags, (student_path, student_label), (teacher_path, teacher_label))
    context = JobContext(settings, env_ids, section, student_path, teacher_path, labels)
    log(f"{len(jobs)} jobs on {min(workers, len(jobs))} worker process(es)")
    store = None
    if settings.resume:
        from evaluation.bench.job_store import JobStore

        store = JobStore(out / "jobs", context)
    outcomes = run_jobs(jobs, context, workers=min(workers, len(jobs)), log=log, out=out, store=store)

    records: list[dict[str, Any]] = []
    start_success: float | None = None
    curve_env = resolved_curve_env(settings)
    for job, outcome in zip(jobs, outcomes):
        if isinstance(job, ReferenceJob) and job.name == "warm_start":
            start_success = outcome.curve_start if outcome.curve_start is not None else next(
                r["metrics"]["success_rate"]["mean"] for r in outcome.records if r["env_id"] == settings.env)
    results: list[JobOutcome] = []
    for job, outcome in zip(jobs, outcomes):  # job order, not finishing order: the same files for any --jobs
        if isinstance(job, RunJob):
            results.append(outcome)
            if outcome.error is not None:
                failures.setdefault(job.name, f"seed {job.seed}: {outcome.error}")
                continue
        for record in outcome.records:
            if isinstance(job, RunJob) and record["env_id"] == curve_env and start_success is not None:
                # curve point 0 is the warm start's success, measured by its own job
                record["curve"] = [{"rollouts": 0, "success_rate": float(start_success)}, *record.get("curve", [])]
            records.append(record)

    # 4. records, leaderboard, table: the records are saved first, so a leaderboard problem loses nothing
    save_records(records, out)
    summary_rows = summarise_over_seeds(records)
    board, board_error = out / "leaderboard", None
    try:
        board = update_leaderboard(records, out, publish=settings.publish, log=log)
    except Exception as err:  # the results stand; `agentgym-opd leaderboard build --root ...` can retry
        board_error = f"{type(err).__name__}: {err}"
        log(f"leaderboard FAILED: {board_error}; the records are in {out / 'records'}")
    wall = time.perf_counter() - started - base_build_s
    by_algorithm = pooled_outcomes(jobs, outcomes)
    cells = interval_cells(by_algorithm)
    # the printed tables: each method minus OPD and minus the warm start; summary.json also holds the pairs the
    # papers' claims need (LOPD / VPD vs GRPO, VPD vs SDPO, OPD vs SFT)
    comparisons = paired_comparisons(by_algorithm, env_ids[1:], baselines=("opd", "warm_start", "grpo", "sdpo", "sft"))
    summary = {"settings": dataclasses.asdict(settings), "eval_envs": env_ids, "student": student_label,
               "teacher": teacher_label, "rows": summary_rows, "failures": failures,
               "intervals": cells, "paired": comparisons, "base_build_time_s": round(base_build_s, 1),
               "failed_runs": [{"algorithm": r.algorithm, "seed": r.seed, "error": r.error} for r in results if r.error],
               "workers": workers,
               "leaderboard": str(board), "leaderboard_error": board_error,
               "wall_time_s": round(wall, 1), "estimated_wall_time_s": round(estimate, 1)}
    from evaluation.bench.claims import check_claims, format_claims

    held_out = env_ids[-1]  # the unseen split when the bench evaluates several
    summary["claims"] = check_claims(summary, records, env_id=held_out)
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    (out / "claims.md").write_text(f"The papers' claims on {held_out}\n\n" + format_claims(summary["claims"]) + "\n",
                                   encoding="utf-8")
    order = [*(job.name for job in jobs if isinstance(job, ReferenceJob)), *algos]
    summary["table"] = format_table(summary_rows, failures, env_ids, order, intervals=cells)
    if any(c["baseline"] in ("opd", "warm_start") for c in comparisons):
        shown = [c for c in comparisons if c["baseline"] in ("opd", "warm_start")]
        summary["table"] += "\n\n" + format_paired(shown, order)
    return summary
