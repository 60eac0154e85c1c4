"""Replay the expert walkthrough of every ALFWorld game of a split and report how many reach success.

Usage: python scripts/replay_alfworld.py [--split valid_unseen] [--data-root ../shared/data] [--limit N]

Why a script: all 134 valid_unseen games take minutes (each game compiles its PDDL in TextWorld), longer
than the test suite should; the tests replay a seeded sample and this script the whole split. Exit
status 1 if any game fails, so CI can run it.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from environments.alfworld.env import AlfWorldEnv  # noqa: E402


def replay(env: AlfWorldEnv, task_id: str) -> tuple[bool, int, int]:
    """(success, turns, errors) of playing the game's own walkthrough."""
    _, info = env.reset(options={"task_id": task_id})
    turns = errors = 0
    success = False
    for action in info["task"].privileged["walkthrough"]:
        _, _, terminated, truncated, step_info = env.step(action)
        turns += 1
        errors += step_info["error"] is not None
        success = step_info["success"]
        if terminated or truncated:
            break
    return success, turns, errors


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--split", default="valid_unseen")
    parser.add_argument("--data-root", default=None, help="folder holding alfworld/json_2.1.1/<split>")
    parser.add_argument("--limit", type=int, default=None)
    args = parser.parse_args(argv)
    env = AlfWorldEnv(args.split, data_root=args.data_root)
    ids = env.task_ids()[: args.limit] if args.limit else env.task_ids()
    start = time.perf_counter()
    failures, by_type, steps = [], Counter(), 0
    for n, task_id in enumerate(ids, 1):
        success, turns, errors = replay(env, task_id)
        steps += turns
        by_type[(task_id.split("-", 1)[0], success)] += 1
        if not success or errors:
            failures.append((task_id, success, turns, errors))
            print(f"FAIL {task_id}: success={success} turns={turns} errors={errors}", flush=True)
        if n % 20 == 0:
            print(f"{n}/{len(ids)} games, {time.perf_counter() - start:.0f}s", flush=True)
    env.close()
    elapsed = time.perf_counter() - start
    won = len(ids) - sum(1 for f in failures if not f[1])
    print(f"{args.split}: {won}/{len(ids)} games reached success by replaying the walkthrough "
          f"({steps} steps, {elapsed:.0f}s, {elapsed / max(len(ids), 1):.2f}s per game)")
    for task_type in sorted({t for t, _ in by_type}):
        print(f"  {task_type}: {by_type[(task_type, True)]}/{by_type[(task_type, True)] + by_type[(task_type, False)]}")
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
