"""`agentgym-opd bench`: every registered algorithm, the same warm start, the same rollout budget, one table.

NOTES (decisions where the brief was silent, and what remains)
- Jobs: the warm start and the teacher (two SFT runs, side by side), then the reference evaluations and
  every algorithm x seed are independent jobs, run in worker processes (``--jobs``; default one per CPU
  core on CPU, one on a GPU), each on one torch thread. Records come back in job order, so the files do
  not depend on the worker count (a test checks a parallel run against an in-process rerun). A failing
  algorithm is caught per run (exception -> a ``failed`` row with its error; the traceback goes to
  ``runs/<algo>/seed<N>/error.txt``; a worker process that dies fails only its job) and the bench goes on.
- Equal budget: every run does the same number of update steps with the same number of episodes per step
  (``episodes_per_step`` = tasks_per_step * G; G = ``group_size`` for ``needs_groups`` algorithms, else 1,
  tasks_per_step = episodes_per_step // G). SFT's expert episodes count as its episodes. The budget is
  reported as rollout episodes (``budget = steps * episodes_per_step``).
- Same hyper-parameters for every algorithm (lr 3e-4, temperature 0.5: the lead's measured OPD setting);
  per-algorithm changes go through ``--algo-set NAME:key=value`` (e.g. ``grpo:algo.kl_coef=0.01``).
- The warm start and the teacher are SFT runs of the base student (the teacher: more steps), cached under
  ``<out>/warm_start`` and ``<out>/teacher`` keyed by their settings (``bench_key.json``): a rerun with the
  same settings reuses them, other settings retrain. Algorithm runs are never cached (so a rerun checks
  reproducibility). The teacher is trained only when a selected algorithm ``needs_teacher`` (or --teacher).
- Evaluation: greedy, on three splits: the training tasks themselves (``train``, where the training curve
  is measured), the seen split and the unseen split of the env family (``valid_seen`` / ``valid_unseen``
  where registered, else the first registered id of the family matching seen/unseen/valid/dev/test).
  Tasks: the training env's first ``eval_episodes`` tasks (what the trainer's ``eval/success`` uses, so
  the curve and the ``train`` row agree); other splits the runner's evenly spaced subset
  (``evaluation.runner.select_tasks``); eval seed fixed. On the tiny student the seen/unseen rows are 0:
  8 memorised training tasks do not generalise (measured: warm start 0.5 train, 0.0 seen, 0.0 unseen).
- Records: one per algorithm x split x seed (the leaderboard's identity includes the seed, and its build
  aggregates seeds: mean of the seed means, standard error across seeds); the bench's own ``summary.json``
  holds the same aggregate per algorithm x split. ``wall_time_s`` is the evaluation's wall time (as the
  schema says); training wall time, the seed list and the budget are in ``algorithm_config["bench"]``.
  The training curve (success on the training tasks vs rollout episodes, point 0 = the warm start) is
  attached to the ``train`` split's records. The warm start is the ``warm_start`` row, the teacher the
  ``teacher`` row (greedy decoding has no seed: one record each).
- The bench's leaderboard (``<out>/leaderboard``) is owned by the bench: a rerun replaces records of the
  same run identity. ``--publish`` adds to the repo's ``leaderboard/`` and never replaces: a duplicate is
  reported and skipped.
- ``--quick``: 4 training tasks, 4 steps x 4 episodes, ONE seed, 4 episodes per split, warm start 60 /
  teacher 120 SFT steps. Torch runs on one CPU thread by default (``--threads``): 10x faster than two
  threads on the shared build machine (same greedy actions in that probe).
- Exit codes: 0 ok, 1 an algorithm failed or the leaderboard build failed (results saved), 2 bad setup.
- Measured on the shared 2-core build machine (load ~5-8): ``bench --quick`` (8 algorithms, 1 seed) 329 s;
  the earlier full default with ``--seeds 1`` (8 algorithms, 320 episodes each) 2555 s (estimate printed: 2894 s);
  train-task success: warm start 0.50, teacher 0.875, sft 0.875, opd 0.75, sage_opd 0.75, lopd 0.375,
  opsd 0.375, grpo/sdpo/vpd 0.0 (lr 3e-4 collapses them: per-algorithm lr tuning is left to --algo-set).
- Default budget (chosen by the lead for the ~15-minute target): 16 steps x 4 episodes (G=2) per run, 8
  eval episodes per split, 2 curve points, 3 seeds. The bench's own estimate on the loaded build machine
  is ~35 min (its per-episode costs were measured at load 5-8); an idle 2-core machine should take about
  a third of that, not yet measured. The earlier default (40 steps x 8 episodes, 16 eval episodes) is
  ``--steps 40 --episodes-per-step 8 --group-size 4 --eval-episodes 16``: ~2 h here for 3 seeds. The
  bench prints its estimate before it starts and an ETA after each run. Per-algorithm tuned defaults
  (an lr per method) are not chosen yet.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

DEFAULT_ENV = "household/train"
# the embedded household train split has 2000 generated tasks; the tiny student learns a handful
DEFAULT_ENV_ARGS = {"household/train": {"num_tasks": 8}}
SEEN_NAMES = ("valid_seen", "seen", "valid", "dev", "test")
UNSEEN_NAMES = ("valid_unseen", "unseen", "test")
# measured on the shared 2-core build machine under load (tiny student, household, <= 10 turns x 16 tokens,
# one torch thread): seconds per episode, the update step included for training episodes
SECONDS_PER_EXPERT_EPISODE = 0.12
SECONDS_PER_ROLLOUT_EPISODE = 0.9
SECONDS_PER_EVAL_EPISODE = 0.45


class BenchError(ValueError):
    """A bench set up wrong by its caller (unknown algorithm, bad option): the CLI exits 2 with the message."""


@dataclass
class BenchSettings:
    """Everything a bench run depends on; defaults are the full bench on the embedded household env."""

    env: str = DEFAULT_ENV
    env_args: dict[str, Any] | None = None  # None: DEFAULT_ENV_ARGS for the env, else {}
    eval_envs: list[str] | None = None  # None: seen and unseen split of the env family (plus the train tasks)
    student: str = "tiny"
    teacher: str | None = None  # a path: use it instead of training the SFT teacher
    algos: list[str] | None = None  # None: every registered algorithm
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])
    steps: int = 16
    episodes_per_step: int = 4
    group_size: int = 2
    lr: float = 3e-4
    temperature: float = 0.5
    eval_points: int = 2  # evaluations during training (the curve), besides step 0
    eval_episodes: int = 8  # per split
    eval_seed: int = 0
    warm_steps: int = 70
    warm_lr: float = 3e-3
    warm_context_fraction: float = 0.5
    teacher_steps: int = 200
    teacher_lr: float = 3e-3
    sft_tasks_per_step: int = 8
    max_turns: int = 10
    max_new_tokens: int = 16
    device: str = "auto"
    threads: int | None = 1  # torch CPU threads per process; None = torch's default (see run_bench)
    jobs: int | None = None  # worker processes for independent runs; None = default_workers()
    overrides: list[str] = field(default_factory=list)  # key=value for every algorithm run
    algo_overrides: dict[str, list[str]] = field(default_factory=dict)  # per algorithm
    skip_warm_start: bool = False
    output_dir: str = "runs/bench"
    publish: bool = False
    progress: bool = True

    @classmethod
    def quick(cls, **changes: Any) -> "BenchSettings":
        """A ~2-3 minute smoke bench (idle 2-core machine): 4 tasks, 4 steps, one seed, 4 episodes per split."""
        base = dict(env_args=None, seeds=[0], steps=4, episodes_per_step=4, group_size=2, eval_points=2,
                    eval_episodes=4, warm_steps=60, teacher_steps=120, sft_tasks_per_step=4, max_turns=8)
        base.update(changes)
        settings = cls(**base)
        if settings.env_args is None and settings.env in DEFAULT_ENV_ARGS:
            settings.env_args = {"num_tasks": 4}
        return settings

    def resolved_env_args(self) -> dict[str, Any]:
        return dict(self.env_args if self.env_args is not None else DEFAULT_ENV_ARGS.get(self.env, {}))

    @property
    def budget(self) -> int:
        return self.steps * self.episodes_per_step


# ----------------------------------------------------------------------------------------------------
# Choosing what to run
# ----------------------------------------------------------------------------------------------------


def selected_algorithms(settings: BenchSettings) -> list[str]:
    """The algorithms to run, in registry order; an unknown name is the caller's error (exit 2)."""
    from agentgym_opd.registry import algorithm_registry

    registered = algorithm_registry.ids()
    if settings.algos is None:
        return list(registered)
    unknown = [a for a in settings.algos if a not in registered]
    if unknown:
        raise BenchError(f"unknown algorithm(s) {unknown}; registered: {', '.join(registered)}")
    if not settings.algos:
        raise BenchError("--algos selected no algorithm")
    return list(dict.fromkeys(settings.algos))


