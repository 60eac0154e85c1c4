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
- Hyper-parameters: one shared lr and temperature (1e-4 and 1.0, for algorithms the sweep has not tuned), the
  per-algorithm values the sweep chose on valid_seen in ``TUNED_OVERRIDES`` (base-pair path), then the caller's
  ``--algo-set NAME:key=value`` (e.g. ``grpo:algo.kl_coef=0.01``).
- Warm start and teacher (default, household + the tiny student): the household base pair of
  ``evaluation.base_models``, trained once on the observable expert's demonstrations of the whole train
  split (with a share of prompts carrying a walkthrough, a successful sibling or failure feedback), cached
  by its settings and built by the bench's first run (its build time is printed apart and left out of the
  bench's wall time). The student is the smaller model, the teacher the larger one trained longer.
  ``--base-models off`` (or another env or student) keeps the older path: SFT runs of the base student
  cached under ``<out>/warm_start`` and ``<out>/teacher`` keyed by their settings (``bench_key.json``).
  Algorithm runs are never cached (so a rerun checks reproducibility).
- Rows beside the algorithms: ``warm_start``, ``warm_start+context`` (the same network with each task's
  privileged context in its first prompt: whether self-teachers can carry signal) and ``teacher``.
- Evaluation: greedy. Held-out splits (``valid_seen`` / ``valid_unseen`` where registered, else the first
  registered id of the family matching seen/unseen/valid/dev/test): ``eval_episodes`` tasks per seed, each
  seed its own block of the split (household generates as many tasks as needed), so 3 seeds x 100 episodes
  give a pooled 95% interval of at most +-0.057. The references (greedy, no seed) are evaluated once on
  the union. The ``train`` row: the training env's first ``train_eval_episodes`` tasks. Every cell has a
  Wilson 95% interval over its pooled episodes (``evaluation.bench_stats``); the paired tables give each
  method minus OPD and minus the warm start over the same (seed, task) episodes.
