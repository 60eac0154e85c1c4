"""`agentgym-opd train --algo NAME --env ID --student PATH [--teacher PATH | --teacher NAME=PATH ...] [--config F] [key=value ...]`.

The named flags are shorthands for config keys; free-form ``section.key=value`` overrides come last and
win. ``--env-arg key=value`` passes a constructor option to the env (e.g. ``num_tasks=2`` to train on a
few tasks), which the run config has no section for yet; it is recorded in ``env_args.json`` beside the
config. The run folder and every checkpoint also get ``training.json`` (the command as typed, the resolved
config, the starting models' hashes, the code revision, the budget: `agentgym_opd.run_provenance`), which an
evaluation of a checkpoint carries into its record. ``--resume DIR`` continues a run from its latest
checkpoint (or a given ``step_<N>`` folder); Ctrl-C says which checkpoint that is.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from agentgym_opd.cpu_threads import add_threads_argument, apply_threads

HELP = "train a student with a registered algorithm on a registered env"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--algo", default=None, help="registered algorithm (`agentgym-opd algos`)")
    parser.add_argument("--env", default=None, help="registered env id of the training split, e.g. household/train")
    parser.add_argument("--student", default=None, help="local model path ('tiny' = the offline tiny model)")
    parser.add_argument("--teacher", action="append", default=None, metavar="PATH | NAME=PATH",
                        help="a separate teacher model (path or short name); NAME=PATH, repeated, names several, "
                             "each task routed to one by model.teacher_route / model.teacher_routes")
    parser.add_argument("--config", default=None, help="YAML/JSON run config; flags and overrides apply on top")
    parser.add_argument("--output-dir", default=None, help="where metrics and checkpoints go (= output_dir=...)")
    parser.add_argument("--resume", default=None, metavar="DIR", help="resume from a run dir or checkpoint dir")
    parser.add_argument("--env-arg", action="append", default=[], metavar="KEY=VALUE",
                        help="env constructor option (JSON value), for training and evaluation envs")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_threads_argument(parser)
    parser.add_argument("overrides", nargs="*", metavar="section.key=value",
                        help="config overrides, e.g. train.steps=10 train.lr=1e-4 rollout.group_size=4")


def _env_args(items: list[str]) -> dict:
    from agentgym_opd.config import parse_key_values

    return parse_key_values(items, "--env-arg")


def kept_after_interrupt(args: argparse.Namespace) -> str:
    """Ctrl-C outside the training loop (loading models, making envs): the loop's own interrupt names the
    checkpoints (`kept_run_folder`)."""
    return "stopped outside the training loop (setup, or the summary after it); the run folder keeps what was written"


def kept_run_folder(output_dir: Path) -> str:
    """What an interrupted run leaves (the CLI prints it after "interrupted;"): checkpoints are written whole
    or not at all (`Trainer.save_checkpoint`), so the latest one named is safe to resume from."""
    latest = output_dir / "checkpoints" / "latest"
    if not latest.is_file():
        return (f"{output_dir} keeps config.yaml and metrics.jsonl; no checkpoint was saved yet "
                "(train.checkpoint_every sets how often)")
    name = latest.read_text(encoding="utf-8").strip()
    return (f"{output_dir} keeps config.yaml, metrics.jsonl and checkpoints up to {name}; "
            f"continue with the same command plus --resume {output_dir}")


def typed_command(args: argparse.Namespace) -> list[str]:
    """This command as typed (``agentgym-opd train ...``, the words the CLI parsed), its output folder
    replaced by a placeholder, for the run's ``training.json``."""
    from agentgym_opd.run_provenance import train_command

    argv = list(getattr(args, "invoked_argv", None) or sys.argv[1:])
    return train_command(argv[argv.index("train") + 1:] if "train" in argv else argv)


def run(args: argparse.Namespace) -> int:
    from agentgym_opd.config import ConfigError, run_config_from_cli
    from agentgym_opd.teachers import parse_teacher_flags
    from agentgym_opd.trainer import Trainer, algorithm_class

    try:
        apply_threads(args.threads)
        algo_cls = algorithm_class(args.algo) if args.algo else None
        teacher, teachers = parse_teacher_flags(args.teacher)
        overrides = ([f"model.teachers={json.dumps(teachers)}"] if teachers else []) + list(args.overrides) \
            + ([f"output_dir={args.output_dir}"] if args.output_dir else [])
        config = run_config_from_cli(args.config, overrides, algorithm=args.algo, env=args.env,
                                     student=args.student, teacher=teacher,
                                     algo_config_cls=algo_cls.Config if algo_cls else None)
        env_args = _env_args(args.env_arg)
        trainer = Trainer(config, env_overrides=env_args, progress=not args.no_progress)
        trainer.training_command = typed_command(args)
    except (ConfigError, ValueError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    Path(config.output_dir).mkdir(parents=True, exist_ok=True)
    (Path(config.output_dir) / "env_args.json").write_text(json.dumps(env_args, indent=2) + "\n")
    if args.resume:
        try:
            trainer.resume(args.resume)
        except (FileNotFoundError, ValueError, NotImplementedError) as err:
            print(f"error: cannot resume: {err}", file=sys.stderr)
            return 2
    from agentgym_opd.distributed import teardown

    try:
        last = trainer.train()
    except KeyboardInterrupt as stop:
        teardown(trainer.dist, barrier=False)  # the other ranks may never reach a barrier
        raise KeyboardInterrupt(kept_run_folder(Path(config.output_dir))) from stop
    except BaseException:
        teardown(trainer.dist, barrier=False)
        raise
    distributed = trainer.dist.enabled
    teardown(trainer.dist)
    if trainer.dist.is_main:
        summary = {k: v for k, v in last.items() if isinstance(v, (int, float))}
        print(json.dumps({"step": trainer.step, "output_dir": str(config.output_dir), **summary}))
    if distributed:
        # Every file is written and the process group is gone. A rank of a CPU (gloo) run was seen to abort
        # in the interpreter's shutdown ("terminate called without an active exception", a C++ thread still
        # joinable), which torchrun reports as a failed run; leave without running the finalisers.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    return 0
