"""ACEBench English `normal` envs on the real data in ../shared/data/acebench, AST-matched."""

from __future__ import annotations

import pytest
from gymnasium.utils.env_checker import check_env

import agentgym_opd
from agentgym_opd.data import DataNotFoundError
from agentgym_opd.types import StepError
from environments.acebench.data import NORMAL_CATEGORIES
from environments.acebench.env import AceBenchEnv
from environments.acebench.matcher import standardize, values_equal


@pytest.fixture(scope="module")
def root(shared_data):
    return shared_data


def test_every_normal_file_has_a_registered_id(root):
    folder = root / "acebench" / "data_all" / "data_en"
    on_disk = {p.stem.removeprefix("data_") for p in folder.glob("data_normal_*.json")}
    assert on_disk == set(NORMAL_CATEGORIES)
    env = agentgym_opd.registry.make("acebench/normal_atom_enum", data_root=root)
    assert env.spec.id == "acebench/normal_atom_enum" and len(env.task_ids()) == 50


@pytest.mark.parametrize("category", NORMAL_CATEGORIES)
def test_every_possible_answer_scores_one(root, category):
    env = AceBenchEnv(category, data_root=root)
    for task_id in env.task_ids():
        task = env.get_task(task_id)
        assert task.privileged["solution"] == task.privileged["answer"][0]
        for answer in task.privileged["answer"]:
            env.reset(options={"task_id": task_id})
            _, reward, terminated, _, info = env.step(answer)
            assert terminated and reward == 1.0 and info["success"], (task_id, answer, info["feedback"])


def _gold(env, task_id):
    env.reset(options={"task_id": task_id})
    return env.task.privileged["solution"]


def test_wrong_answers_score_zero_with_a_reason(root):
    env = AceBenchEnv("normal_atom_bool", data_root=root)
    gold = _gold(env, "normal_atom_bool_0")  # ProteinRichMealPlanner_generateList(..., include_vegetarian_options=True, ...)
    wrong_value = gold.replace("include_vegetarian_options=True", "include_vegetarian_options=False")
    assert wrong_value != gold
    _, reward, terminated, _, info = env.step(wrong_value)
    assert terminated and reward == 0.0 and "include_vegetarian_options" in info["feedback"]

    env.reset(options={"task_id": "normal_atom_bool_0"})
    _, reward, _, _, info = env.step(gold.replace("cuisine_preference='Asian'", "cuisine_preference='Italian'"))
    assert reward == 0.0 and "cuisine_preference" in info["feedback"]

    env.reset(options={"task_id": "normal_atom_bool_0"})
    _, reward, _, _, info = env.step(gold.replace(", cuisine_preference='Asian'", ""))
    assert reward == 0.0 and "missing argument" in info["feedback"]

    env.reset(options={"task_id": "normal_atom_bool_0"})
    _, reward, _, _, info = env.step(gold[:-1] + ", " + gold[1:])  # the right call twice
    assert reward == 0.0 and "expected 1" in info["feedback"]


def test_parallel_calls_match_in_any_order(root):
    env = AceBenchEnv("normal_single_turn_parallel_function", data_root=root)
    gold = _gold(env, "normal_single_turn_parallel_function_0")
    from environments.bfcl.calls import parse_calls, render_calls

    calls = parse_calls(gold).calls
    assert len(calls) == 2
    _, reward, _, _, _ = env.step(render_calls(calls[::-1]))
    assert reward == 1.0


def test_value_normalisation_rules():
    assert values_equal("New York", "new york") and values_equal("2023-08-01", "20230801")
    assert values_equal(5, 5.0) and values_equal("5", 5) and values_equal(True, "true")
    assert values_equal(["b", "a"], ["a", "b"]) and values_equal({"x": [1, 2]}, {"x": [2, 1]})
    assert not values_equal(5, 6) and not values_equal(True, False) and not values_equal("Asia", "Europe")
    assert not values_equal({"x": 1}, {"x": 1, "y": 2}) and not values_equal([1], [1, 1])
    assert standardize("A-b_c d") == "abcd"


@pytest.mark.parametrize(
    "action, kind, needle",
    [
        ("[NoSuchApi(x=1)]", "tool_error", "Unknown function 'NoSuchApi'"),
        ("[ProteinRichMealPlanner_generateList(cuisine_preference='Asian')]", "tool_error",
         "missing required argument 'meal_type'"),
        ("[ProteinRichMealPlanner_generateList(meal_type='dinner', include_vegetarian_options='yes', cuisine_preference='Asian')]",
         "tool_error", "'include_vegetarian_options' should be of type boolean, got str"),
        ('[{"name": "ProteinRichMealPlanner_generateList", "arguments": {"meal_type": ', "parse_error", "invalid JSON"),
        ("Sure, I will plan your meals.", "parse_error", "No API call found"),
        ("", "parse_error", "empty"),
        ("x" * 10_240, "parse_error", "characters long"),
        ("\udcff\x00", "parse_error", "invalid Unicode"),
    ],
)
def test_bad_calls_give_the_right_error_and_env_keeps_working(root, action, kind, needle):
    env = AceBenchEnv("normal_atom_bool", data_root=root, max_turns=2)
    gold = _gold(env, "normal_atom_bool_0")
    obs, reward, terminated, truncated, info = env.step(action)
    assert isinstance(info["error"], StepError) and info["error"].kind == kind
    assert needle in info["error"].message and reward == 0.0
    if kind == "parse_error":
        assert not terminated and not truncated
        _, reward, terminated, _, info = env.step(gold)
        assert terminated and reward == 1.0
    else:
        assert terminated
    assert _gold(env, "normal_atom_bool_1") and env.step(env.task.privileged["solution"])[1] == 1.0


def test_data_root_from_environment_and_clear_error_when_missing(root, monkeypatch, tmp_path):
    monkeypatch.setenv("AGENTGYM_OPD_DATA", str(root))
    monkeypatch.delenv("ACEBENCH_HOME", raising=False)
    assert len(AceBenchEnv("normal_similar_api").task_ids()) == 50
    monkeypatch.setenv("AGENTGYM_OPD_DATA", str(tmp_path))
    with pytest.raises(DataNotFoundError, match="acebench/data_all/data_en"):
        AceBenchEnv("normal_similar_api")
    monkeypatch.setenv("ACEBENCH_HOME", str(root / "acebench"))  # the benchmark's own repository layout
    assert len(AceBenchEnv("normal_similar_api").task_ids()) == 50


def test_observation_shows_docs_context_and_dialogue(root):
    env = AceBenchEnv("normal_atom_bool", data_root=root)
    obs, info = env.reset(options={"task_id": "normal_atom_bool_0"})
    assert "ProteinRichMealPlanner_generateList" in obs and "Asian cuisine" in obs
    assert info["task"].instruction.startswith("user:")


@pytest.mark.parametrize("category", ["normal_atom_number", "normal_preference"])
def test_gymnasium_check_env_passes(root, category):
    check_env(AceBenchEnv(category, data_root=root), skip_render_check=True)
