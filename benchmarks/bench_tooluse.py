"""Throughput of the tool-use world: steps/s through `env.step` vs the raw logic, and the overhead.

Both loops play the same action scripts: each task's gold walkthrough with broken calls mixed in (bad
JSON, a wrong argument type, an unknown function, an unknown item) before every gold call, so half the
steps are errors. "raw" is the same work minus the wrapper: `_start` per episode, `_act` + `progress`
per step and the end-of-episode feedback. Tasks are generated once before timing. Usage: `python benchmarks/bench_tooluse.py [seconds]`.
"""

from __future__ import annotations

import sys

from environments.tooluse.env import ToolUseEnv

try:
    from _timing import best_round_rates
except ImportError:  # imported as benchmarks.bench_tooluse
    from benchmarks._timing import best_round_rates

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


def run(seconds: float = 3.0) -> dict:
    """Measure for about `seconds` per mode; returns steps/s of both modes and the wrapper overhead ratio."""
    env = ToolUseEnv("train", max_turns=30)
    scripts = _scripts(env)

    def wrapped(k: int) -> int:
        task_id, actions = scripts[k]
        env.reset(options={"task_id": task_id})
        for action in actions:
            env.step(action)
        return len(actions)

    def raw(k: int) -> int:
        task_id, actions = scripts[k]
        env._start(env.get_task(task_id))
        for action in actions:
            env._act(action)
            env.progress()
            env.admissible_actions()
        env.episode_feedback()  # the env's own end-of-episode work, which env.step also does once
        return len(actions)

    n = len(scripts)
    rates = best_round_rates({"wrapped": lambda k: wrapped(k % n), "raw": lambda k: raw(k % n)}, 2 * seconds)
    wrapped_rate, raw_rate = rates["wrapped"], rates["raw"]
    return {"env_steps_per_s": wrapped_rate, "raw_steps_per_s": raw_rate,
            "wrapper_overhead": raw_rate / wrapped_rate - 1.0, "error_fraction": 0.5}


if __name__ == "__main__":
    result = run(float(sys.argv[1]) if len(sys.argv) > 1 else 3.0)
    for key, value in result.items():
        print(f"{key}: {value}")
