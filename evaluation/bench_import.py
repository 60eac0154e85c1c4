"""Publishing a finished bench: its records, stamped with provenance, budget and kept episodes.

`agentgym-opd leaderboard import-bench OUT_DIR` reads a bench output folder (``summary.json``,
``records/``, the checkpoints under ``runs/``, ``warm_start/``, ``teacher/``) and adds every record to the
leaderboard with:

- ``provenance``: package versions, the hash of the evaluated tasks (the bench's own task selection),
  the chat-template and weights hashes of the evaluated checkpoint, the bench command that reproduces
  it (rebuilt from the bench's settings), the seeds and the device;
- ``budget``: the run's rollout episodes and the agent tokens it generated in training (summed from
  its ``metrics.jsonl``);
- ``episodes`` (held-out split only, ``--episodes`` of them): the first evaluation episodes replayed
  greedily exactly as the bench played them, turn by turn; for methods whose teacher is a separate
  frozen model (OPD, SAGE-OPD) each agent token carries the per-token divergence the method's loss
  computes, and SAGE-OPD's turn labels and weights. Self-teachers that train or drift (OPSD/SDPO in EMA
  or frozen mode, LOPD's composer, VPD's E-step teacher) are not rebuilt from a final checkpoint here:
  their traces carry tokens without a divergence. The bench can fill every method's divergences by
  calling :func:`evaluation.episode_trace.capture_eval_traces` with the live ``trainer.algorithm``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

from evaluation.records import REFERENCE_ROWS, RecordError

# algorithms whose teacher, at the end of training, is exactly a checkpoint the bench keeps
TEACHER_FROM_CHECKPOINT = ("opd", "sage_opd")
# bench settings -> the `agentgym-opd bench` flag that sets them
FLAGS = {"steps": "--steps", "episodes_per_step": "--episodes-per-step", "group_size": "--group-size", "lr": "--lr",
         "temperature": "--temperature", "eval_episodes": "--eval-episodes", "max_turns": "--max-turns",
         "warm_steps": "--warm-steps", "teacher_steps": "--teacher-steps", "student": "--student",
         "teacher": "--teacher", "env": "--env", "base_models": "--base-models", "base_steps": "--base-steps",
         "base_train_tasks": "--base-train-tasks"}
# settings with no flag: a bench that changed them cannot be rebuilt as a command
NO_FLAG = ("eval_points", "eval_seed", "warm_lr", "warm_context_fraction", "teacher_lr", "sft_tasks_per_step", "max_new_tokens")


def bench_command(settings: dict[str, Any]) -> list[str]:
    """The `agentgym-opd bench` argv that means these settings (``--quick`` when it is the closer base)."""
    from evaluation.bench import BenchSettings

    quick = BenchSettings.quick(env=settings["env"]).__dict__
    full = BenchSettings.full(env=settings["env"]).__dict__
    differs = lambda base: sum(settings.get(k) != base.get(k) for k in [*FLAGS, *NO_FLAG, "seeds", "env_args"])  # noqa: E731
    use_quick = differs(quick) <= differs(full)
    base = quick if use_quick else full
    argv = ["agentgym-opd", "bench"] + (["--quick"] if use_quick else [])
    fixed = [k for k in NO_FLAG if settings.get(k) != base.get(k)]
    if fixed:
        raise RecordError(f"the bench changed {fixed}, which no bench flag sets: pass the command with --command")
    for key, flag in FLAGS.items():
        if settings.get(key) != base.get(key) and settings.get(key) is not None:
            argv += [flag, str(settings[key])]
    if settings["seeds"] != base["seeds"]:
        argv += ["--seeds", ",".join(map(str, settings["seeds"])) + ("," if len(settings["seeds"]) == 1 else "")]
    if settings.get("env_args") is not None and settings["env_args"] != base.get("env_args"):
        for k, v in sorted(settings["env_args"].items()):
            argv += ["--env-arg", f"{k}={json.dumps(v)}"]
    if settings.get("algos"):
        argv += ["--algos", ",".join(settings["algos"])]
    for env_id in settings.get("eval_envs") or []:
        argv += ["--eval-env", env_id]
    for algo, overrides in sorted((settings.get("algo_overrides") or {}).items()):
        argv += [x for o in overrides for x in ("--algo-set", f"{algo}:{o}")]
    if settings.get("skip_warm_start"):
        argv.append("--skip-warm-start")
    if settings.get("references") is False:
        argv.append("--no-references")
    if settings.get("device") not in (None, "auto"):
        argv += ["--device", settings["device"]]
    argv += ["--output-dir", str(settings["output_dir"])]
    return argv + list(settings.get("overrides") or [])


def reference_model(out: Path, name: str, settings: Any) -> Path:
    """The warm start's or the teacher's model folder: the cached base pair, or the bench's own SFT run."""
    from evaluation.bench import final_model_dir, uses_base_models

    if uses_base_models(settings):
        from evaluation.base_models import cached_base_model

        student, teacher = settings.base_specs()
        model = cached_base_model(teacher if name == "teacher" else student)
        if model is None:
            raise RecordError(f"the bench's base {name} model is not in the cache any more: rerun the bench "
                              "(it rebuilds the base pair, the same weights) before importing")
        return model
    return final_model_dir(out / ("teacher" if name == "teacher" else "warm_start"))


def checkpoint_of(out: Path, record: dict[str, Any], settings: Any) -> Path:
    """The model folder the record evaluated."""
    from evaluation.bench import final_model_dir

    name = record["algorithm"]
    if name in REFERENCE_ROWS:
        return reference_model(out, name, settings)
    return final_model_dir(out / "runs" / name / f"seed{record['seed']}")


