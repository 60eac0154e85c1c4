"""Measure the observable ALFWorld expert (`environments.alfworld.expert`): success and mean length per task type.

    AGENTGYM_OPD_DATA=../shared/data python scripts/probes/alfworld_expert_probe.py --split train --limits 30 40 50
    ... --sample 60 --seed 0        # a seeded sample instead of the whole split (ALFWorld games take ~2 s to load)
    ... --prior uniform             # search in the listed order instead of the train split's location prior

Each game is played once with the largest limit; a game counts as solved within N turns if the expert won in at
most N commands. Prints one line per game as it ends (to follow a long run) and the table at the end; with
``--out`` also writes every game's run as JSON lines.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from agentgym_opd.registry import make  # noqa: E402
from environments.alfworld.expert import UNIFORM_PRIOR, play, train_prior  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--split", default="train", choices=["train", "valid_seen", "valid_unseen"])
    parser.add_argument("--limits", type=int, nargs="+", default=[30, 40, 50])
    parser.add_argument("--sample", type=int, default=0, help="play a seeded sample of this many games (0: all)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--prior", choices=["train", "uniform"], default="train")
    parser.add_argument("--out", type=Path, default=None, help="write each game's run as a JSON line here")
    args = parser.parse_args(argv)

    limit = max(args.limits)
    env = make(f"alfworld/{args.split}", max_turns=limit)
    prior = UNIFORM_PRIOR if args.prior == "uniform" else train_prior(str(make("alfworld/train").split_dir))
    ids = env.task_ids()
    if args.sample:
        ids = sorted(random.Random(args.seed).sample(ids, min(args.sample, len(ids))))
    runs = []
    started = time.perf_counter()
    out = args.out.open("w") if args.out else None
    for i, task_id in enumerate(ids, 1):
        run = play(env, task_id, prior=prior, max_turns=limit)
        runs.append(run)
        print(f"[{i}/{len(ids)} {time.perf_counter() - started:.0f}s] {run.stopped:15s} {len(run.actions):3d} {task_id}",
              flush=True)
        if out:
            out.write(json.dumps(run.__dict__) + "\n")
            out.flush()
    print(table(runs, args.limits))
    return 0


def table(runs, limits) -> str:
    """Per task type and overall: games, success within each limit, mean length of the won games, why others stopped."""
    groups = defaultdict(list)
    for run in runs:
        groups[run.task_type].append(run)
    groups["all"] = list(runs)
    head = "| task type | games | " + " | ".join(f"won <= {n}" for n in limits) + " | mean length (won) | stopped otherwise |"
    lines = [head, "|" + "---|" * (len(limits) + 4)]
    for name, group in groups.items():
        won = [r for r in group if r.success]
        rates = [sum(len(r.actions) <= n for r in won) / len(group) for n in limits]
        mean = statistics.mean(len(r.actions) for r in won) if won else float("nan")
        other = defaultdict(int)
        for r in group:
            if not r.success:
                other[r.stopped] += 1
        lines.append(f"| {name} | {len(group)} | " + " | ".join(f"{x:.3f}" for x in rates)
                     + f" | {mean:.1f} | {dict(other) or '-'} |")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