- Curves: held-out success (the unseen split's first ``curve_episodes`` tasks, as the trainer evaluates)
  against rollout episodes, ``eval_points`` in-training points plus point 0 (the warm start): 5 points.
- Records: one per algorithm x split x seed (the leaderboard's identity includes the seed, and its build
  aggregates seeds: mean of the seed means, standard error across seeds); the bench's own ``summary.json``
  holds the same aggregate per algorithm x split. ``wall_time_s`` is the evaluation's wall time (as the
  schema says); training wall time, the seed list and the budget are in ``algorithm_config["bench"]``.
  The training curve is attached to the records of the split it was measured on (the unseen split with
  base models, else ``train``). The references (greedy: evaluated once on the union of the seeds' tasks) get one record per
  seed holding that seed's tasks, so paired and per-seed views line up.
- The bench's leaderboard (``<out>/leaderboard``) is owned by the bench: a rerun replaces records of the
  same run identity. ``--publish`` adds to the repo's ``leaderboard/`` and never replaces: a duplicate is
  reported and skipped.
- ``--quick``: 4 steps x 4 episodes, ONE seed, 12 episodes per held-out split, 4 on the training tasks and
  per curve point (older path: 4 training tasks, 4 episodes per split, warm start 60 / teacher 120 SFT
  steps, 8 turns). Torch runs on one CPU thread by default (``--threads``): 10x faster than two
  threads on the shared build machine (same greedy actions in that probe).
- Exit codes: 0 ok, 1 an algorithm failed or the leaderboard build failed (results saved), 2 bad setup.
- Cost and what was measured: README's Results section. The per-episode constants of the time estimate
  below are the older bench's and underestimate 30-turn household episodes.
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
# per-algorithm values chosen by `scripts/sweep_bench.py` on household/valid_seen (README "Results": the sweep,
# 2026-12-05, lr in {3e-5, 1e-4, 3e-4} x each method's main knob at temperature 1.0, from the base student
# halfway through its schedule at 20 turns); the lr first, then any knob that differs from the method's default.
# They apply on the base-pair path after the shared --lr/--temperature, before any --algo-set. An algorithm
# without an entry was not swept and uses the shared values.
TUNED_OVERRIDES: dict[str, list[str]] = {
    "opd": ["train.lr=0.0001"], "sage_opd": ["train.lr=0.0003"], "vpd": ["train.lr=3e-05"],
    "opsd": ["train.lr=3e-05"], "sdpo": ["train.lr=0.0001"], "lopd": ["train.lr=0.0003"],
    "grpo": ["train.lr=0.0003", "algo.kl_coef=0.01"], "sft": ["train.lr=0.0003"],
}
SEEN_NAMES = ("valid_seen", "seen", "valid", "dev", "test")
UNSEEN_NAMES = ("valid_unseen", "unseen", "test")
# measured on the shared 2-core build machine under load (tiny student, household, <= 10 turns x 16 tokens,
# one torch thread): seconds per episode, the update step included for training episodes
SECONDS_PER_EXPERT_EPISODE = 0.12
SECONDS_PER_ROLLOUT_EPISODE = 0.9
SECONDS_PER_EVAL_EPISODE = 0.45
# the household base pair (20-turn episodes with the status line; CPU seconds of one process, one torch thread,
# beside another job), fitted to the bench at its defaults on 2026-12-05 (804 s wall, 2 workers; the 1200-step
# student): both per-episode costs of the 30-turn fit of 2026-12-04 scaled by 804 / 1164, the wall time over
# what they forecast (an algorithm job took 34-100 s, the three reference jobs 55-80 s)
SECONDS_PER_EVAL_EPISODE_BASE = 0.117
SECONDS_PER_ROLLOUT_EPISODE_BASE = 0.242


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
    lr: float = 1e-4  # shared; the swept algorithms' own values (valid_seen, README) are in TUNED_OVERRIDES
    temperature: float = 1.0
    eval_points: int = 4  # evaluations during training (the curve), besides step 0
    eval_episodes: int = 100  # per held-out split and seed (3 seeds: a 95% half-width <= 0.06 per cell)
    eval_seed: int = 0
    warm_steps: int = 70
    warm_lr: float = 3e-3
    warm_context_fraction: float = 0.5
    teacher_steps: int = 200
    teacher_lr: float = 3e-3
    sft_tasks_per_step: int = 8
    # household: the observable expert finishes 72% of valid_unseen within 20 turns (96.5% within 30), the
    # walkthrough every task within 12: searching has to be efficient, and a plan in context pays
    max_turns: int = 20
    max_new_tokens: int = 16
    device: str = "auto"
    threads: int | None = 1  # torch CPU threads per process; None = torch's default (see run_bench)
    jobs: int | None = None  # worker processes for independent runs; None = default_workers()
    overrides: list[str] = field(default_factory=list)  # key=value for every algorithm run
    algo_overrides: dict[str, list[str]] = field(default_factory=dict)  # per algorithm
    skip_warm_start: bool = False
    references: bool = True  # evaluate the warm start, warm start + context and teacher rows (a sweep skips them)
    # household + the tiny student: the warm start is the base student of `evaluation.base_models` (trained once
    # on the observable expert's demonstrations of the whole train split) and the teacher its larger sibling;
    # "off" keeps the older path (an SFT warm start and teacher trained by the bench itself: it memorises 8
    # training tasks and solves no held-out one, so it cannot rank methods on held-out tasks).
    base_models: str = "auto"
    base_steps: int | None = None  # None: the specs' own (STUDENT_SPEC / TEACHER_SPEC); N: student N, the rest scaled
    base_train_tasks: int | None = None  # None: the specs' own (the whole train split)
    train_eval_episodes: int = 32  # episodes on the training env's own tasks (the `train` row)
    curve_env: str | None = None  # None: the unseen split with base models, else the training env
    curve_episodes: int = 32  # greedy episodes per curve point (the env's first tasks, as the trainer evaluates)
    output_dir: str = "runs/bench"
    publish: bool = False
    progress: bool = True

    @classmethod
    def quick(cls, **changes: Any) -> "BenchSettings":
        """A ~2-3 minute smoke bench (idle 2-core machine, base models cached): 4 steps, one seed, 12 episodes
        per held-out split, 4 on the training tasks and per curve point (older path: 4 tasks, 8 turns)."""
        base = dict(env_args=None, seeds=[0], steps=4, episodes_per_step=4, group_size=2, eval_points=2,
                    eval_episodes=12, train_eval_episodes=4, curve_episodes=4, warm_steps=60, teacher_steps=120,
                    sft_tasks_per_step=4)
        base.update(changes)
        settings = cls(**base)
        if "max_turns" not in changes and not uses_base_models(settings):
            settings.max_turns, settings.eval_episodes = 8, changes.get("eval_episodes", 4)
        if settings.env_args is None and settings.env in DEFAULT_ENV_ARGS and not uses_base_models(settings):
            settings.env_args = {"num_tasks": 4}
        return settings

    @classmethod
    def full(cls, **changes: Any) -> "BenchSettings":
        """The defaults. The SFT path (``base_models="off"``) keeps its own sizes, 10 turns and 8 episodes per
        held-out split: the base pair's 20 turns and 100 episodes per seed cost hours on 2 cores and only pay
        once a student can solve held-out tasks."""
        settings = cls(**changes)
        if not uses_base_models(settings):
            settings.max_turns = changes.get("max_turns", 10)
            settings.eval_episodes = changes.get("eval_episodes", 8)
        return settings

    def resolved_env_args(self) -> dict[str, Any]:
        if self.env_args is not None:
            return {**self.base_env_args(), **self.env_args}
        return self.base_env_args() if uses_base_models(self) else dict(DEFAULT_ENV_ARGS.get(self.env, {}))

    def base_env_args(self) -> dict[str, Any]:
        """The env options the base pair was trained with (its status line), for every env the bench makes."""
        if not uses_base_models(self):
            return {}
        from evaluation.base_models import base_env_args

        return base_env_args(self.base_specs()[0])

    @property
    def budget(self) -> int:
        return self.steps * self.episodes_per_step

    def base_specs(self) -> tuple[Any, Any]:
        """The (student, teacher) base model specs this bench uses."""
        from evaluation.base_models import STUDENT_SPEC, TEACHER_SPEC

        student, teacher = STUDENT_SPEC, TEACHER_SPEC
        if self.base_steps is not None:  # the pair's shape kept: the student's schedule, the teacher's ratio
            scale = self.base_steps / student.steps
            student, teacher = scaled_steps(student, scale), scaled_steps(teacher, scale)
        if self.base_train_tasks is not None:
            student = dataclasses.replace(student, train_tasks=self.base_train_tasks)
            teacher = dataclasses.replace(teacher, train_tasks=self.base_train_tasks)
        if teacher.history_model is not None:  # the teacher learns from this bench's student's own turns
            teacher = dataclasses.replace(teacher, history_model=student)
        return student, teacher


def scaled_steps(spec: Any, scale: float) -> Any:
    """``spec`` trained ``scale`` times as long, its schedule stretched alike (a student stopped halfway through
    its schedule stays halfway); the warm-up is capped by the new length."""
    def scaled(n: int) -> int:
        return max(1, round(n * scale))

    return dataclasses.replace(spec, steps=scaled(spec.steps), warmup_steps=min(spec.warmup_steps, scaled(spec.steps)),
                               schedule_steps=scaled(spec.schedule_steps) if spec.schedule_steps else None)


def base_build_estimate(settings: BenchSettings, *, teacher: bool, workers: int) -> float:
    """Seconds the base pair's build will take before the bench proper: 0 when both models are shipped or
    cached; the two builds run side by side with 2+ workers."""
    if not uses_base_models(settings):
        return 0.0
    from evaluation.base_models import cached_base_model, estimated_build_seconds

    specs = settings.base_specs()[: 2 if teacher else 1]
    builds = [estimated_build_seconds(spec) for spec in specs if cached_base_model(spec) is None]
    return (max(builds) if workers > 1 else sum(builds)) if builds else 0.0


def uses_base_models(settings: BenchSettings) -> bool:
    """Whether the bench starts from the household base pair (see BenchSettings.base_models)."""
    if settings.base_models not in ("auto", "off"):
        raise BenchError(f"base_models must be 'auto' or 'off', got {settings.base_models!r}")
    return (settings.base_models == "auto" and settings.env.startswith("household/") and settings.student == "tiny"
            and not settings.skip_warm_start)


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
    per core: the jobs split over ``workers``, the warm start and the teacher side by side). The base pair's
    one-time build is not included (it is timed and printed apart)."""
    base = uses_base_models(settings)
    sft_runs = [settings.warm_steps * warm, settings.teacher_steps * teacher]
    sft_steps = 0 if base else (max(sft_runs) if workers > 1 else sum(sft_runs))
    per_episode = SECONDS_PER_EVAL_EPISODE_BASE if base else SECONDS_PER_EVAL_EPISODE
    train_tasks = min(settings.resolved_env_args().get("num_tasks", settings.train_eval_episodes),
                      settings.train_eval_episodes)
    curve = settings.curve_episodes if base else train_tasks
    held_out = (n_eval_envs - 1) * settings.eval_episodes
    per_run_eval = (settings.eval_points * curve + train_tasks + held_out) * per_episode
    per_run_train = settings.budget * (SECONDS_PER_ROLLOUT_EPISODE_BASE if base else SECONDS_PER_ROLLOUT_EPISODE)
    runs = len(algos) * len(settings.seeds)
    n_references = ((2 if base else 1) + teacher) if settings.references else 0
    references = n_references * (train_tasks + held_out * len(settings.seeds)) * per_episode
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
    eval_env = config.eval.env or config.env
    return Trainer(config, env_overrides=settings.resolved_env_args(), progress=settings.progress,
                   eval_env_overrides={"max_turns": settings.max_turns, **eval_env_args(eval_env, settings)})


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
           "steps": steps, "lr": lr, "context_fraction": context_fraction, "expert": "walkthrough",
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
        f"rollout.tasks_per_step={settings.sft_tasks_per_step}", f"algo.context_fraction={context_fraction}",
        # the older path memorises its few training tasks in 8-10 turns: the optimal plan, not the searching expert
        "algo.expert=walkthrough"]
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
class BaseModelJob:
    """Build (or reuse) one base model of `evaluation.base_models` (the one-time build, timed apart)."""

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
    started = time.perf_counter()
    outcome = JobOutcome(job.name, getattr(job, "seed", None))
    if isinstance(job, SFTJob):
        outcome.model_path = str(sft_checkpoint(settings, out / job.name, steps=job.steps, lr=job.lr,
                                                context_fraction=job.context_fraction, log=outcome.messages.append))
    elif isinstance(job, BaseModelJob):
        from evaluation.base_models import ensure_base_model

        outcome.model_path = str(ensure_base_model(job.spec, progress=settings.progress, log=outcome.messages.append,
                                                   progress_file=_build_progress_file(job, out)))
    elif isinstance(job, ReferenceJob):
        policy = load_frozen_policy(job.path, settings)
        for env_id in context.env_ids:
            by_seed, by_task, wall = evaluate_every_seed(policy, env_id, settings, with_context=job.context)
            outcome.outcomes[env_id] = {(seed, t): float(by_task[t].success) for seed, ids in by_seed.items() for t in ids}
            for seed, ids in by_seed.items():  # one record per seed (its tasks), like the trained rows
                outcome.records.append(build_record(
                    env_id, [by_task[t] for t in ids], algorithm=job.name, student=job.label, teacher=None,
                    algorithm_config={"bench": {**context.section, "context": job.context}}, seed=seed,
                    wall_time_s=wall * len(ids) / len(by_task), curve=None))
        if job.curve:
            curve_env = resolved_curve_env(settings)
            env_args = eval_env_args(curve_env, settings)
            ids = make_env(curve_env, settings, env_args).task_ids()[: settings.curve_episodes]
            episodes, _ = evaluate_policy(policy, curve_env, settings, env_args=env_args, tasks=ids)
            outcome.curve_start = sum(e.success for e in episodes) / len(episodes)
    else:
        outcome.records, outcome.error, outcome.outcomes = train_and_evaluate(job, context)
    outcome.wall_s = time.perf_counter() - started
    return outcome


def train_and_evaluate(job: RunJob, context: JobContext) -> tuple[list[dict[str, Any]], str | None, dict[str, Any]]:
    """One algorithm x seed: (its records, None, outcomes per env), or ([], the error, {}) with the traceback in
    its run folder.

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
        records, outcomes = [], {}
        curve_env = resolved_curve_env(settings)
        for env_id in context.env_ids:
            # the trainer's evaluation policy: the student itself, or its unsharded copy under FSDP
            episodes, wall = evaluate_policy(trainer.eval_engine.policy, env_id, settings,
                                             env_args=eval_env_args(env_id, settings),
                                             tasks=eval_task_ids(env_id, settings, job.seed))
            outcomes[env_id] = {(job.seed, e.task.id): float(e.success) for e in episodes}
            records.append(build_record(env_id, episodes, algorithm=job.name, student=context.labels["student"],
                                        teacher=context.labels["teacher"] if job.needs_teacher else None,
                                        algorithm_config=config, seed=job.seed, wall_time_s=wall,
                                        curve=curve if env_id == curve_env else None))
        return records, None, outcomes
    except BenchError:
        raise
    except Exception as err:  # the bench goes on; the row says why
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "error.txt").write_text(traceback.format_exc(), encoding="utf-8")
        return [], f"{type(err).__name__}: {err}", {}


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
    """A job's share of the progress bar: its training steps (a base model's build steps when it must be built)."""
    if isinstance(job, RunJob):
        return settings.steps
    if isinstance(job, BaseModelJob):
        from evaluation.base_models import cached_base_model

        return 1 if cached_base_model(job.spec) is not None else job.spec.steps
    return 1


