"""Publishing a finished bench: its records, stamped with provenance, budget and kept episodes.

`agentgym-opd leaderboard import-bench OUT_DIR` reads a bench output folder (``summary.json``,
``records/``, the checkpoints under ``runs/``, ``warm_start/``, ``teacher/``) and adds every record not
yet published to the leaderboard (all of them checked first: one already published is skipped, one that
differs from a published record of the same run refuses the import before anything is written) with:

- ``provenance``: package versions, the hash of the evaluated tasks (the bench's own task selection),
  the chat-template and weights hashes of the evaluated checkpoint, the bench command that reproduces
  it (rebuilt from the bench's settings), the seeds and the device; for a trained run also ``training``
  (`evaluation.training_provenance.bench_training`: the job's config, starting models and their hashes);
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

from evaluation.records import REFERENCE_ROWS, RecordError, dirty_problem

# algorithms whose teacher, at the end of training, is exactly a checkpoint the bench keeps
TEACHER_FROM_CHECKPOINT = ("opd", "sage_opd")
# bench settings -> the `agentgym-opd bench` flag that sets them
FLAGS = {"steps": "--steps", "episodes_per_step": "--episodes-per-step", "group_size": "--group-size", "lr": "--lr",
         "temperature": "--temperature", "eval_episodes": "--eval-episodes", "eval_batch": "--eval-batch",
         "max_turns": "--max-turns",
         "warm_steps": "--warm-steps", "teacher_steps": "--teacher-steps", "student": "--student",
         "teacher": "--teacher", "env": "--env", "base_models": "--base-models", "base_steps": "--base-steps",
         "base_train_tasks": "--base-train-tasks"}
# settings with no flag: a bench that changed them cannot be rebuilt as a command
NO_FLAG = ("eval_points", "eval_seed", "warm_lr", "warm_context_fraction", "teacher_lr", "sft_tasks_per_step", "max_new_tokens")


def bench_command(settings: dict[str, Any]) -> list[str]:
    """The `agentgym-opd bench` argv that means these settings: the bench (or ``--track NAME``), ``--quick`` when
    that preset is the closer one, and a flag for each setting that differs from the preset."""
    from evaluation.bench.settings import BenchSettings

    track = settings.get("track")
    if track:
        from evaluation.bench.tracks import track_settings

        presets = {quick: track_settings(track, quick=quick).__dict__ for quick in (False, True)}
    else:
        presets = {False: BenchSettings.full(env=settings["env"]).__dict__,
                   True: BenchSettings.quick(env=settings["env"]).__dict__}
    differs = lambda base: sum(settings.get(k) != base.get(k) for k in [*FLAGS, *NO_FLAG, "seeds", "env_args"])  # noqa: E731
    use_quick = differs(presets[True]) <= differs(presets[False])
    base = presets[use_quick]
    argv = ["agentgym-opd", "bench"] + (["--track", track] if track else []) + (["--quick"] if use_quick else [])
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
    if settings.get("algos") and settings["algos"] != base.get("algos"):
        argv += ["--algos", ",".join(settings["algos"])]
    if settings.get("eval_envs") and settings["eval_envs"] != base.get("eval_envs"):
        argv += [x for env_id in settings["eval_envs"] for x in ("--eval-env", env_id)]
    for algo, overrides in sorted((settings.get("algo_overrides") or {}).items()):
        argv += [x for o in overrides for x in ("--algo-set", f"{algo}:{o}")]
    if settings.get("skip_warm_start"):
        argv.append("--skip-warm-start")
    if settings.get("references") is False:
        argv.append("--no-references")
    if settings.get("device") not in (None, "auto"):
        argv += ["--device", settings["device"]]
    argv += ["--output-dir", str(settings["output_dir"])]
    preset, given = list(base.get("overrides") or []), list(settings.get("overrides") or [])
    return argv + (given[len(preset):] if given[:len(preset)] == preset else given)


def reference_model(out: Path, name: str, settings: Any) -> Path:
    """The warm start's or the teacher's model folder: the cached base pair, or the bench's own SFT run."""
    from evaluation.bench.settings import uses_base_models
    from evaluation.bench.training import final_model_dir

    if uses_base_models(settings):
        from evaluation.bench.base_models import cached_base_model

        student, teacher = settings.base_specs()
        model = cached_base_model(teacher if name == "teacher" else student)
        if model is None:
            raise RecordError(f"the bench's base {name} model is not in the cache any more: rerun the bench "
                              "(it rebuilds the base pair; a rebuild at another code revision may end at other "
                              "weights, and the records then state their hash) before importing")
        return model
    return final_model_dir(out / ("teacher" if name == "teacher" else "warm_start"))