def evaluation_envs(settings: BenchSettings) -> list[str]:
    """Env ids the final students are scored on: the training env (its training tasks) + seen + unseen."""
    from agentgym_opd.registry import env_registry

    ids = env_registry.ids()
    if settings.env not in ids:
        raise BenchError(f"unknown env {settings.env!r}; `agentgym-opd envs` lists them")
    if settings.eval_envs is not None:
        unknown = [e for e in settings.eval_envs if e not in ids]
        if unknown:
            raise BenchError(f"unknown eval env(s) {unknown}; `agentgym-opd envs` lists them")
        return [settings.env, *[e for e in settings.eval_envs if e != settings.env]]
    family = settings.env.split("/", 1)[0]
    chosen = [settings.env]
    for names in (SEEN_NAMES, UNSEEN_NAMES):
        match = next((f"{family}/{n}" for n in names if f"{family}/{n}" in ids and f"{family}/{n}" not in chosen), None)
        if match:
            chosen.append(match)
    return chosen


def algorithm_flags(name: str) -> tuple[bool, bool]:
    """(needs_teacher, needs_groups) of a registered algorithm (importing it: an import error fails its runs)."""
    from agentgym_opd.trainer import algorithm_class

    cls = algorithm_class(name)
    return bool(cls.needs_teacher), bool(cls.needs_groups)


