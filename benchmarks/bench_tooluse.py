"""Throughput of the tool-use world: steps/s through `env.step` vs the raw logic, and the overhead.

Both loops play the same action scripts: each task's gold walkthrough with broken calls mixed in (bad
JSON, a wrong argument type, an unknown function, an unknown item) before every gold call, so half the
steps are errors. "raw" is the same work minus the wrapper: `_start` + `progress` + `admissible_actions`
per episode (the reset's info carries them), `_act` + `progress` + `admissible_actions` per step and the
end-of-episode feedback. Tasks are generated once before timing; the loops run in paired rounds on the
CPU clock (`benchmarks/_timing.py`). Usage: `python benchmarks/bench_tooluse.py [seconds]`.
"""

from __future__ import annotations

import sys
from typing import Callable

from environments.tooluse.env import ToolUseEnv

try:
    from _gym_floor import floor_reset, floor_step
    from _timing import paired_rounds
except ImportError:  # imported as benchmarks.bench_tooluse
    from benchmarks._gym_floor import floor_reset, floor_step
    from benchmarks._timing import paired_rounds

N_TASKS = 300
BROKEN = (
    '{"name": "get_price", "arguments": {"item": apple}}',
    '{"name": "get_total", "arguments": {"item": "apple", "quantity": "3"}}',
    '{"name": "get_prize", "arguments": {"item": "apple"}}',
    '<tool_call>{"name": "get_stock", "arguments": {"item": "spaceship"}}</tool_call>',
)


def _scripts(env: ToolUseEnv) -> list[tuple[str, list[str]]]:
    scripts = []
    for k, task_id in enumerate(env.task_ids()[:N_TASKS]):
        actions = []
        for j, gold in enumerate(env.get_task(task_id).privileged["walkthrough"]):
            actions += [BROKEN[(k + j) % len(BROKEN)], gold]
        scripts.append((task_id, actions))
    return scripts


def episode_modes() -> tuple[dict[str, Callable[[int], int]], dict]:
    """The loops over the same episodes (`mode(k)` plays script k, cycling, and returns its steps: "wrapped"
    through env.step, "raw" the world logic alone, "floor" the raw logic returned through gymnasium's API,
    see `_gym_floor`) and facts about the setup. Shared with `bench_envs_instructions.py` and
    tests/test_bench_envs.py."""
    env = ToolUseEnv("train", max_turns=30)
    scripts = _scripts(env)
    tasks = [env.get_task(task_id) for task_id, _ in scripts]

    def wrapped(k: int) -> int:
        task_id, actions = scripts[k % len(scripts)]
        env.reset(options={"task_id": task_id})
        for action in actions:
            env.step(action)
        return len(actions)

    def raw(k: int) -> int:
        _, actions = scripts[k % len(scripts)]
        env._start(tasks[k % len(tasks)])
        env.progress()  # the reset's info carries score and admissible actions, as in bench_household
        env.admissible_actions()
        for action in actions:
            env._act(action)
            env.progress()
            env.admissible_actions()
        env.episode_feedback()  # the env's own end-of-episode work, which env.step also does once
        return len(actions)

    def floor(k: int) -> int:
        _, actions = scripts[k % len(scripts)]
        floor_reset(env, tasks[k % len(tasks)])
        for turn, action in enumerate(actions, 1):
            floor_step(env, action, turn)
        env.episode_feedback()
        return len(actions)

    return {"wrapped": wrapped, "raw": raw, "floor": floor}, {"tasks": len(scripts)}


def run(seconds: float = 3.0) -> dict:
    """Measure for about `seconds` per mode; returns steps/s of env.step and of the raw logic, and the
    overheads of the wrapper and of the bare gymnasium API."""
    modes, setup = episode_modes()
    timing = paired_rounds(modes, 2 * seconds, baseline="raw")
    overhead, q1, q3 = timing.overhead("wrapped")
    return {"env_steps_per_s": timing.rates["wrapped"], "raw_steps_per_s": timing.rates["raw"],
            "wrapper_overhead": overhead, "overhead_iqr": (q1, q3), "rounds": timing.rounds,
            "floor_overhead": timing.overhead("floor")[0],
            "error_fraction": 0.5, **setup}


if __name__ == "__main__":
    result = run(float(sys.argv[1]) if len(sys.argv) > 1 else 3.0)
    for key, value in result.items():
        print(f"{key}: {value}")
