"""Throughput of the household world: steps/s through `env.step` vs the raw logic, and the overhead.

Both loops play the same random admissible actions on the same tasks (a seeded RNG, episodes cut at
`max_turns`), on one core, in this process, in paired rounds on the CPU clock (`benchmarks/_timing.py`).
"raw" is the same work minus the wrapper: `_start` + `admissible_actions` + `progress` for a reset,
`_act` + `admissible_actions` + `progress` per step, `episode_feedback` at the end; "floor" returns the raw
work through gymnasium's API and no more (`benchmarks/_gym_floor.py`). Tasks (walkthrough planning
included) are built once before timing, as a rollout worker does on its first pass over a split; the
planning cost is reported on its own. Usage: `python benchmarks/bench_household.py [seconds]`.
"""

from __future__ import annotations

import random
import sys
import time
from typing import Callable

from environments.household.env import HouseholdEnv

try:
    from _gym_floor import floor_reset, floor_step
    from _timing import paired_rounds
except ImportError:  # imported as benchmarks.bench_household
    from benchmarks._gym_floor import floor_reset, floor_step
    from benchmarks._timing import paired_rounds

N_TASKS = 200


def episode_modes() -> tuple[dict[str, Callable[[int], int]], dict]:
    """The loops over the same episodes (`mode(k)` plays episode k and returns its steps: "wrapped" through
    env.step, "raw" the world logic alone, "floor" the raw logic returned through gymnasium's API, see
    `_gym_floor`) and facts about the setup (planning cost, task count). Shared with
    `bench_envs_instructions.py` and tests/test_bench_envs.py."""
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

    def floor_episode(k: int) -> int:
        rng = random.Random(k)
        _, info = floor_reset(env, tasks[k % len(tasks)])
        actions = info["admissible_actions"]
        n = 0
        while True:
            n += 1
            _, _, terminated, truncated, info = floor_step(env, rng.choice(actions), n)
            if terminated or truncated:
                env.episode_feedback()
                return n
            actions = info["admissible_actions"]

    modes = {"wrapped": wrapped_episode, "raw": raw_episode, "floor": floor_episode}
    return modes, {"plan_ms_per_task": plan_ms, "tasks": len(ids)}


def new_text_modes() -> dict[str, Callable[[int], int]]:
    """The wrapped and raw loops again, with each action a new string object (its hash computed anew, as for
    decoded model output): "raw_new_object" and "wrapped_new_object"; and "wrapped_unseen", which also
    empties the env's memory of accepted texts before every step, so every action pays `_check_action`.
    The raw loop makes the same emptying call, so the modes differ by the wrapper alone."""
    env = HouseholdEnv("train", max_turns=30)
    ids = env.task_ids()[:N_TASKS]
    tasks = [env.get_task(i) for i in ids]

    def new_object(text: str) -> str:
        return text.encode().decode()

    def wrapped(forget: bool) -> Callable[[int], int]:
        def episode(k: int) -> int:
            rng = random.Random(k)
            _, info = env.reset(options={"task_id": ids[k % len(ids)]})
            n = 0
            while True:
                if forget:
                    env._accepted_actions.clear()
                _, _, terminated, truncated, info = env.step(new_object(rng.choice(info["admissible_actions"])))
                n += 1
                if terminated or truncated:
                    return n
        return episode

    def raw(k: int) -> int:
        rng = random.Random(k)
        env._start(tasks[k % len(tasks)])
        actions = env.admissible_actions()
        env.progress()
        for n in range(1, env.max_turns + 1):
            env._accepted_actions.clear()
            outcome = env._act(new_object(rng.choice(actions)))
            actions = env.admissible_actions()
            env.progress()
            if outcome.terminated:
                env.episode_feedback()
                return n
        env.episode_feedback()
        return env.max_turns

    return {"raw_new_object": raw, "wrapped_new_object": wrapped(False), "wrapped_unseen": wrapped(True)}


def run_new_texts(seconds: float = 3.0) -> dict[str, float]:
    """Median overhead over paired rounds when actions arrive as new objects, and when every text is unseen."""
    timing = paired_rounds(new_text_modes(), 2 * seconds, baseline="raw_new_object")
    return {mode: timing.overhead(mode)[0] for mode in ("wrapped_new_object", "wrapped_unseen")}


def run(seconds: float = 3.0) -> dict:
    """Measure for about `seconds` per mode; returns steps/s of env.step and of the raw logic, and the
    overheads of the wrapper and of the bare gymnasium API."""
    modes, setup = episode_modes()
    timing = paired_rounds(modes, 2 * seconds, baseline="raw")
    overhead, q1, q3 = timing.overhead("wrapped")
    return {
        "env_steps_per_s": timing.rates["wrapped"],
        "raw_steps_per_s": timing.rates["raw"],
        "wrapper_overhead": overhead,  # median over paired rounds of the extra time env.step takes
        "overhead_iqr": (q1, q3),
        "floor_overhead": timing.overhead("floor")[0],  # the same for the bare gymnasium API (`_gym_floor`)
        "rounds": timing.rounds,
        **setup,
    }


if __name__ == "__main__":
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 3.0
    result = run(seconds)
    print(f"env.step      : {result['env_steps_per_s']:10.0f} steps/s")
    print(f"raw logic     : {result['raw_steps_per_s']:10.0f} steps/s")
    q1, q3 = result["overhead_iqr"]
    print(f"wrapper cost  : {result['wrapper_overhead']:10.1%} over the raw logic (IQR {q1:.1%} to {q3:.1%}, "
          f"{result['rounds']} paired rounds)")
    print(f"gym API floor : {result['floor_overhead']:10.1%} over the raw logic (see benchmarks/_gym_floor.py)")
    print(f"planning      : {result['plan_ms_per_task']:10.2f} ms per task ({result['tasks']} tasks)")
