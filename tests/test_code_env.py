"""Code envs on the real benchmark files: reference solutions pass, wrong ones fail with the failing test,
the agent can revise, bad input becomes a StepError, and gymnasium's checker accepts every env."""

from __future__ import annotations

import random
from concurrent.futures import ThreadPoolExecutor

import pytest
from gymnasium.utils.env_checker import check_env

from agentgym_opd.core import EnvMisuseError, UnknownTaskError
from agentgym_opd.data import DATA_ENV_VAR, DataNotFoundError
from agentgym_opd.registry import make
from environments.code.env import CodeEnv

SEED = 20261202  # the seeded samples below are fixed by this seed


def solve_with_walkthrough(env: CodeEnv, task_id: str) -> tuple[float, dict]:
    _, info = env.reset(options={"task_id": task_id})
    _, reward, terminated, _, step_info = env.step(info["task"].privileged["walkthrough"][0])
    assert terminated
    return reward, step_info


def solve_all(make_env, task_ids: list[str], workers: int = 2) -> dict[str, float]:
    """Run each task's walkthrough; one env per worker thread (each submission is its own subprocess)."""
    chunks = [task_ids[i::workers] for i in range(workers)]

    def run(chunk):
        env = make_env()
        return {tid: solve_with_walkthrough(env, tid)[0] for tid in chunk}

    rewards: dict[str, float] = {}
    with ThreadPoolExecutor(workers) as pool:
        for part in pool.map(run, chunks):
            rewards.update(part)
    return rewards


@pytest.fixture(scope="module")
def humaneval() -> CodeEnv:
    return make("code/humaneval")


@pytest.fixture(scope="module")
def mbpp(shared_data) -> CodeEnv:
    return make("code/mbpp", data_root=shared_data)


@pytest.mark.slow
def test_all_164_humaneval_canonical_solutions_pass(humaneval):
    ids = humaneval.task_ids()
    assert len(ids) == 164 and ids[0] == "HumanEval/0"
    rewards = solve_all(lambda: make("code/humaneval"), ids)
    failed = [tid for tid, reward in rewards.items() if reward != 1.0]
    assert failed == []


def test_humanevalplus_canonical_solutions_pass_on_a_seeded_sample(shared_data):
    env = make("code/humanevalplus", data_root=shared_data)
    assert len(env.task_ids()) == 164
    sample = random.Random(SEED).sample(env.task_ids(), 6)
    rewards = solve_all(lambda: make("code/humanevalplus", data_root=shared_data), sample)
    assert rewards == {tid: 1.0 for tid in sample}


@pytest.mark.parametrize("env_id", ["code/mbpp", "code/mbpp_sanitized"])
def test_mbpp_reference_code_passes_on_a_seeded_sample(shared_data, env_id):
    env = make(env_id, data_root=shared_data)
    ids = env.task_ids()
    assert all(11 <= int(tid.split("/")[1]) <= 510 for tid in ids)
    sample = random.Random(SEED).sample(ids, 12)
    rewards = solve_all(lambda: make(env_id, data_root=shared_data), sample)
    assert rewards == {tid: 1.0 for tid in sample}


def test_mbpp_splits_follow_the_standard_id_ranges(shared_data):
    sizes = {split: len(CodeEnv(split, dataset="mbpp", data_root=shared_data).task_ids())
             for split in ("test", "train", "validation", "prompt")}
    assert sizes == {"test": 500, "train": 374, "validation": 90, "prompt": 10}
    with pytest.raises(ValueError, match="splits"):
        CodeEnv("train", dataset="humaneval")


def test_first_observation_shows_the_problem_and_the_answer_format(humaneval, mbpp):
    obs, info = humaneval.reset(options={"task_id": "HumanEval/0"})
    assert "def has_close_elements(numbers: List[float], threshold: float) -> bool:" in obs
    assert "```python" in obs and info["task"].privileged["solution"].startswith("from typing")
    obs, info = mbpp.reset(options={"task_id": "mbpp/11"})
    assert "remove first and last occurrence" in obs
    assert 'assert remove_Occ("hello","l") == "heo"' in obs
    assert 'assert remove_Occ("abcda","a") == "bcd"' not in obs  # only one example test is shown
    assert info["task"].privileged["walkthrough"] == [f"```python\n{info['task'].privileged['solution'].rstrip()}\n```"]


def test_wrong_solution_scores_zero_with_the_failing_test_in_feedback(humaneval, mbpp):
    humaneval.reset(options={"task_id": "HumanEval/0"})
    obs, reward, terminated, truncated, info = humaneval.step(
        "```python\ndef has_close_elements(numbers, threshold):\n    return False\n```")
    assert reward == 0.0 and not terminated and not truncated and not info["success"]
    assert info["error"].kind == "runtime_error"
    assert "Failing test: assert candidate([1.0, 2.0, 3.9, 4.0, 5.0, 2.2], 0.3) == True" in info["feedback"]
    assert "AssertionError" in obs

    mbpp.reset(options={"task_id": "mbpp/11"})
    _, reward, _, _, info = mbpp.step("def remove_Occ(s, ch):\n    return s")
    assert reward == 0.0 and info["error"].kind == "runtime_error"
    assert "Failing test: assert remove_Occ(" in info["feedback"]