def _steps_done(job: Any, out: Path) -> int:
    """Progress of a running job as seen from outside: the lines its trainer has logged so far, or the steps a
    base model's build has written to its progress file."""
    if isinstance(job, BaseModelJob):
        try:
            return int((out / "base_builds" / f"{job.name}.progress").read_text(encoding="utf-8").strip() or 0)
        except (OSError, ValueError):
            return 0
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
    units = {i: _job_units(job, settings) for i, job in enumerate(jobs)}
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
                    names = ", ".join(_job_label(jobs[i]) for i in sorted(running)[:3]) + (", ..." if len(running) > 3 else "")
                    bar.set_description(f"bench {len(outcomes)}/{len(jobs)} jobs (running: {names})" if running
                                        else f"bench {len(outcomes)}/{len(jobs)} jobs")
                    bar.refresh()
    return [outcomes[i] for i in range(len(jobs))]


def run_overrides(settings: BenchSettings, name: str, *, seed: int, run_dir: Path, student: str,
                  teacher: str | None, needs_teacher: bool, needs_groups: bool) -> list[str]:
    """The run config of one algorithm x seed: the same steps and episodes per step for every algorithm."""
    group = settings.group_size if needs_groups else 1
    if group > settings.episodes_per_step or settings.episodes_per_step % group:
        raise BenchError(f"episodes_per_step={settings.episodes_per_step} must be a multiple of group_size={group}")
    every = max(1, settings.steps // max(settings.eval_points, 1))
    curve_env = resolved_curve_env(settings)
    curve_episodes = settings.curve_episodes if curve_env != settings.env else settings.train_eval_episodes
    overrides = _common_overrides(settings, seed=seed, output_dir=run_dir) + [
        f"model.student={student}", f"train.steps={settings.steps}", f"train.lr={settings.lr}",
        f"rollout.tasks_per_step={settings.episodes_per_step // group}", f"rollout.group_size={group}",
        f"rollout.temperature={settings.temperature}", f"eval.every={every}",
        f"eval.episodes={curve_episodes}", f"eval.env={curve_env}",
        f"eval.seed={settings.eval_seed}"]
    if needs_teacher:
        if not teacher:
            raise BenchError(f"{name} needs a teacher and none was trained or given (--teacher PATH)")
        overrides.append(f"model.teacher={teacher}")
    tuned = TUNED_OVERRIDES.get(name, []) if uses_base_models(settings) else []
    return overrides + list(settings.overrides) + tuned + list(settings.algo_overrides.get(name, []))


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


def evaluate_policy(policy: Any, env_id: str, settings: BenchSettings, *, env_args: dict[str, Any],
                    tasks: list[str] | None = None, with_context: bool = False) -> tuple[list[Any], float]:
    """Greedy episodes on a fixed subset of the split's tasks; (episodes, wall seconds).

    The engine is built like the trainer's evaluation engine (same system prompt, action parser, greedy
    sampling), and the training env is scored on the trainer's own eval tasks (its first
    ``eval_episodes``), so the ``train`` row, the curve's point 0 and a training-time ``eval/success``
    mean the same thing. Other splits: the runner's evenly spaced subset, spread over task types.
    ``tasks`` (default: ``eval_task_ids`` of the first seed) chooses them explicitly; ``with_context`` shows
    each task's privileged context after the first observation, as a self-teacher sees it.
    """
    from agentgym_opd.playing import play_tasks
    from agentgym_opd.policy.base import SamplingParams
    from agentgym_opd.registry import env_protocol

    started = time.perf_counter()
    if tasks is None:
        tasks = eval_task_ids(env_id, settings, settings.seeds[0])
    overrides = {"max_turns": settings.max_turns, **env_args}
    contexts = None
    if with_context:
        probe = make_env(env_id, settings, env_args)
        contexts = privileged_contexts(probe, tasks)
        probe.close()
    from evaluation.records import BENCH_CONTEXT_TOKENS

    protocol = env_protocol(env_id)  # what the trainer uses too (the family's default parser and prompt)
    episodes = play_tasks(policy, env_id, tasks, sampling=SamplingParams(max_new_tokens=settings.max_new_tokens,
                                                                         temperature=0.0),
                          action_parser=protocol.action_parser, system_prompt=protocol.system_prompt,
                          seed=settings.eval_seed, batch_size=len(tasks), max_context_tokens=BENCH_CONTEXT_TOKENS,
                          env_kwargs=overrides, contexts=contexts)
    return episodes, time.perf_counter() - started


def privileged_contexts(env: Any, tasks: list[str]) -> list[str | None]:
    """Each task's privileged context as the ``warm_start+context`` row shows it after the first observation."""
    from agentgym_opd.distill import privileged_text

    return [privileged_text(env.get_task(t)) for t in tasks]


def make_env(env_id: str, settings: BenchSettings, env_args: dict[str, Any]) -> Any:
    from agentgym_opd.registry import make

    return make(env_id, **{"max_turns": settings.max_turns, **env_args})


def evaluate_every_seed(policy: Any, env_id: str, settings: BenchSettings, *,
                        with_context: bool = False) -> tuple[dict[int, list[str]], dict[str, Any], float]:
    """Every seed's tasks played greedily once: (task ids per seed, episode per task id, wall seconds). Greedy
    decoding has no seed, so one evaluation of the union of the seeds' tasks serves them all."""
    by_seed = {seed: eval_task_ids(env_id, settings, seed) for seed in settings.seeds}
    tasks = list(dict.fromkeys(t for ids in by_seed.values() for t in ids))  # seeds 16 apart share tasks
    episodes, wall = evaluate_policy(policy, env_id, settings, env_args=eval_env_args(env_id, settings), tasks=tasks,
                                     with_context=with_context)
    return by_seed, {e.task.id: e for e in episodes}, wall


def eval_task_ids(env_id: str, settings: BenchSettings, seed: int) -> list[str]:
    """The tasks a seed is evaluated on: the training env's first ``train_eval_episodes`` (the trainer's own
    eval tasks); on other splits ``eval_episodes`` tasks spread evenly over the seed's share of the split
    (household: seed s takes the (s mod 16)-th block of ``eval_episodes`` consecutive tasks, which cycle
    through the six task types, so different seeds add different held-out tasks and a seed's tasks do not
    depend on which other seeds run; other families: the same evenly spaced subset for every seed)."""
    from evaluation.runner import bench_task_ids

    ids = make_env(env_id, settings, eval_env_args(env_id, settings)).task_ids()
    if env_id == settings.env:
        return ids[: settings.train_eval_episodes]
    return bench_task_ids(env_id, ids, seed, settings.eval_episodes)


def resolved_curve_env(settings: BenchSettings) -> str:
    """Where the training curves are measured: the unseen split with base models (held-out success against
    rollout episodes), else the training env (the older memorising bench)."""
    if settings.curve_env is not None:
        return settings.curve_env
    if uses_base_models(settings):
        unseen = evaluation_envs(settings)[-1]
        return unseen
    return settings.env


def eval_env_args(env_id: str, settings: BenchSettings) -> dict[str, Any]:
    """The training env keeps its constructor options (its task subset); other splits get their own tasks,
    enough of them (household generates any number) that every seed has ``eval_episodes`` of its own."""
    if env_id == settings.env:
        return settings.resolved_env_args()
    if env_id.startswith("household/"):
        from evaluation.runner import bench_split_args

        return {**bench_split_args(env_id, settings.seeds, settings.eval_episodes), **settings.base_env_args()}
    return {}


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


def pooled_outcomes(jobs: list[Any], outcomes: list[JobOutcome]) -> dict[str, dict[str, dict[tuple[int, str], float]]]:
    """Per algorithm and env: {(seed, task): success} of every evaluation episode, all seeds together."""
    pooled: dict[str, dict[str, dict[tuple[int, str], float]]] = {}
    for job, outcome in zip(jobs, outcomes):
        for env_id, episodes in outcome.outcomes.items():
            pooled.setdefault(job.name, {}).setdefault(env_id, {}).update(episodes)
    return pooled


def interval_cells(pooled: dict[str, dict[str, dict[tuple[int, str], float]]]) -> dict[str, dict[str, dict[str, float]]]:
    """Per algorithm and env: pooled success with its Wilson 95% interval (`evaluation.bench_stats`).

    A reference row (greedy, evaluated once) counts each distinct task once; a trained row counts every
    (seed, task) episode."""
    from evaluation.bench_stats import proportion_cell

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
    from evaluation.bench_stats import paired_difference

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
    from evaluation.bench_stats import format_difference

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
    from evaluation.base_models import base_label

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
    jobs: list[Any] = []
    if settings.references:
        jobs.append(ReferenceJob("warm_start", student_path, student_label, curve=base))
        if base:  # can the student's own network use privileged context (what every self-teacher relies on)?
            jobs.append(ReferenceJob("warm_start+context", student_path, student_label, context=True))
        jobs += [ReferenceJob("teacher", teacher_path, teacher_label)] if teacher_path else []
    jobs += [RunJob(name, seed, *flags[name]) for name in flags for seed in settings.seeds]
    context = JobContext(settings, env_ids, section, student_path, teacher_path, labels)
    log(f"{len(jobs)} jobs on {min(workers, len(jobs))} worker process(es)")
    outcomes = run_jobs(jobs, context, workers=min(workers, len(jobs)), log=log, out=out)

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
    from evaluation.claims import check_claims, format_claims

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


def mean_success(summary: dict[str, Any], algorithm: str, env_id: str) -> float:
    """Convenience for scripts and tests: an algorithm's mean success on one env split, NaN if absent."""
    for row in summary["rows"]:
        if row["algorithm"] == algorithm and row["env_id"] == env_id:
            return row["metrics"]["success_rate"]["mean"]
    return math.nan
