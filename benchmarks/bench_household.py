"""Throughput of the household world: steps/s through `env.step` vs the raw logic, and the overhead.

Both loops play the same random admissible actions on the same tasks (a seeded RNG, episodes cut at
`max_turns`), on one core, in this process, as the best of short interleaved rounds (`benchmarks/_timing.py`). "raw" is the same work minus the wrapper: `_start` for a
reset, `_act` + `admissible_actions` + `progress` per step, `episode_feedback` at the end. Tasks (walkthrough planning included) are
built once before timing, as a rollout worker does on its first pass over a split; the planning cost is
reported on its own. Usage: `python benchmarks/bench_household.py [seconds]`.
"""

from __future__ import annotations

import random
import sys
import time

from environments.household.env import HouseholdEnv

try:
    from _timing import best_round_rates
except ImportError:  # imported as benchmarks.bench_household
    from benchmarks._timing import best_round_rates

N_TASKS = 200


def run(seconds: float = 3.0) -> dict:
    """Measure for about `seconds` per mode; returns steps/s of both modes and the wrapper overhead."""
    env = HouseholdEnv("train", max_turns=30)
    ids = env.task_ids()[:N_TASKS]
    t0 = time.perf_counter()
    tasks = [env.get_task(i) for i in ids]
    plan_ms = (time.perf_counter() - t0) * 1000 / len(ids)

    def wrapped_episode(k: int) -> int:
        rng = random.Random(k)
        _, info = env.reset(options={"task_id": ids[k % len(ids)]})
        actions = info["admissible_actions"]
        n = 0
        while True:
            _, _, terminated, truncated, info = env.step(rng.choice(actions))
            n += 1
            if terminated or truncated:
                return n
            actions = info["admissible_actions"]

    def raw_episode(k: int) -> int:
        rng = random.Random(k)
        env._start(tasks[k % len(tasks)])
        actions = env.admissible_actions()
        env.progress()
        for n in range(1, env.max_turns + 1):
            outcome = env._act(rng.choice(actions))
            actions = env.admissible_actions()
            env.progress()
            if outcome.terminated:
                env.episode_feedback()  # the env's own end-of-episode work, which env.step also does once
                return n
        env.episode_feedback()
        return env.max_turns

    rates = best_round_rates({"wrapped": wrapped_episode, "raw": raw_episode}, 2 * seconds)
    wrapped, raw = rates["wrapped"], rates["raw"]
    return {
        "env_steps_per_s": wrapped,
        "raw_steps_per_s": raw,
        "wrapper_overhead": raw / wrapped - 1.0,  # extra time per step that the TextEnv wrapper adds
        "plan_ms_per_task": plan_ms,
        "tasks": len(ids),
    }


if __name__ == "__main__":
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 3.0
    result = run(seconds)
    print(f"env.step      : {result['env_steps_per_s']:10.0f} steps/s")
    print(f"raw logic     : {result['raw_steps_per_s']:10.0f} steps/s")
    print(f"wrapper cost  : {result['wrapper_overhead']:10.1%} over the raw logic")
    print(f"planning      : {result['plan_ms_per_task']:10.2f} ms per task ({result['tasks']} tasks)")