def estimate_seconds(settings: BenchSettings, algos: list[str], n_eval_envs: int, *, warm: bool, teacher: bool,
                     workers: int = 1) -> float:
    """A rough wall-time forecast from per-episode costs measured on the 2-core build machine (one process
    per core: the jobs split over ``workers``, the warm start and the teacher side by side)."""
    sft_runs = [settings.warm_steps * warm, settings.teacher_steps * teacher]
    sft_steps = max(sft_runs) if workers > 1 else sum(sft_runs)
    train_tasks = min(settings.resolved_env_args().get("num_tasks", settings.eval_episodes), settings.eval_episodes)
    per_run_eval = (settings.eval_points * train_tasks + n_eval_envs * settings.eval_episodes) * SECONDS_PER_EVAL_EPISODE
    per_run_train = settings.budget * SECONDS_PER_ROLLOUT_EPISODE
    runs = len(algos) * len(settings.seeds)
    references = (1 + teacher) * n_eval_envs * settings.eval_episodes * SECONDS_PER_EVAL_EPISODE
    return (sft_steps * settings.sft_tasks_per_step * SECONDS_PER_EXPERT_EPISODE
            + (runs * (per_run_train + per_run_eval) + references) / max(workers, 1))


# ----------------------------------------------------------------------------------------------------
# Training: the cached SFT warm start / teacher, and one algorithm run
# ----------------------------------------------------------------------------------------------------


def _common_overrides(settings: BenchSettings, *, seed: int, output_dir: Path) -> list[str]:
    return [f"env={settings.env}", f"seed={seed}", f"output_dir={output_dir}", f"model.device={settings.device}",
            f"rollout.max_turns={settings.max_turns}", f"rollout.max_new_tokens={settings.max_new_tokens}"]


def _trainer(overrides: list[str], algorithm: str, settings: BenchSettings) -> Any:
    from agentgym_opd.config import load_config
    from agentgym_opd.trainer import Trainer, algorithm_class

    config = load_config(None, [f"algorithm={algorithm}", *overrides], algo_config_cls=algorithm_class(algorithm).Config)
    return Trainer(config, env_overrides=settings.resolved_env_args(), progress=settings.progress)


def final_model_dir(run_dir: Path) -> Path:
    latest = run_dir / "checkpoints" / "latest"
    return run_dir / "checkpoints" / latest.read_text(encoding="utf-8").strip() / "model"


