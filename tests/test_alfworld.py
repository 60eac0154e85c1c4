"""ALFWorld through TextWorld on the real games in ../shared/data.

The tests replay the expert walkthrough on a seeded sample (one game of each of the 6 task types of
valid_unseen, plus one valid_seen and one train game): all 134 valid_unseen games take ~5 minutes, more than
the suite's budget; `scripts/replay_alfworld.py` replays the whole split.
"""

from __future__ import annotations

import random

import pytest
from gymnasium.utils.env_checker import check_env

from agentgym_opd.data import DataNotFoundError
from agentgym_opd.registry import make
from environments.alfworld import TASK_TYPES
from environments.alfworld.env import AlfWorldEnv, logic_files

from conftest import SHARED_DATA as DATA_ROOT  # ../shared/data, or AGENTGYM_OPD_TEST_DATA


@pytest.fixture(scope="module")
def env():
    env = AlfWorldEnv("valid_unseen", data_root=DATA_ROOT)
    yield env
    env.close()


def _replay(env, task_id):
    obs, info = env.reset(options={"task_id": task_id})
    assert "Your task is to:" in obs and info["task"].instruction
    assert info["admissible_actions"], "admissible commands come from TextWorld's infos"
    walkthrough = info["task"].privileged["walkthrough"]
    assert walkthrough
    for action in walkthrough:
        obs, reward, terminated, truncated, step_info = env.step(action)
        assert step_info["error"] is None, (task_id, action, step_info["error"])
        if terminated or truncated:
            break
    return step_info, reward, terminated


def test_splits_and_task_types(env):
    assert len(env.task_ids()) == 134
    assert len(AlfWorldEnv("valid_seen", data_root=DATA_ROOT).task_ids()) == 140
    heat = make("alfworld/valid_unseen-pick_heat_then_place", data_root=DATA_ROOT)
    assert heat.task_ids() and all(t.startswith("pick_heat_then_place_in_recep-") for t in heat.task_ids())
    both = AlfWorldEnv("valid_unseen", data_root=DATA_ROOT, task_types=["pick_two_obj", "look_at_obj_in_light"])
    assert {t.split("-", 1)[0] for t in both.task_ids()} == {"pick_two_obj_and_place", "look_at_obj_in_light"}
    with pytest.raises(ValueError, match="unknown ALFWorld task types"):
        AlfWorldEnv("valid_unseen", data_root=DATA_ROOT, task_types=["juggle"])


def test_logic_files_ship_in_the_wheel():
    files = logic_files()
    assert files["pddl"].read_text().lstrip().startswith(";") and "alfred" in files["pddl"].read_text()
    assert files["grammar"].stat().st_size > 0


@pytest.mark.slow
def test_expert_walkthrough_succeeds_on_a_seeded_sample(env):
    rng = random.Random(0)
    sample = []
    for full in TASK_TYPES.values():
        games = [t for t in env.task_ids() if t.split("-", 1)[0] == full]
        sample += rng.sample(games, 1)
    for task_id in sample:
        info, reward, terminated = _replay(env, task_id)
        assert info["success"] and terminated and reward == 1.0 and info["score"] == 1.0, task_id


def test_other_splits_replay():
    for split in ("valid_seen", "train"):
        env = AlfWorldEnv(split, data_root=DATA_ROOT)
        info, _, _ = _replay(env, env.task_ids()[0])
        assert info["success"]
        env.close()


def test_bad_actions_become_step_errors_and_the_episode_continues(env):
    task_id = env.task_ids()[5]
    _, info = env.reset(options={"task_id": task_id})
    _, _, terminated, _, step = env.step("go to the moon 7")
    assert step["error"].kind == "invalid_action" and "Admissible commands now" in step["error"].message
    assert not terminated
    _, _, _, _, step = env.step("I think I should first look around.\nThen take the apple.")
    assert step["error"].kind == "parse_error"
    _, _, _, _, step = env.step("")
    assert step["error"].kind == "parse_error"
    rng = random.Random(1)
    for _ in range(5):
        _, _, _, _, step = env.step(rng.choice(step["admissible_actions"] or ["look"]))
        assert step["error"] is None or step["error"].kind == "invalid_action"
    assert step["turn"] == 8
    info, _, terminated = _replay(env, task_id)  # a fresh episode of the same game still succeeds
    assert info["success"]


@pytest.mark.slow
def test_check_env_passes():
    check_env(make("alfworld/valid_unseen-look_at_obj_in_light", data_root=DATA_ROOT), skip_render_check=True)


def test_missing_data_says_how_to_get_it(tmp_path, monkeypatch):
    monkeypatch.delenv("AGENTGYM_OPD_DATA", raising=False)
    monkeypatch.setenv("ALFWORLD_DATA", str(tmp_path / "nowhere"))
    with pytest.raises(DataNotFoundError, match="alfworld-download"):
        AlfWorldEnv("valid_unseen")
    monkeypatch.setenv("ALFWORLD_DATA", str(DATA_ROOT / "alfworld"))  # alfworld-download's own layout
    assert len(AlfWorldEnv("valid_unseen").task_ids()) == 134
    monkeypatch.setenv("AGENTGYM_OPD_DATA", str(DATA_ROOT))
    monkeypatch.setenv("ALFWORLD_DATA", str(tmp_path / "nowhere"))
    assert len(AlfWorldEnv("valid_unseen").task_ids()) == 134


def test_games_played_one_after_another_reuse_one_fast_downward_library_copy():
    """Each game loads fast-downward's library (33 MB, never unloaded); a dropped game's copy serves the next one,
    so a process that plays hundreds of games holds as many copies as it has games alive at once."""
    import gc

    from environments.alfworld import downward_pool

    first = AlfWorldEnv("valid_unseen", data_root=DATA_ROOT)
    ids = first.task_ids()
    first.reset(options={"task_id": ids[0]})
    before = downward_pool.loaded
    for task_id in ids[1:4]:  # each reset of another game closes and drops the previous one
        first.reset(options={"task_id": task_id})
        gc.collect()
    assert downward_pool.loaded <= before + 1  # the dropped games' copies were reused
    second = AlfWorldEnv("valid_unseen", data_root=DATA_ROOT)
    second.reset(options={"task_id": ids[5]})  # a game open beside another needs its own copy
    gc.collect()
    assert downward_pool.loaded - len(downward_pool._free) >= 2  # two live games, two copies in use
    info, reward, terminated = _replay(first, ids[6])  # a reused copy still plans the game to its end
    assert terminated and reward == 1.0, info
    first.close()
    second.close()
