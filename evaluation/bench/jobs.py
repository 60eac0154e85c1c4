"""Jobs: the independent units of a bench, run in worker processes (one CPU thread each) or in-process.

A job is the base pair's build, the older path's SFT warm start or teacher, a reference row (a frozen model
evaluated on every split) or one algorithm x seed (train, then evaluate). Outcomes come back in job order,
so the records do not depend on the worker count; a run's own failure is its outcome, not the bench's end.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from evaluation.bench.episodes import (curve_start, curve_success, eval_env_args, eval_task_ids,
                                       evaluate_every_seed, evaluate_policy, load_frozen_policy)
from evaluation.bench.job_store import eval_progress_path, part_path, read_eval_progress
from evaluation.bench.results import build_record
from evaluation.bench.settings import (BenchError, BenchSettings, curve_from_evaluations, longest_first,
                                       resolved_curve_env)
from evaluation.bench.training import (_trainer, finished_training_seconds, release_freed_memory, run_diagnostics,
                                       run_overrides, sft_checkpoint, steps_seconds, trained_policy, training_curve)


@dataclass(frozen=True)
class SFTJob:
    """Train (or reuse) the warm start or the teacher: an SFT run of the base student."""

    name: str  # its folder under the bench output: warm_start / teacher
    steps: int
    lr: float
    context_fraction: float


@dataclass(frozen=True)
class BaseModelJob:
    """Build (or reuse) one base model of `evaluation.bench.base_models` (the one-time build, timed apart)."""

    name: str  # base_student / base_teacher
    spec: Any


@dataclass(frozen=True)
class ReferenceJob:
    """Evaluate a frozen checkpoint (the warm start or the teacher) on every split: a reference row.

    ``context``: every first prompt carries the task's privileged context (``warm_start+context``: can the
    student's own network use it, as a self-teacher must?). ``curve``: also measure the curve's point 0.
    """

    name: str
    path: str
    label: str
    context: bool = False
    curve: bool = False


@dataclass(frozen=True)
class RunJob:
    """One algorithm x seed: train from the warm start with the bench budget, then evaluate on every split."""

    name: str
    seed: int
    needs_teacher: bool
    needs_groups: bool


@dataclass(frozen=True)
class JobContext:
    """What every job of one bench shares (sent to each worker process with its job)."""

    settings: BenchSettings
    env_ids: list[str]
    section: dict[str, Any]
    student_path: str = ""
    teacher_path: str | None = None
    labels: dict[str, Any] = field(default_factory=dict)


@dataclass
class JobOutcome:
    """What a job hands back: validated records (plain dicts: they cross process boundaries), or its error."""

    algorithm: str
    seed: int | None = None
    records: list[dict[str, Any]] = field(default_factory=list)
    model_path: str | None = None  # SFTJob / BaseModelJob: the checkpoint's model folder
    # per env id: {(seed, task id): success} of every evaluation episode (for the paired comparisons)
    outcomes: dict[str, dict[tuple[int, str], float]] = field(default_factory=dict)
    curve_start: float | None = None  # ReferenceJob with curve=True: success at the curve's tasks
    messages: list[str] = field(default_factory=list)
    wall_s: float = 0.0
    error: str | None = None


def run_job(job: SFTJob | ReferenceJob | RunJob, context: JobContext) -> JobOutcome:
    """Run one job where it stands (this process); a worker process runs exactly this."""
    settings, out = context.settings, Path(context.settings.output_dir)
    release_freed_memory()  # a worker's previous job (an evaluation's freed caches) must not crowd this one
    started = time.perf_counter()
    outcome = JobOutcome(job.name, getattr(job, "seed", None))
    if isinstance(job, SFTJob):
        outcome.model_path = str(sft_checkpoint(settings, out / job.name, steps=job.steps, lr=job.lr,
                                                context_fraction=job.context_fraction, log=outcome.messages.append))
    elif isinstance(job, BaseModelJob):
        from evaluation.bench.base_models import ensure_base_model

        outcome.model_path = str(ensure_base_model(job.spec, progress=settings.progress, log=outcome.messages.append,
                                                   progress_file=_build_progress_file(job, out)))
    elif isinstance(job, ReferenceJob):
        store = part_store(context)
        policy = load_frozen_policy(job.path, settings)
        for env_id in context.env_ids:
            part = store.load_part(job, env_id) if store else None
            if part is None:
                progress_file = eval_progress_path(out / "jobs", job, env_id)
                by_seed, by_task, wall = evaluate_every_seed(policy, env_id, settings, with_context=job.context,
                                                             progress_file=progress_file)
                records = [build_record(  # one record per seed (its tasks), like the trained rows
                    env_id, [by_task[t] for t in ids], algorithm=job.name, student=job.label, teacher=None,
                    algorithm_config={"bench": {**context.section, "context": job.context}}, seed=seed,
                    wall_time_s=wall * len(ids) / len(by_task), curve=None) for seed, ids in by_seed.items()]
                part = {"records": records, "outcomes": {(seed, t): float(by_task[t].success)
                                                         for seed, ids in by_seed.items() for t in ids}}
                if store:
                    store.save_part(job, env_id, part)
            else:
                outcome.messages.append(f"{job.name}: {env_id} evaluated in an earlier run, read back")
            outcome.records.extend(part["records"])
            outcome.outcomes[env_id] = part["outcomes"]
        if job.curve:
            outcome.curve_start = curve_start(policy, settings, outcome.outcomes)
    else:
        outcome.records, outcome.error, outcome.outcomes = train_and_evaluate(job, context, log=outcome.messages.append)
    outcome.wall_s = time.perf_counter() - started
    return outcome


def part_store(context: JobContext) -> Any:
    """The bench's `JobStore` when it resumes (a track), for the parts of a running job; else None."""
    if not context.settings.resume:
        return None
    from evaluation.bench.job_store import JobStore

    return JobStore(Path(context.settings.output_dir) / "jobs", context)


