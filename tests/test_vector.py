"""The in-process vector stepper: per-env results, envs dropping out as they finish."""

from __future__ import annotations

import pytest

from agentgym_opd.vector import VectorTextEnv
from counter_env import CounterEnv


def test_envs_finish_independently():
    vec = VectorTextEnv(env_fns=[CounterEnv, CounterEnv, CounterEnv])
    starts = vec.reset(options=[{"task_id": f"counter/train/{i}"} for i in range(3)])
    assert [info["task"].metadata["target"] for _, info in starts] == [1, 2, 3]
    actions = ["inc"] * 3
    finished_at = {}
    for turn in range(1, 4):
        results = vec.step(actions)
        for i, res in enumerate(results):
            if res is not None and res.done:
                finished_at[i] = turn
                actions[i] = None
    assert finished_at == {0: 1, 1: 2, 2: 3}
    with pytest.raises(RuntimeError, match="not running"):
        vec.step(["inc", None, None])


def test_step_validates_batch_size():
    vec = VectorTextEnv([CounterEnv()])
    vec.reset(seeds=[0])
    with pytest.raises(ValueError, match="1 actions"):
        vec.step(["inc", "inc"])
