"""Training inside a bench: the run config of one algorithm x seed, the older path's cached SFT warm start and
teacher, the trained policy kept for evaluation (the rest of training's memory let go), and the training curve,
time and diagnostics read back from a run's metrics."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any, Callable

from evaluation.bench.episodes import eval_env_args
from evaluation.bench.settings import (TUNED_OVERRIDES, BenchError, BenchSettings, curve_from_evaluations,
                                       curve_task_count, resolved_curve_env, uses_base_models)


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


def trained_policy(trainer: Any) -> Any:
    """The trainer's evaluation policy (the student itself, or its unsharded copy under FSDP), for a bench that
    evaluates once training is over: the last step's gradients are dropped here, and the caller drops the trainer,
    which lets go of the optimiser's moments, the teacher(s) and the training envs (for SmolLM2 1.6 GB of AdamW
    moments and gradients alone; a split of 140 ALFWorld games side by side needs about 4.6 GB), then
    `release_freed_memory`.

    Under autocast the student is frozen here and its projections stored in the autocast dtype, as the
    reference rows' frozen checkpoints are (`precision.store_frozen_projections`): the same products (autocast
    rounds each weight to bf16 anyway), without casting 135M float32 weights at every generate call, and half
    the weights' memory."""
    from agentgym_opd.policy.precision import autocast_of, store_frozen_projections

    policy = trainer.eval_engine.policy
    for parameter in trainer.student.model.parameters():
        parameter.grad = None
    for env in trainer.envs:
        env.close()
    if autocast_of(policy.model) is not None:
        policy.model.requires_grad_(False)
        store_frozen_projections(policy.model)
    return policy


def release_freed_memory() -> None:
    """Collect what the dropped objects held and hand the freed heap back to the OS (glibc keeps freed small and
    medium blocks otherwise, so a worker's resident size would stay at its training peak)."""
    import gc

    from agentgym_opd.heap import trim_heap

    gc.collect()
    trim_heap()


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


def run_overrides(settings: BenchSettings, name: str, *, seed: int, run_dir: Path, student: str,
                  teacher: str | None, needs_teacher: bool, needs_groups: bool) -> list[str]:
    """The run config of one algorithm x seed: the same steps and episodes per step for every algorithm."""
    group = settings.group_size if needs_groups else 1
    if group > settings.episodes_per_step or settings.episodes_per_step % group:
        raise BenchError(f"episodes_per_step={settings.episodes_per_step} must be a multiple of group_size={group}")
    # no evaluation during training where the curve's one point is read off the row's own evaluation
    every = 0 if curve_from_evaluations(settings) else max(1, settings.steps // max(settings.eval_points, 1))
    curve_env = resolved_curve_env(settings)
    curve_episodes = curve_task_count(settings)
    overrides = _common_overrides(settings, seed=seed, output_dir=run_dir) + [
        f"model.student={student}", f"train.steps={settings.steps}", f"train.lr={settings.lr}",
        f"rollout.tasks_per_step={settings.episodes_per_step // group}", f"rollout.group_size={group}",
        f"rollout.temperature={settings.temperature}", f"eval.every={every}",
        f"eval.episodes={curve_episodes}", f"eval.env={curve_env}",
        f"eval.seed={settings.eval_seed}"]
    if settings.resume:  # a killed run continues from its newest checkpoint (`jobs.train_and_evaluate`); keep one
        overrides += ["train.checkpoint_every=1", "train.keep_checkpoints=1"]
    if needs_teacher:
        if not teacher:
            raise BenchError(f"{name} needs a teacher and none was trained or given (--teacher PATH)")
        overrides.append(f"model.teacher={teacher}")
    # swept for the household pair; a track sets its own values in its overrides
    tuned = TUNED_OVERRIDES.get(name, []) if uses_base_models(settings) and not settings.track else []
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


def steps_seconds(run_dir: Path) -> float:
    """Rollout and update seconds of the steps in a run's metrics.jsonl (a resumed run's earlier training)."""
    path = run_dir / "metrics.jsonl"
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()] if path.is_file() else []
    return sum(float(r.get("rollout_s", 0.0)) + float(r.get("update_s", 0.0)) for r in rows)


TRAIN_SECONDS_FILE = "train_wall_s"  # in a run folder: the whole training's wall seconds, kept once it finished


def finished_training_seconds(run_dir: Path, measured: float) -> float:
    """The training's wall seconds: what the run folder kept when its training finished, else ``measured``,
    which it then keeps. A bench that resumes after the training ended so reports the first sitting's whole
    time (model loading and checkpoints included), not the smaller sum of its steps' seconds."""
    path = run_dir / TRAIN_SECONDS_FILE
    try:
        return float(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        if run_dir.is_dir():
            path.write_text(f"{measured:.3f}", encoding="utf-8")
        return measured


def run_diagnostics(run_dir: Path) -> dict[str, float]:
    """The record's ``training`` diagnostics from a run's metrics.jsonl (`evaluation.judge_diagnostics.training_diagnostics`)."""
    from evaluation.judge_diagnostics import training_diagnostics

    path = run_dir / "metrics.jsonl"
    lines = path.read_text(encoding="utf-8").splitlines() if path.is_file() else []
    return training_diagnostics([json.loads(line) for line in lines if line.strip()])