def test_humanevalplus_catches_what_the_base_tests_miss(shared_data):
    env = make("code/humanevalplus", data_root=shared_data)
    env.reset(options={"task_id": "HumanEval/0"})
    # passes HumanEval's base tests, fails the plus inputs (longer lists)
    weak = ("def has_close_elements(numbers, threshold):\n"
            "    return len(numbers) < 8 and any(abs(a - b) < threshold for i, a in enumerate(numbers) for b in numbers[:i])")
    _, reward, _, _, info = env.step(weak)
    assert reward == 0.0 and "returned False, expected True" in info["feedback"]


def test_revision_wrong_then_right_succeeds_on_turn_two(humaneval):
    _, info = humaneval.reset(options={"task_id": "HumanEval/2"})
    _, reward, terminated, _, step = humaneval.step("def truncate_number(number):\n    return number")
    assert reward == 0.0 and not terminated and step["turn"] == 1
    _, reward, terminated, truncated, step = humaneval.step(info["task"].privileged["walkthrough"][0])
    assert (reward, terminated, truncated, step["turn"], step["success"], step["score"]) == (1.0, True, False, 2, True, 1.0)
    with pytest.raises(EnvMisuseError):
        humaneval.step("anything")


def test_completion_format_body_only_is_accepted(humaneval):
    humaneval.reset(options={"task_id": "HumanEval/2"})
    _, reward, _, _, _ = humaneval.step("    return number % 1.0\n")
    assert reward == 1.0
    humaneval.reset(options={"task_id": "HumanEval/2"})
    _, reward, _, _, _ = humaneval.step("    whole = int(number)\n    return number - whole\n")
    assert reward == 1.0


def test_turn_limit_truncates(shared_data):
    env = make("code/mbpp", data_root=shared_data, max_turns=2)
    env.reset(options={"task_id": "mbpp/11"})
    assert env.step("x = 1")[3] is False
    _, reward, terminated, truncated, info = env.step("x = 2")
    assert (reward, terminated, truncated) == (0.0, False, True) and info["feedback"]


def test_timeout_and_syntax_error_kinds(shared_data):
    env = make("code/mbpp", data_root=shared_data, timeout_s=1.5)
    env.reset(options={"task_id": "mbpp/11"})
    _, _, _, _, info = env.step("def remove_Occ(s, ch):\n    while True:\n        pass")
    assert info["error"].kind == "timeout" and "time limit" in info["feedback"]
    _, _, _, _, info = env.step("```python\ndef remove_Occ(s, ch)\n    return s\n```")
    assert info["error"].kind == "parse_error" and "SyntaxError" in info["error"].message


@pytest.mark.parametrize("bad", ["", "   \n", "\udcff\x00", "garbage " * 1250, "```python\n```"])
def test_bad_input_is_a_parse_error_and_the_env_keeps_working(humaneval, bad):
    _, info = humaneval.reset(options={"task_id": "HumanEval/2"})
    _, reward, terminated, _, step = humaneval.step(bad)
    assert reward == 0.0 and not terminated
    assert step["error"].kind == "parse_error" and step["error"].message
    _, reward, terminated, _, _ = humaneval.step(info["task"].privileged["walkthrough"][0])
    assert reward == 1.0 and terminated


def test_misuse_raises(humaneval, shared_data):
    with pytest.raises(UnknownTaskError, match="HumanEval/1"):
        humaneval.reset(options={"task_id": "HumanEval/1000"})
    humaneval.reset(options={"task_id": "HumanEval/2"})
    with pytest.raises(TypeError):
        humaneval.step(None)


def test_missing_data_says_how_to_get_it(tmp_path, monkeypatch):
    monkeypatch.delenv(DATA_ENV_VAR, raising=False)
    with pytest.raises(DataNotFoundError, match="EvalPlus"):
        make("code/humanevalplus", data_root=tmp_path)
    with pytest.raises(DataNotFoundError, match="mbpp"):
        make("code/mbpp_sanitized", data_root=tmp_path)


def test_data_root_from_the_environment_variable(shared_data, monkeypatch):
    monkeypatch.setenv(DATA_ENV_VAR, str(shared_data))
    assert len(make("code/mbpp_sanitized").task_ids()) == 257


@pytest.mark.parametrize("env_id", ["code/humaneval", "code/humanevalplus", "code/mbpp", "code/mbpp_sanitized"])
def test_gymnasium_check_env_passes(shared_data, env_id):
    check_env(make(env_id, data_root=shared_data), skip_render_check=True)


def test_an_exception_in_the_candidate_reports_the_test_and_the_candidates_own_traceback(shared_data):
    # the tests run in the checker process and the candidate in another one: the feedback still names the
    # failing test and shows the candidate's frames (as main.py), none of the harness's
    env = make("code/mbpp", data_root=shared_data)
    env.reset(options={"task_id": "mbpp/11"})
    _, reward, _, _, info = env.step("def remove_Occ(s, ch):\n    x = helper(s)\n    return s")
    feedback = info["feedback"]
    assert reward == 0.0 and info["error"].kind == "runtime_error"
    assert 'Failing test: assert remove_Occ("hello","l") == "heo"' in feedback
    assert 'File "main.py", line 2, in remove_Occ' in feedback and "NameError: name 'helper'" in feedback
    assert "/sandbox/" not in feedback and "worker.py" not in feedback and "supervisor.py" not in feedback
