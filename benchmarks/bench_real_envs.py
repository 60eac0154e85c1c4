"""Steps/s through the agentgym-opd wrappers versus the raw engines, measured in one process.

Usage: python benchmarks/bench_real_envs.py [--reps 3] [--data-root ../shared/data]

For each engine the same gold-path actions are replayed through the raw engine and through the wrapper;
resets are excluded, only `step` is timed. Overhead = 1 - wrapper_rate / raw_rate (target < 10%).
ScienceWorld is also timed with the wrapper's optional extras on (valid actions + look + inventory every
step, which the raw `ScienceWorldEnv.step` always computes) and against the bare simulator call.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _rate(reset, step, actions, reps):
    """Best steps/s over `reps` replays, after one untimed warm-up replay (JVM JIT, caches)."""
    reset()
    for action in actions:
        step(action)
    best = 0.0
    for _ in range(reps):
        reset()
        start = time.perf_counter()
        for action in actions:
            step(action)
        best = max(best, len(actions) / (time.perf_counter() - start))
    return best


def _report(name, raw, wrapped):
    print(f"{name:38s} raw {raw:9.1f} steps/s  wrapper {wrapped:9.1f} steps/s  overhead {100 * (1 - wrapped / raw):+6.1f}%")


def bench_twx(reps):
    from environments.textworld_express.env import TextWorldExpressTextEnv

    env = TextWorldExpressTextEnv("dev", game="twc", max_tasks=1, max_turns=1000)
    task = env.get_task(env.task_ids()[0])
    actions = [a for a in task.privileged["walkthrough"]][:-1] * 1  # stop before the winning step
    seed = task.metadata["seed"]
    raw = _rate(lambda: env._reset_engine(seed), env.engine.step, actions, reps * 20)
    wrapped = _rate(lambda: env.reset(options={"task_id": task.id}), env.step, actions, reps * 20)
    _report("textworld_express/twc", raw, wrapped)
    env.close()


def bench_scienceworld(reps):
    from environments.scienceworld.env import ScienceWorldTextEnv

    env = ScienceWorldTextEnv("dev", task_name="find-living-thing", max_tasks=1, max_turns=1000)
    task = env.get_task(env.task_ids()[0])
    actions = task.privileged["walkthrough"][:-1]
    engine = env.engine
    raw = _rate(engine.reset, engine.step, actions, reps)
    bare = _rate(engine.server.reset, engine.server.step, actions, reps)
    lazy = _rate(lambda: env.reset(options={"task_id": task.id}), env.step, actions, reps)
    env.want_valid_actions = env.want_extras = True
    full = _rate(lambda: env.reset(options={"task_id": task.id}), env.step, actions, reps)
    _report("scienceworld (lazy wrapper vs raw step)", raw, lazy)
    _report("scienceworld (full extras vs raw step)", raw, full)
    _report("scienceworld (lazy vs bare server.step)", bare, lazy)
    env.close()


def bench_alfworld(reps, data_root):
    from environments.alfworld.env import AlfWorldEnv

    env = AlfWorldEnv("valid_unseen", data_root=data_root, max_turns=1000)
    task_id = env.task_ids()[0]
    _, info = env.reset(options={"task_id": task_id})
    actions = info["task"].privileged["walkthrough"][:-1] + ["look", "inventory", "examine desk 1"] * 5
    tw = env._tw_env
    raw = _rate(tw.reset, tw.step, actions, reps * 10)
    wrapped = _rate(lambda: env.reset(options={"task_id": task_id}), env.step, actions, reps * 10)
    _report("alfworld/valid_unseen", raw, wrapped)
    env.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--data-root", default=str(Path(__file__).resolve().parents[2] / "shared" / "data"))
    args = parser.parse_args()
    bench_twx(args.reps)
    bench_scienceworld(args.reps)
    bench_alfworld(args.reps, args.data_root)


if __name__ == "__main__":
    main()
