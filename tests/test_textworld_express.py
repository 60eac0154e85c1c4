"""TextWorldExpress: gold paths replayed to success on several games, errors, check_env."""

from __future__ import annotations

import pytest
from gymnasium.utils.env_checker import check_env

from agentgym_opd.registry import make
from environments.textworld_express.env import TextWorldExpressTextEnv

pytestmark = pytest.mark.slow  # every test starts TextWorldExpress's JVM


@pytest.fixture(scope="module")
def coin():
    env = make("textworld_express/coin", split="dev", max_tasks=5)
    yield env
    env.close()


def _replay(env, task_id):
    _, info = env.reset(options={"task_id": task_id})
    assert info["task"].instruction and info["admissible_actions"]
    for action in info["task"].privileged["walkthrough"]:
        _, reward, terminated, truncated, step = env.step(action)
        if terminated or truncated:
            break
    return step, terminated


@pytest.mark.parametrize("game", ["coin", "twc", "mapreader", "arithmetic", "sorting"])
def test_gold_path_reaches_success(game):
    env = TextWorldExpressTextEnv("test", game=game, max_tasks=3)
    ids = env.task_ids()
    assert len(ids) == 3 and all(t.startswith(f"{game}/seed-") for t in ids)
    for task_id in ids:
        step, terminated = _replay(env, task_id)
        assert step["success"] and terminated and step["score"] == 1.0, task_id
    env.close()


def test_cookingworld_gold_path():
    env = make("textworld_express/cookingworld", split="dev", max_tasks=2)
    for task_id in env.task_ids():
        step, terminated = _replay(env, task_id)
        assert step["success"] and terminated, task_id
    env.close()


def test_invalid_and_malformed_actions(coin):
    _, info = coin.reset(options={"task_id": coin.task_ids()[0]})
    _, _, terminated, _, step = coin.step("dance with the coin")
    assert step["error"].kind == "invalid_action" and "Valid commands now include" in step["error"].message
    assert not terminated
    _, _, _, _, step = coin.step("\x00\x01")
    assert step["error"].kind == "parse_error"
    _, _, _, _, step = coin.step("look around")
    assert step["error"] is None and step["turn"] == 3
    with pytest.raises(KeyError, match="unknown task id"):
        coin.reset(options={"task_id": "coin/seed-99999999"})


def test_splits_differ_and_unknown_game():
    train = TextWorldExpressTextEnv("train", game="coin", max_tasks=3)
    test = TextWorldExpressTextEnv("test", game="coin", max_tasks=3)
    assert set(train.task_ids()).isdisjoint(test.task_ids())
    with pytest.raises(ValueError, match="unknown TextWorldExpress game"):
        TextWorldExpressTextEnv("train", game="chess")
    train.close(), test.close()


def test_check_env_passes(coin):
    check_env(coin, skip_render_check=True)
