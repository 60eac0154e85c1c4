"""`agentgym-opd bench [--quick] [--algos A,B] [--seeds N|S1,S2] [--steps N | --budget EPISODES] ...`.

The project's main job: warm-start the student by SFT, train a stronger SFT teacher, run every registered
algorithm from that warm start with the same rollout budget over several seeds, evaluate greedily on the
seen and unseen splits, and write records plus a leaderboard (Markdown, CSV, HTML with curves) under the
output dir. The pipeline lives in :mod:`evaluation.bench`; this module only maps flags onto its settings,
and stays import-light because the CLI imports every subcommand module to build its parser.

Exit codes: 0 all runs finished, 1 the bench finished but some algorithm run failed (its row says why),
2 the bench was set up wrong (unknown algorithm or env, bad option).
"""

from __future__ import annotations

import argparse
import sys
import time

HELP = "benchmark every registered algorithm from one warm start with one rollout budget; build a leaderboard"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help="a ~2-3 minute smoke bench (fewer tasks, steps, seeds)")
    parser.add_argument("--track", default=None, metavar="NAME",
                        help="a named preset with its own base pair, env and budget (evaluation.bench.tracks), e.g. "
                             "smollm2-alfworld: SmolLM2-135M on ALFWorld; other flags override the preset")
    parser.add_argument("--resume", action="store_true",
                        help="keep each finished job's outcome under <output-dir>/jobs and skip the jobs an earlier, "
                             "killed run of the same bench finished (tracks do this by default)")
    parser.add_argument("--algos", action="append", default=None, metavar="A,B",
                        help="run only these registered algorithms (comma list; repeatable). Default: all")
    parser.add_argument("--seeds", default=None, metavar="N|S1,S2",
                        help="N seeds (0..N-1) or an explicit comma list such as 0,3 (default 3; --quick 1)")
    parser.add_argument("--steps", type=int, default=None, help="update steps per run (the same for every algorithm)")
    parser.add_argument("--budget", type=int, default=None, metavar="EPISODES",
                        help="rollout episodes per run; steps = budget / episodes-per-step")
    parser.add_argument("--episodes-per-step", type=int, default=None, help="episodes per update (tasks x group size)")
    parser.add_argument("--group-size", type=int, default=None, help="rollouts per task for group algorithms (G)")
    parser.add_argument("--lr", type=float, default=None, help="learning rate of every algorithm run")
    parser.add_argument("--temperature", type=float, default=None, help="rollout sampling temperature")
    parser.add_argument("--eval-episodes", type=int, default=None, help="greedy episodes per evaluation split")
    parser.add_argument("--eval-batch", type=int, default=None, metavar="N",
                        help="games an evaluation plays side by side (default: a split's all at once; a track sets its own)")
    parser.add_argument("--max-turns", type=int, default=None, help="turns per episode, training and evaluation")
    parser.add_argument("--warm-steps", type=int, default=None, help="SFT steps of the warm start")
    parser.add_argument("--teacher-steps", type=int, default=None, help="SFT steps of the trained teacher")
    parser.add_argument("--output-dir", default=None, help="where runs, records and the leaderboard go (runs/bench)")
    parser.add_argument("--student", default=None, help="base student: a model path, 'tiny' (the offline tiny model; on household the base pair's "
                             "student, as 'household-student' is) or another short name")
    parser.add_argument("--teacher", default=None, help="teacher: a model path or a short name such as 'household-teacher' (default: the base pair's "
                             "teacher on household, else one trained by SFT)")
    parser.add_argument("--env", default=None, help="training env id (default household/train)")
    parser.add_argument("--env-arg", action="append", default=[], metavar="KEY=VALUE",
                        help="training env constructor option (JSON value), e.g. num_tasks=8")
    parser.add_argument("--eval-env", action="append", default=None, metavar="ID",
                        help="evaluation env id (repeatable; default: the family's seen and unseen splits)")
    parser.add_argument("--device", default=None, help="model.device for every run (default auto: cuda if present)")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch CPU threads (default 1: fastest for the tiny model on a shared CPU; 0 = torch's default)")
    parser.add_argument("--jobs", type=int, default=None, metavar="N",
                        help="worker processes for the independent runs (default: one per CPU core on CPU, 1 on a GPU)")
    parser.add_argument("--algo-set", action="append", default=[], metavar="ALGO:key=value",
                        help="config override for one algorithm only, e.g. grpo:algo.kl_coef=0.01")
    parser.add_argument("--skip-warm-start", action="store_true", help="start every algorithm from --student as is")
    parser.add_argument("--no-references", action="store_true",
                        help="skip the warm start, warm start + context and teacher rows (sweeps, reruns of one run)")
    parser.add_argument("--base-models", choices=("auto", "off"), default=None,
                        help="auto (default): on household with the tiny student, start from the cached household "
                             "base pair (student, larger teacher; shipped with the repository, `agentgym-opd base-pair` rebuilds and checks it); off: the older "
                             "SFT warm start and teacher trained by the bench (memorises 8 training tasks)")
    parser.add_argument("--base-steps", type=int, default=None, metavar="N",
                        help="training steps of the base student; its schedule and the teacher's steps scale with it "
                             "(default: the specs' own)")
    parser.add_argument("--base-train-tasks", type=int, default=None, metavar="N",
                        help="train tasks the base models learn from; default the whole train split")
    parser.add_argument("--publish", action="store_true", help="also add the records to the repo's leaderboard/")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    parser.add_argument("--status", action="store_true",
                        help="run nothing: print what the bench with these flags has kept under --output-dir so far "
                             "(finished rows with intervals, paired differences, each job's state)")
    parser.add_argument("overrides", nargs="*", metavar="section.key=value",
                        help="config overrides for every algorithm run, e.g. train.micro_batch_size=8")


def _seeds(text: str) -> list[int]:
    try:
        if "," in text:
            return [int(s) for s in text.split(",") if s.strip()]
        count = int(text)
    except ValueError:
        raise ValueError(f"--seeds expects a count N or a comma list like 0,1,2, got {text!r}") from None
    if count < 1:
        raise ValueError(f"--seeds N counts seeds and needs N >= 1, got {count}; for seed 0 alone pass --seeds 1 "
                         "(or the list --seeds 0,)")
    return list(range(count))


def settings_from_args(args: argparse.Namespace):
    """The :class:`evaluation.bench.BenchSettings` that these flags mean (--quick first, flags on top)."""
    from agentgym_opd.config import parse_key_values
    from evaluation.bench.settings import BenchSettings

    changes: dict = {}
    simple = {"steps": "steps", "episodes_per_step": "episodes_per_step", "group_size": "group_size", "lr": "lr",
              "temperature": "temperature", "eval_episodes": "eval_episodes", "eval_batch": "eval_batch",
              "max_turns": "max_turns", "warm_steps": "warm_steps",
              "teacher_steps": "teacher_steps", "output_dir": "output_dir", "student": "student",
              "teacher": "teacher", "env": "env", "device": "device", "base_models": "base_models",
              "base_steps": "base_steps", "base_train_tasks": "base_train_tasks"}
    for flag, key in simple.items():
        if getattr(args, flag) is not None:
            changes[key] = getattr(args, flag)
    if args.threads is not None:
        changes["threads"] = args.threads or None
    if args.jobs is not None:
        if args.jobs < 1:
            raise ValueError(f"--jobs needs at least 1 worker process, got {args.jobs}")
        changes["jobs"] = args.jobs
    if args.algos:
        changes["algos"] = [a.strip() for item in args.algos for a in item.split(",") if a.strip()]
    if args.seeds is not None:
        changes["seeds"] = _seeds(args.seeds)
    if args.env_arg:
        changes["env_args"] = parse_key_values(args.env_arg, "--env-arg")
    if args.eval_env:
        changes["eval_envs"] = list(args.eval_env)
    per_algo: dict[str, list[str]] = {}
    for item in args.algo_set:
        name, sep, override = item.partition(":")
        if not sep or "=" not in override:
            raise ValueError(f"--algo-set expects ALGO:key=value, got {item!r}")
        per_algo.setdefault(name, []).append(override)
    if args.publish:
        _refuse_publishing_a_dirty_tree()
    changes.update(algo_overrides=per_algo, overrides=list(args.overrides or []), skip_warm_start=args.skip_warm_start,
                   references=not args.no_references,
                   publish=args.publish, progress=not args.no_progress)
    if getattr(args, "resume", False):
        changes["resume"] = True
    if changes.get("student") == "household-student":  # the default pair's student, by its short name
        if changes.get("base_models") == "off":
            raise ValueError("--student household-student is the base pair's student; it cannot go with --base-models off")
        changes["student"] = "tiny"  # the base-pair path starts from it (evaluation.bench.uses_base_models)
    if getattr(args, "track", None):
        from evaluation.bench.tracks import track_settings

        settings = track_settings(args.track, quick=args.quick, **changes)
    else:
        settings = BenchSettings.quick(**changes) if args.quick else BenchSettings.full(**changes)
    if args.budget is not None:
        if args.steps is not None:
            raise ValueError("give --steps or --budget, not both")
        if args.budget < settings.episodes_per_step or args.budget % settings.episodes_per_step:
            raise ValueError(f"--budget {args.budget} must be a positive multiple of the episodes per step "
                             f"({settings.episodes_per_step})")
        settings.steps = args.budget // settings.episodes_per_step
    return settings


def run(args: argparse.Namespace) -> int:
    from agentgym_opd.config import ConfigError
    from evaluation.bench.pipeline import run_bench
    from evaluation.bench.settings import BenchError

    started = time.perf_counter()
    try:
        settings = settings_from_args(args)
        if args.status:
            from evaluation.bench.status import bench_status

            print(bench_status(settings))
            return 0
        summary = run_bench(settings)
    except (BenchError, ConfigError, ValueError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(summary["table"])
    print(f"\nleaderboard: {summary['leaderboard']}/LEADERBOARD.md (and leaderboard.csv, index.html)")
    print(f"summary: {settings.output_dir}/summary.json")
    print(f"wall time: {time.perf_counter() - started:.0f}s (estimated {summary['estimated_wall_time_s']:.0f}s)")
    if summary["leaderboard_error"]:
        print(f"leaderboard build failed: {summary['leaderboard_error']}", file=sys.stderr)
        return 1
    if summary["failures"]:
        print(f"{len(summary['failures'])} algorithm(s) failed: {', '.join(summary['failures'])}; see the FAILED rows "
              "and runs/<algo>/seed<N>/error.txt", file=sys.stderr)
        return 1
    return 0


def _refuse_publishing_a_dirty_tree() -> None:
    """``--publish`` puts the records on the repo's leaderboard, which takes no record nobody can rerun: a tree with
    uncommitted changes is refused before hours of runs, not after them."""
    from evaluation.records import DIRTY_SUFFIX
    from evaluation.runner import code_revision

    revision = code_revision()
    if revision.endswith(DIRTY_SUFFIX):
        raise ValueError(f"--publish: this checkout has uncommitted changes ({revision}) and the leaderboard takes no "
                         "record made from them: commit and rerun, or run without --publish and add the records with "
                         "`agentgym-opd leaderboard add RECORDS --allow-dirty` (marked as from a dirty tree); nothing "
                         "was run")