def train_and_evaluate(job: RunJob, context: JobContext, log: Callable[[str], None] = lambda line: None,
                       ) -> tuple[list[dict[str, Any]], str | None, dict[str, Any]]:
    """One algorithm x seed: (its records, None, outcomes per env), or ([], the error, {}) with the traceback in
    its run folder.

    The training curve here starts at the first in-training evaluation; the bench prepends point 0 (the
    warm start's success, measured by the warm start's own job). A bench that resumes (`part_store`) checkpoints
    every step into a run folder marked with the job's key and continues a killed run from its newest checkpoint
    (the trainer's resume is exact: the same weights as an uninterrupted run), and keeps each split's evaluation
    as it ends; the training time of a resumed run adds its earlier steps' rollout and update seconds.
    """
    settings = context.settings
    run_dir, jobs_folder = run_dir_of(Path(settings.output_dir), job), Path(settings.output_dir) / "jobs"
    store = part_store(context)
    resumable = store is not None and _kept_checkpoint_step(run_dir, store.key(job)) is not None
    if not resumable:
        shutil.rmtree(run_dir, ignore_errors=True)
        if store is not None:
            run_dir.mkdir(parents=True)
            (run_dir / RUN_KEY_FILE).write_text(store.key(job), encoding="utf-8")
    t0 = time.perf_counter()
    try:
        overrides = run_overrides(settings, job.name, seed=job.seed, run_dir=run_dir, student=context.student_path,
                                  teacher=context.teacher_path, needs_teacher=job.needs_teacher,
                                  needs_groups=job.needs_groups)
        trainer = _trainer(overrides, job.name, settings)
        algo_config = dict(trainer.config.algo)
        earlier_s = 0.0
        if resumable:
            trainer.resume(run_dir)
            earlier_s = steps_seconds(run_dir)
            log(f"{job.name} seed {job.seed}: resumed from its step-{trainer.step} checkpoint of an earlier run")
        trainer.train()
        train_wall_s = finished_training_seconds(run_dir, earlier_s + time.perf_counter() - t0)
        policy = trained_policy(trainer)
        del trainer  # evaluation needs the trained student alone: the rest of training's memory goes back now
        release_freed_memory()
        curve = training_curve(run_dir, settings.episodes_per_step)
        diagnostics = run_diagnostics(run_dir)
        config = {"algo": algo_config, "bench": {**context.section, "train_wall_time_s": round(train_wall_s, 3)}}
        records, outcomes = [], {}
        curve_env = resolved_curve_env(settings)
        for env_id in context.env_ids:
            part = store.load_part(job, env_id) if store else None
            if part is not None:
                log(f"{job.name} seed {job.seed}: {env_id} evaluated in an earlier run, read back")
                records.extend(part["records"])
                outcomes[env_id] = part["outcomes"]
                continue
            episodes, wall = evaluate_policy(policy, env_id, settings, env_args=eval_env_args(env_id, settings),
                                             tasks=eval_task_ids(env_id, settings, job.seed),
                                             progress_file=eval_progress_path(jobs_folder, job, env_id))
            outcomes[env_id] = {(job.seed, e.task.id): float(e.success) for e in episodes}
            if env_id == curve_env and curve_from_evaluations(settings):  # the final point, from these games
                curve = [{"rollouts": settings.budget, "success_rate": curve_success(settings, outcomes[env_id])}]
            records.append(build_record(env_id, episodes, algorithm=job.name, student=context.labels["student"],
                                        teacher=context.labels["teacher"] if job.needs_teacher else None,
                                        algorithm_config=config, seed=job.seed, wall_time_s=wall,
                                        curve=curve if env_id == curve_env else None))
            if diagnostics:  # e.g. SAGE-OPD's share of unreadable judge verdicts (the claims table reads it)
                records[-1]["training"] = dict(diagnostics)
            if store is not None:
                store.save_part(job, env_id, {"records": [records[-1]], "outcomes": outcomes[env_id]})
        return records, None, outcomes
    except BenchError:
        raise
    except Exception as err:  # the bench goes on; the row says why
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "error.txt").write_text(traceback.format_exc(), encoding="utf-8")
        return [], f"{type(err).__name__}: {err}", {}


