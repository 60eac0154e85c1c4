"""`agentgym-opd eval --policy NAME_OR_PATH --env ID [--episodes N] [--seeds S ...] [--out FILE] ...`.

`--policy` is a scripted agent (`walkthrough`, `random`; `evaluation.runner`) or a model: `tiny`,
`smollm2`, a local HF folder, a trainer checkpoint or a run folder (`evaluation.policy_eval`). Both write
the same record, one per seed. A model's run shows episodes done with ETA and tokens/s, and with `--out`
writes each episode's outcome (and the first `--transcripts` transcripts) beside the record as it goes. Bad input (a path that is no model, an unknown env id, an env with no tasks, impossible
settings) prints one `error:` line and exits with code 2, without a traceback. Ctrl-C prints one line
saying which records were kept (a model run keeps the episodes that ended as a partial record) and exits 130.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from agentgym_opd.cpu_threads import add_threads_argument, apply_threads
from evaluation.policy_eval import episodes_path
from evaluation.runner import SCRIPTED_AGENTS

HELP = "evaluate a policy on a registered env split and write a result record"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--policy", required=True,
                        help=f"a scripted agent ({', '.join(sorted(SCRIPTED_AGENTS))}) or a model: 'tiny', 'smollm2' "
                             "(SmolLM2-135M-Instruct, offline), a local HF model folder, a trainer checkpoint "
                             "(<run>/checkpoints/step_N) or a run folder")
    parser.add_argument("--env", required=True, help="registered env id, e.g. household/valid_unseen")
    parser.add_argument("--episodes", type=int, default=None, help="tasks to evaluate (default: the whole split)")
    parser.add_argument("--bench-tasks", action="store_true",
                        help="each seed plays the --episodes tasks the bench gives that seed (household: block "
                             "seed mod 16 of consecutive tasks), so the record compares with the bench's task for "
                             "task; default: the same evenly spread tasks for every seed")
    parser.add_argument("--samples", type=int, default=1,
                        help="samples per task, K (pass@k needs k or more; models need --temperature > 0 for K > 1)")
    seeds = parser.add_mutually_exclusive_group()
    seeds.add_argument("--seeds", type=int, nargs="+", default=None, help="one record per seed (default: 0)")
    seeds.add_argument("--seed", type=int, default=None, help="a single seed (same as --seeds S)")
    parser.add_argument("--num-envs", type=int, default=None,
                        help="envs stepped side by side (default: 8 for scripted agents; for models, as many as "
                             "--memory-budget-gb allows)")
    parser.add_argument("--executor", choices=["local", "ray"], default="local",
                        help="where the envs run for scripted agents: in this process, or one per Ray actor")
    parser.add_argument("--max-turns", type=int, default=None, help="turn limit per episode (default: the env's)")
    parser.add_argument("--env-arg", action="append", default=[], metavar="KEY=VALUE",
                        help="env constructor option (JSON value), e.g. num_tasks=4")
    model = parser.add_argument_group("model policies")
    model.add_argument("--backend", choices=["hf", "vllm"], default="hf", help="generation backend")
    model.add_argument("--temperature", type=float, default=0.0, help="0 = greedy decoding (default)")
    model.add_argument("--top-p", type=float, default=1.0)
    model.add_argument("--max-new-tokens", type=int, default=128, help="tokens per agent turn")
    model.add_argument("--max-context-tokens", type=int, default=None,
                       help="prompt + history budget (default: the checkpoint's model.max_seq_len, else 2048)")
    model.add_argument("--action-parser", default=None,
                       help="'text', 'json', 'code', 'tags' or module:function (default: the checkpoint's, else the "
                            "env family's)")
    model.add_argument("--system-prompt", default=None,
                       help="system prompt text ('' = none; default: the checkpoint's, else the env family's)")
    add_threads_argument(model)
    model.add_argument("--memory-budget-gb", type=float, default=2.0,
                       help="memory the weights and the batch of episodes may use together, the envs' own processes "
                            "included (a ScienceWorld or TextWorldExpress game starts a ~0.6 GB JVM; sizes the batch)")
    model.add_argument("--transcripts", type=int, default=10, metavar="N",
                       help="with --out: full transcripts of the first N episodes in FILE.episodes.jsonl")
    model.add_argument("--device", default="auto", help="'auto', 'cpu', 'cuda', ... (HF backend)")
    model.add_argument("--dtype", default=None, choices=["float32", "bfloat16", "float16"],
                       help="weights dtype (default: the checkpoint's, else float32)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--out", default=None,
                        help="write the record here (several seeds: FILE.seed<S>.json each); default: print it")


def _env_args(items: list[str]) -> dict:
    from agentgym_opd.config import parse_key_values

    return parse_key_values(items, "--env-arg")


def _records(args: argparse.Namespace, seeds: list[int], env_kwargs: dict) -> list[dict]:
    if args.policy in SCRIPTED_AGENTS:
        from evaluation.runner import evaluate_scripted

        if args.bench_tasks:
            raise ValueError("--bench-tasks is for model policies; scripted agents play the evenly spread tasks")
        if args.max_turns is not None:
            env_kwargs["max_turns"] = args.max_turns
        paths = out_paths(args.out, seeds) if args.out else [None] * len(seeds)
        return [evaluate_scripted(args.env, args.policy, episodes=args.episodes, samples_per_task=args.samples,
                                  seed=seed, num_envs=args.num_envs or 8, executor=args.executor,
                                  progress=not args.no_progress, transcripts=args.transcripts,
                                  episodes_out=episodes_path(path) if path else None, **env_kwargs)
                for seed, path in zip(seeds, paths)]
    from evaluation.policy_eval import EvalSetupError, evaluate_policy

    if args.executor != "local":
        raise EvalSetupError("--executor ray is for scripted agents; model policies step in-process envs "
                             "through the rollout engine")
    return evaluate_policy(args.env, args.policy, episodes=args.episodes, seeds=seeds, samples=args.samples,
                           temperature=args.temperature, top_p=args.top_p, max_new_tokens=args.max_new_tokens,
                           max_turns=args.max_turns, max_context_tokens=args.max_context_tokens,
                           action_parser=args.action_parser, system_prompt=args.system_prompt, backend=args.backend,
                           device=args.device, dtype=args.dtype, num_envs=args.num_envs,
                           memory_budget_gb=args.memory_budget_gb, progress=not args.no_progress,
                           out_paths=out_paths(args.out, seeds) if args.out else None, transcripts=args.transcripts,
                           bench_tasks=args.bench_tasks, **env_kwargs)


def command_seeds(args: argparse.Namespace) -> list[int]:
    """The seeds an eval command runs: ``--seeds``, else ``--seed``, else 0 (also what `leaderboard stamp`
    reads from a record's command)."""
    return args.seeds if args.seeds is not None else [args.seed if args.seed is not None else 0]


def out_paths(out: str, seeds: list[int]) -> list[Path]:
    """`rec.json` for one seed; `rec.seed0.json`, `rec.seed1.json`, ... for several."""
    path = Path(out)
    if len(seeds) == 1:
        return [path]
    return [path.with_name(f"{path.stem}.seed{seed}{path.suffix or '.json'}") for seed in seeds]


def _stamp(path: Path, record: dict, argv: list[str] | None) -> None:
    """Add provenance (this command, package versions, task/template/weights hashes) to a written record, so
    it can go onto the leaderboard as it is; a record that cannot be stamped stays as written, with a note."""
    from evaluation.provenance import command_line, stamp_eval_record
    from evaluation.records import RecordError

    try:
        stamped = stamp_eval_record(dict(record), command_line(argv))
    except (RecordError, OSError, ValueError) as err:
        print(f"note: {path} has no provenance ({err}); add it with `agentgym-opd leaderboard stamp`",
              file=sys.stderr)
        return
    path.write_text(json.dumps(stamped, indent=2) + "\n")


def kept_after_interrupt(args: argparse.Namespace) -> str:
    """What Ctrl-C leaves when it stops eval before a model's first episode ended (a model run that has
    finished episodes says itself what it kept; see `evaluation.policy_eval`). The CLI prints it and exits 130."""
    if args.policy in SCRIPTED_AGENTS:
        return "no record written (a scripted run writes its record when it ends)"
    return "no episode had ended, so no record was written"


def run(args: argparse.Namespace) -> int:
    from agentgym_opd.core import UnknownTaskError
    from agentgym_opd.data import DataNotFoundError
    from agentgym_opd.registry import UnknownIdError

    seeds = command_seeds(args)
    try:
        apply_threads(args.threads)
        records = _records(args, list(seeds), _env_args(args.env_arg))
    except (UnknownIdError, UnknownTaskError, DataNotFoundError, FileNotFoundError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)  # bad input: the message says what to do, no traceback
        return 2
    if args.out:
        for path, record in zip(out_paths(args.out, list(seeds)), records):
            if args.policy in SCRIPTED_AGENTS:  # model runs wrote theirs as they went
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(json.dumps(record, indent=2) + "\n")
            _stamp(path, record, getattr(args, "invoked_argv", None))
            print(f"wrote {path} and {episodes_path(path)}")
    else:
        print(json.dumps(records[0] if len(records) == 1 else records, indent=2))
    for record in records:
        speed = record.get("throughput")
        print(f"== {record['env_id']}  {record['algorithm']} / {record['student']}  seed {record['seed']}  "
              f"n={record['n_episodes']}  {record['wall_time_s']:.1f}s"
              + (f"  {speed['tokens_per_s']:.1f} tokens/s" if speed else ""), file=sys.stderr)
        if record.get("protocol"):
            print("protocol: " + " ".join(f"{k}={v!r}" for k, v in record["protocol"].items()), file=sys.stderr)
        width = max(len(k) for k in record["metrics"])
        for name, m in record["metrics"].items():
            print(f"{name:<{width}}  {m['mean']:.3f} +- {m['stderr']:.3f}", file=sys.stderr)
    return 0