def training_tokens(out: Path, record: dict[str, Any]) -> int | None:
    path = out / "runs" / record["algorithm"] / f"seed{record['seed']}" / "metrics.jsonl"
    if not path.is_file():
        return None
    total = 0.0
    for line in path.read_text(encoding="utf-8").splitlines():
        total += float(json.loads(line).get("agent_tokens", 0.0))
    return int(total)


def bench_traces(policy: Any, env_id: str, settings: Any, *, algorithm: Any = None, limit: int = 3,
                 tasks: list[str] | None = None, with_context: bool = False) -> list[dict[str, Any]]:
    """The first ``limit`` evaluation episodes of ``env_id``, played greedily exactly as the bench plays them
    (same engine settings, tasks and rollout seeds), as traces; with ``algorithm`` (the live
    ``trainer.algorithm`` of a run) each agent token carries the divergence its loss computes.

    The bench can call this for its held-out split right after evaluating a run:
    ``record["episodes"] = bench_traces(trainer.eval_engine.policy, env_id, settings, algorithm=trainer.algorithm)``.
    """
    from agentgym_opd.policy.base import SamplingParams
    from agentgym_opd.registry import make
    from agentgym_opd.rollout import RolloutEngine
    from agentgym_opd.trainer import DEFAULT_SYSTEM_PROMPT
    from evaluation.bench import eval_env_args, eval_task_ids, privileged_contexts
    from evaluation.episode_trace import capture_traces, trace_episode

    overrides = {"max_turns": settings.max_turns, **eval_env_args(env_id, settings)}
    engine = RolloutEngine(policy, SamplingParams(max_new_tokens=settings.max_new_tokens, temperature=0.0),
                           system_prompt=DEFAULT_SYSTEM_PROMPT, action_parser="text")
    chosen = (tasks if tasks is not None else eval_task_ids(env_id, settings, settings.seeds[0]))[:limit]
    envs = [make(env_id, **overrides) for _ in chosen]
    contexts = privileged_contexts(envs[0], chosen) if with_context and envs else None  # warm_start+context
    batch = engine.collect(envs, chosen, seed=settings.eval_seed, contexts=contexts)
    if algorithm is not None:
        return capture_traces(algorithm, batch, limit)
    return [trace_episode(ep, tokenizer=policy.tokenizer) for ep in batch.episodes[:limit]]


def replay_traces(record: dict[str, Any], policy: Any, settings: Any, out: Path, tasks: list[str], limit: int) -> list[dict[str, Any]]:
    """Traces of a published bench run: with the method's loss rebuilt from the checkpoints where its
    teacher is a kept checkpoint (:data:`TEACHER_FROM_CHECKPOINT`), tokens only otherwise."""
    from agentgym_opd.config import load_config
    from agentgym_opd.policy.loading import load_student
    from agentgym_opd.trainer import algorithm_class

    name = record["algorithm"]
    algorithm = None
    if name in TEACHER_FROM_CHECKPOINT:
        config = load_config(None, [f"model.device={settings.device}"])
        student = load_student(str(checkpoint_of(out, record, settings)), config.model, trainable=True)
        teacher = load_student(str(reference_model(out, "teacher", settings)), config.model, trainable=False)
        algorithm = algorithm_class(name)(record["algorithm_config"].get("algo") or {}, student, teacher)
    return bench_traces(policy, record["env_id"], settings, algorithm=algorithm, limit=limit, tasks=tasks,
                        with_context=name == "warm_start+context")


def import_bench(out_dir: str | Path, board: Any, *, command: list[str] | None = None, episodes: int = 3,
                 log: Callable[[str], None] = print) -> list[Path]:
    """Stamp and add every record of a finished bench; returns the published record files."""
    from evaluation.bench import BenchSettings, eval_task_ids, load_frozen_policy
    from evaluation.provenance import collect, env_tasks_sha256
    from evaluation.records import validate_record

    out = Path(out_dir)
    try:
        summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
        settings = BenchSettings(**summary["settings"])
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise RecordError(f"{out} is not a finished bench output folder (summary.json: {err})") from err
    argv = command or bench_command(summary["settings"])
    device = "cuda" if settings.device.startswith("cuda") else "cpu"
    if settings.device == "auto":
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    held_out = summary.get("eval_envs", [settings.env])[-1]
    published = []
    task_cache: dict[tuple[str, int], tuple[list[str], str]] = {}
    for path in sorted((out / "records").glob("*.json")):
        record = json.loads(path.read_text(encoding="utf-8"))
        env_id = record["env_id"]
        key = (env_id, int(record["seed"]))
        if key not in task_cache:
            tasks = eval_task_ids(env_id, settings, int(record["seed"]))
            task_cache[key] = (tasks, env_tasks_sha256(env_id, tasks, **{"max_turns": settings.max_turns,
                                                                          **_eval_args(env_id, settings)}))
        tasks, tasks_sha = task_cache[key]
        model_dir = checkpoint_of(out, record, settings)
        policy = load_frozen_policy(str(model_dir), settings)
        record["provenance"] = collect(tasks_sha=tasks_sha, seeds=settings.seeds, command=argv, policy=policy, device=device)
        tokens = training_tokens(out, record)
        if record["algorithm"] not in REFERENCE_ROWS:
            record["budget"] = {"rollout_episodes": settings.budget, "tokens": tokens}
        record["origin"] = "original"
        if env_id == held_out and episodes > 0:
            record["episodes"] = replay_traces(record, policy, settings, out, tasks, episodes)
        validate_record(record)
        published.append(board.add(record))
        log(f"added {record['algorithm']} {env_id} seed {record['seed']} -> {published[-1]}")
    return published


def _eval_args(env_id: str, settings: Any) -> dict[str, Any]:
    from evaluation.bench import eval_env_args

    return eval_env_args(env_id, settings)