RUN_KEY_FILE = "bench_job_key"  # in a resumable bench's run folder: the key of the job that trains there


def run_dir_of(out: Path, job: RunJob) -> Path:
    return out / "runs" / job.name / f"seed{job.seed}"


def latest_checkpoint_step(run_dir: Path) -> int | None:
    """The step of the newest checkpoint in a run folder, whoever made it; None where it has none."""
    try:
        return int((run_dir / "checkpoints" / "latest").read_text(encoding="utf-8").strip().removeprefix("step_"))
    except (OSError, ValueError):
        return None


def _kept_checkpoint_step(run_dir: Path, key: str) -> int | None:
    """The step of the newest checkpoint a run folder keeps for the job of this key, else None (no checkpoint,
    or the folder is another job's or an older bench's: that run starts over)."""
    try:
        if (run_dir / RUN_KEY_FILE).read_text(encoding="utf-8") != key:
            return None
    except OSError:
        return None
    return latest_checkpoint_step(run_dir)


def default_workers(settings: BenchSettings) -> int:
    """Worker processes when ``--jobs`` is not given: one per CPU core on CPU, one on a GPU.

    The tiny student runs best on one torch thread per process (see ``threads``), so on CPU the cores are
    used by running independent jobs side by side; on a GPU the jobs would share one device, so they run
    one at a time (pass --jobs to share it anyway).
    """
    if settings.device.startswith("cuda"):
        return 1
    if settings.device == "auto":
        import torch

        if torch.cuda.is_available():
            return 1
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def _worker_init(threads: int | None) -> None:
    """A worker process: the same torch threads and quiet Hugging Face loading as the parent."""
    if threads is not None:
        import torch

        torch.set_num_threads(threads)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()


def _job_label(job: Any) -> str:
    return f"{job.name} seed {job.seed}" if isinstance(job, RunJob) else job.name


def _build_progress_file(job: Any, out: Path) -> Path:
    """Where a base model's build in a worker writes its steps done (read by :func:`_steps_done`)."""
    path = out / "base_builds" / f"{job.name}.progress"
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def _job_units(job: Any, settings: BenchSettings) -> int:
    """A job's steps as its progress files count them: training steps (a base model's build steps when it must
    be built); a job without steps counts 1 when it ends."""
    if isinstance(job, RunJob):
        return settings.steps
    if isinstance(job, BaseModelJob):
        from evaluation.bench.base_models import cached_base_model

        return 1 if cached_base_model(job.spec) is not None else job.spec.steps
    return 1


def _job_forecast(job: Any, settings: BenchSettings, costs: Any) -> tuple[float, float]:
    """(seconds of the job's part the bar can follow step by step, seconds of the rest) as the bench forecasts
    them: the bar weighs jobs by these, so a reference row that evaluates for minutes is not one unit beside a
    16-step training run."""
    from evaluation.bench.settings import SECONDS_PER_EXPERT_EPISODE

    if isinstance(job, RunJob):
        return costs.train_seconds(job.name), costs.run_eval
    if isinstance(job, ReferenceJob):
        return 0.0, costs.reference
    if isinstance(job, BaseModelJob):
        from evaluation.bench.base_models import cached_base_model, estimated_build_seconds

        if cached_base_model(job.spec) is not None:
            return 0.0, 1.0
        return float(estimated_build_seconds(job.spec)), 0.0
    if isinstance(job, SFTJob):
        return job.steps * settings.sft_tasks_per_step * SECONDS_PER_EXPERT_EPISODE, 0.0
    return 0.0, 1.0