def sft_checkpoint(settings: BenchSettings, run_dir: Path, *, steps: int, lr: float, context_fraction: float,
                   log: Callable[[str], None]) -> Path:
    """Train (or reuse) an SFT run of the base student; returns its final ``model/`` folder.

    Reuse needs the same settings, recorded in ``bench_key.json`` beside the run, so changing a knob can
    never silently hand back a stale checkpoint.
    """
    key = {"student": settings.student, "env": settings.env, "env_args": settings.resolved_env_args(),
           "steps": steps, "lr": lr, "context_fraction": context_fraction,
           "tasks_per_step": settings.sft_tasks_per_step, "max_turns": settings.max_turns,
           "max_new_tokens": settings.max_new_tokens, "seed": 0}
    key_file = run_dir / "bench_key.json"
    if key_file.is_file() and json.loads(key_file.read_text(encoding="utf-8")) == key:
        try:
            model = final_model_dir(run_dir)
            if (model / "config.json").is_file():
                log(f"reusing {run_dir.name} checkpoint {model}")
                return model
        except OSError:
            pass
    shutil.rmtree(run_dir, ignore_errors=True)
    log(f"training {run_dir.name}: SFT {steps} steps x {settings.sft_tasks_per_step} expert episodes, lr {lr}")
    overrides = _common_overrides(settings, seed=0, output_dir=run_dir) + [
        f"model.student={settings.student}", f"train.steps={steps}", f"train.lr={lr}",
        f"rollout.tasks_per_step={settings.sft_tasks_per_step}", f"algo.context_fraction={context_fraction}"]
    trainer = _trainer(overrides, "sft", settings)
    trainer.train()
    key_file.write_text(json.dumps(key, indent=2) + "\n", encoding="utf-8")
    return final_model_dir(run_dir)


# ----------------------------------------------------------------------------------------------------
# Jobs: the independent units of a bench, run in worker processes (one CPU thread each) or in-process
# ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SFTJob:
    """Train (or reuse) the warm start or the teacher: an SFT run of the base student."""

    name: str  # its folder under the bench output: warm_start / teacher
    steps: int
    lr: float
    context_fraction: float


@dataclass(frozen=True)
class ReferenceJob:
    """Evaluate a frozen checkpoint (the warm start or the teacher) on every split: a reference row."""

    name: str
    path: str
    label: str


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
    model_path: str | None = None  # SFTJob: the checkpoint's model folder
    messages: list[str] = field(default_factory=list)
    wall_s: float = 0.0
    error: str | None = None


def run_job(job: SFTJob | ReferenceJob | RunJob, context: JobContext) -> JobOutcome:
    """Run one job where it stands (this process); a worker process runs exactly this."""
    settings, out = context.settings, Path(context.settings.output_dir)
    started = time.perf_counter()
    outcome = JobOutcome(job.name, getattr(job, "seed", None))
    if isinstance(job, SFTJob):
        outcome.model_path = str(sft_checkpoint(settings, out / job.name, steps=job.steps, lr=job.lr,
                                                context_fraction=job.context_fraction, log=outcome.messages.append))
    elif isinstance(job, ReferenceJob):
        policy = load_frozen_policy(job.path, settings)
        for env_id in context.env_ids:
            episodes, wall = evaluate_policy(policy, env_id, settings, env_args=eval_env_args(env_id, settings))
            outcome.records.append(build_record(env_id, episodes, algorithm=job.name, student=job.label, teacher=None,
                                                algorithm_config={"bench": context.section}, seed=settings.eval_seed,
                                                wall_time_s=wall, curve=None))
    else:
        outcome.records, outcome.error = train_and_evaluate(job, context)
    outcome.wall_s = time.perf_counter() - started
    return outcome


def train_and_evaluate(job: RunJob, context: JobContext) -> tuple[list[dict[str, Any]], str | None]:
    """One algorithm x seed: (its records, None), or ([], the error) with the traceback in its run folder.

    The training curve here starts at the first in-training evaluation; the bench prepends point 0 (the
    warm start's success, measured by the warm start's own job).
    """
    settings = context.settings
    run_dir = Path(settings.output_dir) / "runs" / job.name / f"seed{job.seed}"
    shutil.rmtree(run_dir, ignore_errors=True)
    t0 = time.perf_counter()
    try:
        overrides = run_overrides(settings, job.name, seed=job.seed, run_dir=run_dir, student=context.student_path,
                                  teacher=context.teacher_path, needs_teacher=job.needs_teacher,
                                  needs_groups=job.needs_groups)
        trainer = _trainer(overrides, job.name, settings)
        algo_config = dict(trainer.config.algo)
        trainer.train()
        train_wall_s = time.perf_counter() - t0
        curve = training_curve(run_dir, settings.episodes_per_step)
        config = {"algo": algo_config, "bench": {**context.section, "train_wall_time_s": round(train_wall_s, 3)}}
        records = []
        for env_id in context.env_ids:
            # the trainer's evaluation policy: the student itself, or its unsharded copy under FSDP
            episodes, wall = evaluate_policy(trainer.eval_engine.policy, env_id, settings,
                                             env_args=eval_env_args(env_id, settings))
            records.append(build_record(env_id, episodes, algorithm=job.name, student=context.labels["student"],
                                        teacher=context.labels["teacher"] if job.needs_teacher else None,
                                        algorithm_config=config, seed=job.seed, wall_time_s=wall,
                                        curve=curve if env_id == settings.env else None))
        return records, None
    except BenchError:
        raise
    except Exception as err:  # the bench goes on; the row says why
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "error.txt").write_text(traceback.format_exc(), encoding="utf-8")
        return [], f"{type(err).__name__}: {err}"


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


