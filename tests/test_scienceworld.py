"""ScienceWorld: gold paths on several tasks, score/completion, invalid actions, JVM death and restart."""

from __future__ import annotations

import os
import signal

import pytest
from gymnasium.utils.env_checker import check_env

from agentgym_opd.registry import list_envs, make
from environments.scienceworld import TASK_NAMES


def _replay(env, task_id):
    _, info = env.reset(options={"task_id": task_id})
    walkthrough = info["task"].privileged["walkthrough"]
    assert walkthrough and "Your task is to" in info["task"].instruction
    for action in walkthrough:
        _, _, terminated, truncated, step = env.step(action)
        if terminated or truncated:
            break
    return step, terminated


def test_all_thirty_tasks_are_registered():
    ids = {s.id for s in list_envs()}
    assert len(TASK_NAMES) == 30 and all(f"scienceworld/{t}" in ids for t in TASK_NAMES)


@pytest.mark.parametrize("task", ["find-living-thing", "chemistry-mix-paint-secondary-color", "lifespan-longest-lived"])
@pytest.mark.slow
def test_gold_path_reaches_score_100(task):
    env = make(f"scienceworld/{task}", split="dev", max_tasks=2)
    step, terminated = _replay(env, env.task_ids()[0])
    assert step["success"] and terminated and step["score"] == 100.0
    env.close()


@pytest.mark.slow
def test_splits_invalid_actions_lazy_extras_and_jvm_crash():
    env = make("scienceworld/find-plant", split="train", valid_actions=True, extras=True)
    train_ids = env.task_ids()
    dev = make("scienceworld/find-plant", split="test")
    assert train_ids and set(train_ids).isdisjoint(dev.task_ids())
    dev.close()
    _, info = env.reset(options={"task_id": train_ids[0]})
    assert "look around" in info["admissible_actions"]
    _, reward, terminated, _, step = env.step("teleport to the moon")
    assert step["error"].kind == "invalid_action" and not terminated and reward == 0.0
    assert "In your inventory" in step["inventory"] and step["look"]
    walkthrough = info["task"].privileged["walkthrough"]
    for action in walkthrough[:2]:
        _, _, _, _, step = env.step(action)
    score_before = step["score"]
    os.kill(env.jvm_pid(), signal.SIGKILL)
    env.engine._gateway.java_process.wait()
    _, _, terminated, _, step = env.step(walkthrough[2])
    assert step["error"].kind == "env_crash" and env.restarts == 1 and not terminated
    assert step["score"] == score_before  # the replayed episode is where it was
    for action in walkthrough[2:]:
        _, _, terminated, truncated, step = env.step(action)
        if terminated or truncated:
            break
    assert step["success"], "the episode continues on the restarted JVM"
    env.close()


@pytest.mark.slow
def test_lazy_step_leaves_out_the_extras_and_check_env_passes():
    env = make("scienceworld/find-animal", split="dev", max_tasks=1)
    _, info = env.reset(options={"task_id": env.task_ids()[0]})
    assert info["admissible_actions"] is None
    _, _, _, _, step = env.step("look around")
    assert "look" not in step and step["error"] is None
    check_env(env, skip_render_check=True)
    env.close()
