"""`agentgym-opd eval --policy NAME_OR_PATH --env ID [--episodes N --seed S --out FILE]`."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from evaluation.runner import SCRIPTED_AGENTS

HELP = "evaluate a policy on a registered env split and write a result record"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--policy", required=True,
                        help=f"a scripted agent ({', '.join(sorted(SCRIPTED_AGENTS))}) or a model path")
    parser.add_argument("--env", required=True, help="registered env id, e.g. household/valid_unseen")
    parser.add_argument("--episodes", type=int, default=None, help="tasks to evaluate (default: the whole split)")
    parser.add_argument("--samples", type=int, default=1, help="samples per task (pass@k needs k or more)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--num-envs", type=int, default=8)
    parser.add_argument("--executor", choices=["local", "ray"], default="local",
                        help="where the envs run: in this process, or one per Ray actor")
    parser.add_argument("--out", default=None, help="write the record here (default: print it)")


def run(args: argparse.Namespace) -> int:
    from evaluation.runner import evaluate_scripted

    if args.policy not in SCRIPTED_AGENTS:
        print(f"error: model policies are evaluated through the policy backends, which this build does not have yet; "
              f"use one of the scripted agents {sorted(SCRIPTED_AGENTS)}", file=sys.stderr)
        return 2
    record = evaluate_scripted(args.env, args.policy, episodes=args.episodes, samples_per_task=args.samples,
                               seed=args.seed, num_envs=args.num_envs, executor=args.executor)
    text = json.dumps(record, indent=2)
    if args.out:
        Path(args.out).write_text(text + "\n")
        print(f"wrote {args.out}")
    else:
        print(text)
    width = max(len(k) for k in record["metrics"])
    for name, m in record["metrics"].items():
        print(f"{name:<{width}}  {m['mean']:.3f} +- {m['stderr']:.3f}", file=sys.stderr)
    return 0
