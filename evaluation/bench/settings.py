"""What a bench run depends on (`BenchSettings`), what it runs (algorithms, eval splits) and how long it takes.

The per-algorithm hyper-parameters the sweep chose (`TUNED_OVERRIDES`), the held-out split names it looks
for, and the per-episode costs behind the wall-time forecast live here too: everything that is decided
before the first job starts.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

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
# beside another job), fitted to the default bench's wall time: 804 s on 2026-12-05, then 991 s at 915cc8e (an
# empty cache on a quiet machine, 2 workers; docs/speed.md), so both costs of that fit scaled by 991 / 802
SECONDS_PER_EVAL_EPISODE_BASE = 0.145
SECONDS_PER_ROLLOUT_EPISODE_BASE = 0.299


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
    # games one evaluation plays side by side (an ended game's slot goes to the next); None: a split's games all at
    # once. Memory grows with it (a SmolLM2 ALFWorld game ~33 MB); what a smaller batch costs in time is not measured
    eval_batch: int | None = None
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
    # household + the tiny student: the warm start is the base student of `evaluation.bench.base_models` (trained once
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
    # a named preset of `evaluation.bench.tracks` (e.g. "smollm2-alfworld"): its own base pair, env and budget
    track: str | None = None
    resume: bool = False  # keep each finished job's outcome (<out>/jobs) and skip jobs a killed run finished

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
        if not uses_base_models(self) or self.track:  # a track's pair needs no env options of its own
            return {}
        from evaluation.bench.base_models import base_env_args

        return base_env_args(self.base_specs()[0])

    @property
    def budget(self) -> int:
        return self.steps * self.episodes_per_step

    def base_specs(self) -> tuple[Any, Any]:
        """The (student, teacher) base model specs this bench uses (a track's own pair when ``track`` is set)."""
        from evaluation.bench.base_models import STUDENT_SPEC, TEACHER_SPEC

        student, teacher = STUDENT_SPEC, TEACHER_SPEC
        if self.track:
            from evaluation.bench.tracks import get_track

            student, teacher = get_track(self.track).student, get_track(self.track).teacher
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
    from evaluation.bench.base_models import cached_base_model, estimated_build_seconds

    specs = settings.base_specs()[: 2 if teacher else 1]
    builds = [estimated_build_seconds(spec) for spec in specs if cached_base_model(spec) is None]
    return (max(builds) if workers > 1 else sum(builds)) if builds else 0.0


def uses_base_models(settings: BenchSettings) -> bool:
    """Whether the bench starts from the household base pair (see BenchSettings.base_models)."""
    if settings.base_models not in ("auto", "off"):
        raise BenchError(f"base_models must be 'auto' or 'off', got {settings.base_models!r}")
    if settings.track:  # a track starts from its own pair
        return settings.base_models == "auto" and not settings.skip_warm_start
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
    costs = job_costs(settings, n_eval_envs)
    run_seconds = sum(costs.train_seconds(algo) + costs.run_eval for algo in algos) * len(settings.seeds)
    n_references = ((2 if base else 1) + teacher) if settings.references else 0
    return (sft_steps * settings.sft_tasks_per_step * SECONDS_PER_EXPERT_EPISODE
            + (run_seconds + n_references * costs.reference) / max(workers, 1))


@dataclass(frozen=True)
class JobCosts:
    """Forecast seconds (one process, one core) of a bench's jobs: what `estimate_seconds` adds up and what the
    progress bar weighs each job by, so its percentage and time left follow the work rather than a count."""

    run_train: float  # one algorithm x seed: its training (rollouts, teacher scoring, updates)
    run_eval: float  # ... and its evaluation (curve points, train tasks, held-out splits)
    reference: float  # a reference row: a frozen model on every split, every seed
    train_by_algo: dict[str, float] = field(default_factory=dict)  # algorithms whose training costs differ

    def train_seconds(self, algo: str) -> float:
        return self.train_by_algo.get(algo, self.run_train)


def job_costs(settings: BenchSettings, n_eval_envs: int) -> JobCosts:
    base = uses_base_models(settings)
    per_episode = SECONDS_PER_EVAL_EPISODE_BASE if base else SECONDS_PER_EVAL_EPISODE
    per_rollout = SECONDS_PER_ROLLOUT_EPISODE_BASE if base else SECONDS_PER_ROLLOUT_EPISODE
    by_algo: dict[str, float] = {}
    if settings.track:  # a real LM's episodes cost what the track measured
        from evaluation.bench.tracks import get_track

        track = get_track(settings.track)
        per_episode, per_rollout = track.episode_seconds
        by_algo = {algo: settings.budget * seconds for algo, seconds in track.rollout_seconds.items()}
    train_tasks = min(settings.resolved_env_args().get("num_tasks", settings.train_eval_episodes),
                      settings.train_eval_episodes)
    curve = 0 if curve_from_evaluations(settings) else settings.curve_episodes if base else train_tasks
    held_out = (n_eval_envs - 1) * settings.eval_episodes
    return JobCosts(run_train=settings.budget * per_rollout,
                    run_eval=(settings.eval_points * curve + train_tasks + held_out) * per_episode,
                    reference=(train_tasks + held_out * len(settings.seeds)) * per_episode,
                    train_by_algo=by_algo)


def curve_task_count(settings: BenchSettings) -> int:
    """The tasks each point of a run's training curve plays: ``curve_episodes`` of the curve env, or the training
    tasks the run is evaluated on where the curve is measured on the training env (the older path)."""
    return settings.curve_episodes if resolved_curve_env(settings) != settings.env else settings.train_eval_episodes


def curve_from_evaluations(settings: BenchSettings) -> bool:
    """Whether the training curves are read off the rows' own evaluations instead of played apart: with one point
    besides the start (``eval_points == 1``: the end of training) on held-out tasks that the row's evaluation of
    the curve env plays anyway (a track plays every unseen game, the curve's first 16 among them), the warm
    start's and each run's final policy would only replay games whose outcome the record already has."""
    curve_env = resolved_curve_env(settings)
    if settings.eval_points != 1 or curve_env == settings.env or curve_env not in evaluation_envs(settings):
        return False
    from evaluation.bench.episodes import curve_task_ids, eval_task_ids

    wanted = set(curve_task_ids(settings))
    return all(wanted <= set(eval_task_ids(curve_env, settings, seed)) for seed in settings.seeds)


def resolved_curve_env(settings: BenchSettings) -> str:
    """Where the training curves are measured: the unseen split with base models (held-out success against
    rollout episodes), else the training env (the older memorising bench)."""
    if settings.curve_env is not None:
        return settings.curve_env
    if uses_base_models(settings):
        unseen = evaluation_envs(settings)[-1]
        return unseen
    return settings.env


def longest_first(todo: list[int], forecast: dict[int, tuple[float, float]]) -> list[int]:
    """The order workers take jobs in: longest forecast first (ties in job order). Short jobs (a reference row's
    evaluation) then fill the end, instead of one long training run finishing alone while the others idle."""
    return sorted(todo, key=lambda i: -sum(forecast[i]))