def job_work_done(forecast: tuple[float, float], units: int, split_weight: dict[str, float],
                  progress: tuple[int, dict[str, float]] | None = None) -> float:
    """Forecast seconds of a job done: all of it when it ended (``progress`` None), else its followed part by
    steps and the rest by how much of each split's evaluation is done (1 where it is kept; a resumable bench keeps
    them as they end), each split weighing its episodes."""
    followed, rest = forecast
    if progress is None:
        return followed + rest
    steps, splits = progress
    total = sum(split_weight.values()) or 1.0
    evaluated = sum(split_weight.get(e, 0.0) * share for e, share in splits.items())
    return followed * min(steps, units) / max(units, 1) + rest * evaluated / total


def _progress(job: Any, out: Path, env_ids: list[str]) -> tuple[int, dict[str, float]]:
    """(steps done, share of each split evaluated) of a running job as seen from outside (its files): a kept split
    counts whole, a running one by the games its evaluation has ended."""
    if not isinstance(job, (RunJob, ReferenceJob)):
        return _steps_done(job, out), {}
    splits = {}
    for env in env_ids:
        share = 1.0 if part_path(out / "jobs", job, env).is_file() else eval_progress(out / "jobs", job, env)
        if share > 0:
            splits[env] = share
    return _steps_done(job, out), splits


def eval_progress(folder: Path, job: Any, env_id: str) -> float:
    """The share of a split's games a running evaluation has ended (`episodes.evaluate_policy`'s progress file)."""
    games = read_eval_progress(folder, job, env_id)
    return min(1.0, games[0] / games[1]) if games and games[1] > 0 else 0.0


def _kept_progress(job: Any, out: Path, env_ids: list[str], store: Any) -> tuple[int, dict[str, float]]:
    """What of a job not yet finished an earlier run left for this one to continue from: a training run's steps
    up to its newest checkpoint when its folder carries this job's key (else the run starts over: its old
    metrics lines do not count, or the bar would step back when they are cleared), and the splits kept under
    this job's key (a split an earlier run was playing starts over)."""
    steps, _ = _progress(job, out, env_ids)
    if isinstance(job, RunJob):
        steps = min(steps, _kept_checkpoint_step(run_dir_of(out, job), store.key(job)) or 0)
    return steps, {env: 1.0 for env in env_ids if store.load_part(job, env) is not None}


def _steps_done(job: Any, out: Path) -> int:
    """Progress of a running job as seen from outside: the lines its trainer has logged so far, or the steps a
    base model's build has written to its progress file."""
    if isinstance(job, BaseModelJob):  # "N" steps, or "done/total" (a build that also records games) as steps
        try:
            text = (out / "base_builds" / f"{job.name}.progress").read_text(encoding="utf-8").strip() or "0"
            if "/" in text:
                done, total = (float(x) for x in text.split("/", 1))
                return int(job.spec.steps * done / total) if total > 0 else 0
            return int(text)
        except (OSError, ValueError):
            return 0
    if not isinstance(job, RunJob):
        return 0
    path = run_dir_of(out, job) / "metrics.jsonl"
    try:
        with open(path, "rb") as fh:
            return sum(1 for _ in fh)
    except OSError:
        return 0