def checkpoint_of(out: Path, record: dict[str, Any], settings: Any) -> Path:
    """The model folder the record evaluated."""
    from evaluation.bench.training import final_model_dir

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
    from evaluation.bench.episodes import eval_env_args, eval_task_ids, privileged_contexts
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


# the fields import-bench adds to a bench's record file
IMPORTED_FIELDS = ("provenance", "budget", "origin", "episodes")
# what differs when a bench measures the same thing again (a reference row of `bench --algos X`, a rerun):
# when, how long, at which commit; the numbers, settings and protocol must still be equal
RERUN_FIELDS = ("created", "wall_time_s", "throughput", "code_revision", "algorithm_config.bench.train_wall_time_s")
# a reference row trains nothing: a bench at another budget measures the same warm start and teacher again
TRAINING_SETTINGS = tuple(f"algorithm_config.bench.{k}" for k in (
    "budget_episodes", "steps", "episodes_per_step", "group_size", "lr", "temperature", "train_env"))


def _unchanged_by(base: tuple[str, ...]) -> Callable[[dict[str, Any]], tuple[str, ...]]:
    """The fields a record of this bench may differ in from its published twin and still be the same result."""
    return lambda record: base + (TRAINING_SETTINGS if record["algorithm"] in REFERENCE_ROWS else ())


def import_bench(out_dir: str | Path, board: Any, *, command: list[str] | None = None, episodes: int = 3,
                 log: Callable[[str], None] = print, allow_dirty: bool = False) -> list[Path]:
    """Stamp and publish every record of a finished bench that is not published yet; returns the files written.

    Everything is checked before anything is written: a record whose result is already published is
    skipped and reported (so importing a bench twice, or a bench that re-ran reference rows an earlier
    import published, adds only what is new), and one that differs from a published record of the same
    run refuses the whole import. The comparison leaves out the kept episode traces, which are replayed
    illustrations (a GPU replays them within rounding), not the result, and what a second measurement of
    the same thing changes (``RERUN_FIELDS``; the bench command, its seed list and package versions): the
    numbers, settings, protocol, task and weights hashes must be equal. A new record from a tree with
    uncommitted changes refuses the import unless ``allow_dirty`` (`evaluation.records.dirty_problem`)."""
    out = Path(out_dir)
    summary, settings = _finished_bench(out)
    records = sorted(((str(path), board.read_record(path)) for path in (out / "records").glob("*.json")), key=_model_order)
    # a bench file that already clashes with the board fails here, before any model is loaded
    first = board.plan(records, skip_published=True, ignore=_unchanged_by(IMPORTED_FIELDS + RERUN_FIELDS))
    first.check(fix=IMPORT_FIX)
    dirty = [p for p in (dirty_problem(source, record) for source, record in first.new) if p] if not allow_dirty else []
    if dirty:
        raise RecordError(f"{len(dirty)} record(s) refused, nothing was published:\n  " + "\n  ".join(dirty))
    argv = command or bench_command(summary["settings"])
    load = _policy_loader(settings)
    stamped = [(source, _stamp(out, record, settings, argv, load)) for source, record in records]
    plan = board.plan(stamped, skip_published=True, ignore=_unchanged_by(
        ("episodes", "provenance.command", "provenance.seeds", "provenance.packages", "provenance.training") + RERUN_FIELDS))
    plan.check(fix=IMPORT_FIX)
    for source, path in plan.already:
        log(f"already published: {source} as {path}")
    held_out = summary.get("eval_envs", [settings.env])[-1]
    for _, record in plan.new:
        if record["env_id"] == held_out and episodes > 0:
            record["episodes"] = _kept_traces(out, record, settings, episodes, load)
    written = board.write([record for _, record in plan.new])
    for (_, record), path in zip(plan.new, written):
        log(f"added {record['algorithm']} {record['env_id']} seed {record['seed']} -> {path}")
    return written


