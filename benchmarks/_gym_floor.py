"""The least a gymnasium step can do on top of the raw world logic: the floor under the wrapper's overhead.

`floor_reset` and `floor_step` call the same subclass hooks as `TextEnv.reset`/`step` and return what
gymnasium's API returns, the (obs, info) pair and the 5-tuple with the contract's info keys, and nothing
more: no test of the action, no charset test of the observation, no error log, no feedback, and the turn
limit only as the comparison that makes `truncated`. The gap between "raw" and "floor" is what the API
itself costs in this interpreter (a call, a tuple, a six-key dict); the gap between "floor" and "wrapped" is
what TextEnv's own guarantees cost.
"""

from __future__ import annotations

from typing import Any

from agentgym_opd.core import TextEnv
from agentgym_opd.types import Task


def floor_reset(env: TextEnv, task: Task) -> tuple[str, dict[str, Any]]:
    obs = env._start(task)
    success, score = env.progress()
    return obs, {"task": task, "turn": 0, "error": None, "feedback": "", "success": success, "score": score,
                 "admissible_actions": env.admissible_actions()}


def floor_step(env: TextEnv, action: str, turn: int) -> tuple[str, float, bool, bool, dict[str, Any]]:
    outcome = env._act(action)
    success, score = env.progress()
    return outcome.observation, outcome.reward, outcome.terminated, turn >= env.max_turns, {
        "turn": turn, "error": outcome.error, "feedback": outcome.feedback, "success": success, "score": score,
        "admissible_actions": env.admissible_actions()}