def _steps_done(job: Any, out: Path) -> int:
    """Progress of a running job as seen from outside: the lines its trainer has logged so far."""
    if not isinstance(job, RunJob):
        return 0
    path = out / "runs" / job.name / f"seed{job.seed}" / "metrics.jsonl"
    try:
        with open(path, "rb") as fh:
            return sum(1 for _ in fh)
    except OSError:
        return 0


def run_jobs(jobs: list[Any], context: JobContext, *, workers: int, log: Callable[[str], None], out: Path) -> list[JobOutcome]:
    """Run the jobs (in ``workers`` processes, or here when 1); their outcomes in job order.

    Progress: one bar counting training steps (plus one unit per evaluation-only job), read from each
    running job's metrics.jsonl, and a line per finished job with the time it took and the time left.
    A run's own error is its outcome; anything else a job raises (a broken setup) is re-raised here.
    """
    from tqdm import tqdm

    if not jobs:
        return []
    settings = context.settings
    units = {i: settings.steps if isinstance(job, RunJob) else 1 for i, job in enumerate(jobs)}
    bar = tqdm(total=sum(units.values()), desc="bench", unit="step", disable=not settings.progress, leave=True)
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

    with bar:
        if workers <= 1:
            for i, job in enumerate(jobs):
                bar.set_description(f"bench {_job_label(job)}")
                finished(i, run_job(job, context))
                bar.update(units[i])
        else:
            import concurrent.futures as cf
            import multiprocessing

            quiet = dataclasses.replace(context, settings=dataclasses.replace(settings, progress=False))
            # spawn, not fork: the parent has torch (and maybe Ray, tokenizers) threads that fork would copy mid-state
            with cf.ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn"),
                                        initializer=_worker_init, initargs=(settings.threads,)) as pool:
                futures = {pool.submit(run_job, job, quiet): i for i, job in enumerate(jobs)}
                pending = set(futures)
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
                    running = [futures[f] for f in pending]
                    bar.n = (sum(units[i] for i in outcomes)
                             + sum(min(_steps_done(jobs[i], out), units[i]) for i in running))
                    bar.set_description(f"bench {len(outcomes)}/{len(jobs)} jobs")
                    bar.refresh()
    return [outcomes[i] for i in range(len(jobs))]