IMPORT_FIX = "to keep a published result, delete the bench's file of that run from its records/ folder; then run import-bench again"


def _model_order(item: tuple[str, dict[str, Any]]) -> tuple:
    """Records of one model (algorithm and seed: every split) next to each other, so each loads once."""
    return item[1]["algorithm"], item[1]["seed"], item[0]


def _finished_bench(out: Path) -> tuple[dict[str, Any], Any]:
    """The bench's summary and settings, or a RecordError saying the folder is no finished bench."""
    from evaluation.bench.settings import BenchSettings

    try:
        summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
        return summary, BenchSettings(**summary["settings"])
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise RecordError(f"{out} is not a finished bench output folder (summary.json: {err})") from err


def _device(settings: Any) -> str:
    """Where the bench evaluated: 'cuda' or 'cpu' (``auto`` is what this machine resolves it to)."""
    if settings.device == "auto":
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    return "cuda" if settings.device.startswith("cuda") else "cpu"


def _policy_loader(settings: Any) -> Callable[[Path], Any]:
    """``load_frozen_policy`` keeping the last model: records are stamped in model order (``_model_order``),
    so each model loads once per pass rather than once per record."""
    from evaluation.bench.episodes import load_frozen_policy

    last: dict[str, Any] = {}

    def load(path: Path) -> Any:
        if str(path) not in last:
            last.clear()
            last[str(path)] = load_frozen_policy(str(path), settings)
        return last[str(path)]

    return load


def _stamp(out: Path, record: dict[str, Any], settings: Any, argv: list[str], load: Callable[[Path], Any]) -> dict[str, Any]:
    """A bench record with its provenance, budget and origin (the kept episodes come later, only for the
    records that are new: replaying them is the slow part)."""
    from evaluation.bench.episodes import eval_task_ids
    from evaluation.provenance import collect, env_tasks_sha256
    from evaluation.records import validate_record

    env_id, seed = record["env_id"], int(record["seed"])
    tasks = eval_task_ids(env_id, settings, seed)
    tasks_sha = env_tasks_sha256(env_id, tasks, **{"max_turns": settings.max_turns, **_eval_args(env_id, settings)})
    policy = load(checkpoint_of(out, record, settings))
    record["provenance"] = collect(tasks_sha=tasks_sha, seeds=settings.seeds, command=argv, policy=policy,
                                   device=_device(settings))
    if record["algorithm"] not in REFERENCE_ROWS:
        from evaluation.training_provenance import bench_training

        record["budget"] = {"rollout_episodes": settings.budget, "tokens": training_tokens(out, record)}
        record["provenance"]["training"] = bench_training(out, record, settings, argv, _device(settings),
                                                          record["budget"]["tokens"])
    record["origin"] = "original"
    return validate_record(record)


def _kept_traces(out: Path, record: dict[str, Any], settings: Any, limit: int, load: Callable[[Path], Any]) -> list[dict[str, Any]]:
    """The record's first ``limit`` held-out episodes replayed as the bench played them (see the module
    docstring); the record is validated again with them."""
    from evaluation.bench.episodes import eval_task_ids
    from evaluation.records import validate_record

    policy = load(checkpoint_of(out, record, settings))
    tasks = eval_task_ids(record["env_id"], settings, int(record["seed"]))
    traces = replay_traces(record, policy, settings, out, tasks, limit)
    validate_record({**record, "episodes": traces})
    return traces


def _eval_args(env_id: str, settings: Any) -> dict[str, Any]:
    from evaluation.bench.episodes import eval_env_args

    return eval_env_args(env_id, settings)