def run_jobs(jobs: list[Any], context: JobContext, *, workers: int, log: Callable[[str], None], out: Path,
             store: Any = None) -> list[JobOutcome]:
    """Run the jobs (in ``workers`` processes, or here when 1); their outcomes in job order.

    Progress: one bar counting forecast seconds of work (training steps, games ended) from each running job's
    files, and a line per finished job with its time and the time left. A run's own error is its outcome;
    anything else a job raises (a broken setup) is re-raised here. ``store`` (a `job_store.JobStore`): each
    job's outcome is kept as it ends, and a job whose outcome it holds (same key) is not run again.
    """
    from tqdm import tqdm

    if not jobs:
        return []
    settings = context.settings
    units = {i: _job_units(job, settings) for i, job in enumerate(jobs)}
    from evaluation.bench.settings import job_costs

    costs = job_costs(settings, len(context.env_ids))  # one forecast per bench, shared by its jobs
    forecast = {i: _job_forecast(job, settings, costs) for i, job in enumerate(jobs)}

    # a split's share of a job's evaluation: its episodes (a track's 8 train games beside 140 held-out ones)
    split_weight = {env: settings.train_eval_episodes if env == settings.env else settings.eval_episodes
                    for env in context.env_ids}

    def work_done(i: int, progress: tuple[int, dict[str, float]] | None = None) -> float:
        return job_work_done(forecast[i], units[i], split_weight, progress)

    outcomes: dict[int, JobOutcome] = {}
    times: list[float] = []

    def finished(i: int, outcome: JobOutcome) -> None:
        outcomes[i] = outcome
        for message in outcome.messages:
            log(message)
        times.append(outcome.wall_s)
        left = len(jobs) - len(outcomes)
        status = f"FAILED: {outcome.error} (traceback in its run folder's error.txt)" if outcome.error else "done"
        eta = f"; {left} job(s) left, ~{left * sum(times) / len(times) / max(workers, 1) / 60:.1f} min" if left else ""
        log(f"{_job_label(jobs[i])} {status} in {outcome.wall_s:.0f}s{eta}")

    if store is not None:
        kept = finished
        for i, job in enumerate(jobs):
            stored = store.load(job)
            if stored is not None:
                outcomes[i] = stored
                log(f"{_job_label(job)}: finished in an earlier run, outcome read back from {store.path(job)}")

        def finished(i: int, outcome: JobOutcome) -> None:  # noqa: F811 (the same, and kept on disk)
            kept(i, outcome)
            store.save(jobs[i], outcome)
    todo = [i for i in range(len(jobs)) if i not in outcomes]
    for path in (eval_progress_path(out / "jobs", jobs[i], env) for i in todo for env in context.env_ids):
        path.unlink(missing_ok=True)  # a killed run's: that split starts over, and the bar must not count it meanwhile
    # the bar counts forecast seconds of work, so its percentage and time left follow the work (shown as both). It
    # starts at the work an earlier run did (finished jobs, and a resumed job's steps), so its rate counts only
    # this run's work: counted at the first poll, a resumed build's steps read as done in two seconds (a wild ETA)
    done_before = sum(work_done(i) for i in outcomes)
    if store is not None:
        done_before += sum(work_done(i, _kept_progress(jobs[i], out, context.env_ids, store)) for i in todo)
    # into a log file (not a terminal) the bar is a line per refresh: once a minute, not every poll of the workers
    refresh_s = 0.1 if sys.stderr.isatty() else 60.0
    bar = tqdm(total=round(sum(sum(f) for f in forecast.values()), 1), initial=round(done_before, 1), desc="bench",
               disable=not settings.progress, leave=True, mininterval=refresh_s,
               bar_format="{desc}{percentage:3.0f}%|{bar}| [{elapsed}<{remaining}]")
    with bar:
        if workers <= 1:
            for i in todo:
                job = jobs[i]
                bar.set_description(f"bench {_job_label(job)}")
                finished(i, run_job(job, context))
                bar.update(work_done(i))
        else:
            import concurrent.futures as cf
            import multiprocessing

            quiet = dataclasses.replace(context, settings=dataclasses.replace(settings, progress=False))
            # spawn, not fork: the parent has torch (and maybe Ray, tokenizers) threads that fork would copy mid-state
            with cf.ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn"),
                                        initializer=_worker_init, initargs=(settings.threads,)) as pool:
                futures = {pool.submit(run_job, jobs[i], quiet): i for i in longest_first(todo, forecast)}
                pending = set(futures)
                shown = time.monotonic()
                while pending:
                    done, pending = cf.wait(pending, timeout=2.0, return_when=cf.FIRST_COMPLETED)
                    for future in done:
                        i = futures[future]
                        try:
                            outcome = future.result()
                        except BenchError:
                            raise
                        except Exception as err:  # the worker died (killed, out of memory): that job failed
                            if not isinstance(jobs[i], RunJob):
                                raise
                            outcome = JobOutcome(jobs[i].name, jobs[i].seed, error=f"worker lost: {type(err).__name__}: {err}")
                        finished(i, outcome)
                    running = [futures[f] for f in pending if f.running()]  # not the queued ones
                    bar.n = round(sum(work_done(i) for i in outcomes)
                                  + sum(work_done(i, _progress(jobs[i], out, context.env_ids)) for i in running), 1)
                    names = ", ".join(_job_label(jobs[i]) for i in sorted(running)[:3]) + (", ..." if len(running) > 3 else "")
                    bar.set_description(f"bench {len(outcomes)}/{len(jobs)} jobs (running: {names})" if running
                                        else f"bench {len(outcomes)}/{len(jobs)} jobs", refresh=False)
                    if done or time.monotonic() - shown >= refresh_s:
                        bar.refresh()
                        shown = time.monotonic()
    return [outcomes[i] for i in range(len(jobs))]