def run_overrides(settings: BenchSettings, name: str, *, seed: int, run_dir: Path, student: str,
                  teacher: str | None, needs_teacher: bool, needs_groups: bool) -> list[str]:
    """The run config of one algorithm x seed: the same steps and episodes per step for every algorithm."""
    group = settings.group_size if needs_groups else 1
    if group > settings.episodes_per_step or settings.episodes_per_step % group:
        raise BenchError(f"episodes_per_step={settings.episodes_per_step} must be a multiple of group_size={group}")
    every = max(1, settings.steps // max(settings.eval_points, 1))
    overrides = _common_overrides(settings, seed=seed, output_dir=run_dir) + [
        f"model.student={student}", f"train.steps={settings.steps}", f"train.lr={settings.lr}",
        f"rollout.tasks_per_step={settings.episodes_per_step // group}", f"rollout.group_size={group}",
        f"rollout.temperature={settings.temperature}", f"eval.every={every}",
        f"eval.episodes={settings.eval_episodes}",
        f"eval.seed={settings.eval_seed}"]
    if needs_teacher:
        if not teacher:
            raise BenchError(f"{name} needs a teacher and none was trained or given (--teacher PATH)")
        overrides.append(f"model.teacher={teacher}")
    return overrides + list(settings.overrides) + list(settings.algo_overrides.get(name, []))


def training_curve(run_dir: Path, episodes_per_step: int) -> list[dict[str, Any]]:
    """Success on the training tasks against rollout episodes so far, from the run's metrics.jsonl (its
    in-training evaluations; run_bench prepends point 0, the warm start's success)."""
    points = []
    path = run_dir / "metrics.jsonl"
    for line in path.read_text(encoding="utf-8").splitlines() if path.is_file() else []:
        row = json.loads(line)
        if "eval/success" in row:
            points.append({"rollouts": int(row["step"]) * episodes_per_step, "success_rate": float(row["eval/success"])})
    return points


# ----------------------------------------------------------------------------------------------------
# Evaluation: greedy episodes of one policy on one env split
# ----------------------------------------------------------------------------------------------------


def evaluate_policy(policy: Any, env_id: str, settings: BenchSettings, *, env_args: dict[str, Any]) -> tuple[list[Any], float]:
    """Greedy episodes on a fixed subset of the split's tasks; (episodes, wall seconds).

    The engine is built like the trainer's evaluation engine (same system prompt, action parser, greedy
    sampling), and the training env is scored on the trainer's own eval tasks (its first
    ``eval_episodes``), so the ``train`` row, the curve's point 0 and a training-time ``eval/success``
    mean the same thing. Other splits: the runner's evenly spaced subset, spread over task types.
    """
    from agentgym_opd.playing import play_tasks
    from agentgym_opd.policy.base import SamplingParams
    from agentgym_opd.registry import env_protocol, make
    from evaluation.runner import select_tasks

    started = time.perf_counter()
    overrides = {"max_turns": settings.max_turns, **env_args}
    probe = make(env_id, **overrides)
    ids = probe.task_ids()
    probe.close()
    tasks = ids[: settings.eval_episodes] if env_id == settings.env else select_tasks(ids, settings.eval_episodes)
    protocol = env_protocol(env_id)  # what the trainer uses too (the family's default parser and prompt)
    episodes = play_tasks(policy, env_id, tasks, sampling=SamplingParams(max_new_tokens=settings.max_new_tokens,
                                                                         temperature=0.0),
                          action_parser=protocol.action_parser, system_prompt=protocol.system_prompt,
                          seed=settings.eval_seed, batch_size=len(tasks), max_context_tokens=4096, env_kwargs=overrides)
    return episodes, time.perf_counter() - started


def eval_env_args(env_id: str, settings: BenchSettings) -> dict[str, Any]:
    """The training env keeps its constructor options (its task subset); other splits get their own tasks."""
    return settings.resolved_env_args() if env_id == settings.env else {}


def load_frozen_policy(path: str, settings: BenchSettings) -> Any:
    from agentgym_opd.config import load_config
    from agentgym_opd.policy.loading import load_student

    return load_student(path, load_config(None, [f"model.device={settings.device}"]).model, trainable=False)


# ----------------------------------------------------------------------------------------------------
# Records, leaderboard, table
# ----------------------------------------------------------------------------------------------------


def bench_section(settings: BenchSettings, **extra: Any) -> dict[str, Any]:
    return {"budget_episodes": settings.budget, "steps": settings.steps, "episodes_per_step": settings.episodes_per_step,
            "group_size": settings.group_size, "lr": settings.lr, "temperature": settings.temperature,
            "seeds": list(settings.seeds), "train_env": settings.env, "env_args": settings.resolved_env_args(),
            "warm_start": {"steps": settings.warm_steps, "lr": settings.warm_lr,
                           "context_fraction": settings.warm_context_fraction, "skipped": settings.skip_warm_start},
            "eval_episodes": settings.eval_episodes, "eval_seed": settings.eval_seed,
            "max_turns": settings.max_turns, "max_new_tokens": settings.max_new_tokens, **extra}


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
    from evaluation.records import RecordError

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


def format_table(summary: list[dict[str, Any]], failures: dict[str, str], env_ids: list[str], order: list[str]) -> str:
    """The terminal table: success rate (mean +- se over seeds) per env split, one line per algorithm."""
    cells: dict[str, dict[str, str]] = {}
    seeds: dict[str, str] = {}
    for row in summary:
        m = row["metrics"]["success_rate"]
        cells.setdefault(row["algorithm"], {})[row["env_id"]] = f"{m['mean']:.3f} +- {m['stderr']:.3f}"
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


# ----------------------------------------------------------------------------------------------------
# The pipeline
# ----------------------------------------------------------------------------------------------------


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
    log(f"bench: {len(flags)} algorithm(s) {list(flags)} x seeds {settings.seeds}, budget {settings.budget} rollout "
        f"episodes each ({settings.steps} steps x {settings.episodes_per_step}); eval on {env_ids}; "
        f"estimated wall time ~{estimate / 60:.1f} min with {workers} worker process(es)")

    # 1. warm start and teacher: two independent SFT runs of the base student (side by side with 2+ workers)
    base_name = settings.student if settings.student == "tiny" else Path(settings.student).name or settings.student
    sft_jobs = ([] if settings.skip_warm_start else
                [SFTJob("warm_start", settings.warm_steps, settings.warm_lr, settings.warm_context_fraction)])
    sft_jobs += [SFTJob("teacher", settings.teacher_steps, settings.teacher_lr, 0.0)] if train_teacher else []
    trained = {job.name: outcome.model_path for job, outcome in zip(sft_jobs, run_jobs(
        sft_jobs, JobContext(settings, env_ids, {}), workers=min(workers, len(sft_jobs)), log=log, out=out))}
    student_path, student_label = settings.student, base_name
    if "warm_start" in trained:
        student_path, student_label = trained["warm_start"], f"{base_name}+sft{settings.warm_steps}"
    teacher_path, teacher_label = settings.teacher, settings.teacher
    if "teacher" in trained:
        teacher_path, teacher_label = trained["teacher"], f"{base_name}+sft{settings.teacher_steps}"

    section = bench_section(settings)
    labels = {"student": student_label, "teacher": teacher_label}

    # 2. the reference rows (the warm start and the teacher, evaluated once: greedy has no seed to vary) and
    #    3. every algorithm x seed from the warm start with the same budget: independent jobs, run in parallel
    references = [("warm_start", student_path, student_label)] + ([("teacher", teacher_path, teacher_label)] if teacher_path else [])
    jobs = [ReferenceJob(name, path, label) for name, path, label in references]
    jobs += [RunJob(name, seed, *flags[name]) for name in flags for seed in settings.seeds]
    context = JobContext(settings, env_ids, section, student_path, teacher_path, labels)
    log(f"{len(jobs)} jobs on {min(workers, len(jobs))} worker process(es)")
    outcomes = run_jobs(jobs, context, workers=min(workers, len(jobs)), log=log, out=out)

    records: list[dict[str, Any]] = []
    start_success: float | None = None
    for job, outcome in zip(jobs, outcomes):
        if isinstance(job, ReferenceJob) and job.name == "warm_start":
            start_success = next(r["metrics"]["success_rate"]["mean"] for r in outcome.records if r["env_id"] == settings.env)
    results: list[JobOutcome] = []
    for job, outcome in zip(jobs, outcomes):  # job order, not finishing order: the same files for any --jobs
        if isinstance(job, RunJob):
            results.append(outcome)
            if outcome.error is not None:
                failures.setdefault(job.name, f"seed {job.seed}: {outcome.error}")
                continue
        for record in outcome.records:
            if isinstance(job, RunJob) and record["env_id"] == settings.env and start_success is not None:
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
    wall = time.perf_counter() - started
    summary = {"settings": dataclasses.asdict(settings), "eval_envs": env_ids, "student": student_label,
               "teacher": teacher_label, "rows": summary_rows, "failures": failures,
               "failed_runs": [{"algorithm": r.algorithm, "seed": r.seed, "error": r.error} for r in results if r.error],
               "workers": workers,
               "leaderboard": str(board), "leaderboard_error": board_error,
               "wall_time_s": round(wall, 1), "estimated_wall_time_s": round(estimate, 1)}
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    order = ["warm_start", *(["teacher"] if teacher_path else []), *algos]
    summary["table"] = format_table(summary_rows, failures, env_ids, order)
    return summary


def mean_success(summary: dict[str, Any], algorithm: str, env_id: str) -> float:
    """Convenience for scripts and tests: an algorithm's mean success on one env split, NaN if absent."""
    for row in summary["rows"]:
        if row["algorithm"] == algorithm and row["env_id"] == env_id:
            return row["metrics"]["success_rate"]["mean"]
    return math.nan
