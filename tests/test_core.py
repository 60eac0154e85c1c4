"""The TextEnv contract, checked on a minimal env: info keys, generic parse errors, turn limit, misuse."""

from __future__ import annotations

import pytest
from gymnasium.utils.env_checker import check_env

from agentgym_opd.core import EnvMisuseError, UnknownTaskError, fit_to_charset
from agentgym_opd.types import Episode, StepError, Task, Turn
from counter_env import CounterEnv

INFO_KEYS = {"turn", "error", "feedback", "success", "score", "admissible_actions"}


def test_gymnasium_check_env_passes():
    check_env(CounterEnv(), skip_render_check=True)


def test_reset_and_step_info_carry_every_key():
    env = CounterEnv()
    obs, info = env.reset(seed=0)
    assert INFO_KEYS | {"task"} <= set(info)
    assert isinstance(info["task"], Task) and info["turn"] == 0
    obs, reward, terminated, truncated, info = env.step("inc")
    assert INFO_KEYS <= set(info)
    assert info["turn"] == 1 and info["error"] is None


def test_same_seed_same_task_and_task_id_option():
    a, b = CounterEnv(), CounterEnv()
    assert a.reset(seed=3)[0] == b.reset(seed=3)[0]
    _, info = a.reset(options={"task_id": "counter/train/2"})
    assert info["task"].id == "counter/train/2"


@pytest.mark.parametrize(
    "action, kind",
    [("", "parse_error"), ("   \n", "parse_error"), ("x" * 10_240, "parse_error"), ("inc\udcff", "parse_error"),
     ("in\x00c", "parse_error"), ("jump", "invalid_action"), ("Ã©Ã¨ inc", "invalid_action")],
)
def test_bad_actions_become_step_errors_and_env_keeps_working(action, kind):
    env = CounterEnv()
    env.reset(options={"task_id": "counter/train/1"})
    obs, reward, terminated, truncated, info = env.step(action)
    assert isinstance(info["error"], StepError) and info["error"].kind == kind
    assert not terminated and not truncated and reward == 0.0
    env.step("inc")
    _, reward, terminated, _, info = env.step("inc")
    assert terminated and reward == 1.0 and info["success"] and info["error"] is None


def test_turn_limit_truncates_with_feedback():
    env = CounterEnv(max_turns=3)
    env.reset(options={"task_id": "counter/train/4"})
    for _ in range(2):
        assert not env.step("dec")[3]
    _, _, terminated, truncated, info = env.step("dec")
    assert truncated and not terminated
    assert "turn limit" in info["feedback"] and info["admissible_actions"] is None


def test_feedback_at_end_reports_errors():
    env = CounterEnv(max_turns=2)
    env.reset(options={"task_id": "counter/train/4"})
    env.step("jump")
    info = env.step("inc")[4]
    assert "1 of 2 actions failed" in info["feedback"] and "invalid_action" in info["feedback"]


def test_misuse_raises_clearly():
    env = CounterEnv()
    with pytest.raises(EnvMisuseError, match="reset"):
        env.step("inc")
    env.reset(options={"task_id": "counter/train/0"})
    env.step("inc")
    with pytest.raises(EnvMisuseError, match="episode is over"):
        env.step("inc")
    with pytest.raises(TypeError, match="str"):
        env.reset(seed=0) and env.step(3)  # type: ignore[arg-type]
    with pytest.raises(UnknownTaskError, match="counter/train/1"):
        env.reset(options={"task_id": "counter/train/11"})


def test_accepted_action_memo_changes_no_outcome():
    """`step` skips the text checks for a text it accepted before; misuse and odd text still get their errors."""
    import agentgym_opd.core as core

    env = CounterEnv(max_turns=50)
    env.reset(options={"task_id": "counter/train/4"})
    assert env.step("dec")[4]["error"] is None and "dec" in env._accepted_actions
    assert env.step(" dec ")[4]["error"] is None and " dec " not in env._accepted_actions  # stripped, not kept
    for bad in (["dec"], {"dec": 1}, b"dec", 3):
        with pytest.raises(TypeError, match="an action is a str"):
            env.step(bad)  # type: ignore[arg-type]
    assert env.turn == 2  # misuse did not count as a turn
    env.max_turns = env.turn + 1
    assert env.step("dec")[3]  # truncated: the episode is over
    with pytest.raises(EnvMisuseError, match="episode is over"):
        env.step("dec")  # a remembered text does not slip past the end of the episode
    env.reset(options={"task_id": "counter/train/4"})
    for i in range(core.ACCEPTED_ACTIONS_MAX + 5):  # the memory is bounded
        env._check_action(f"a{i}")
    assert 0 < len(env._accepted_actions) <= core.ACCEPTED_ACTIONS_MAX


def test_observations_fit_the_space():
    env = CounterEnv()
    text = "caf\u00e9 \u4e2d\u6587 \u2014 ok\x07"
    fitted = fit_to_charset(text)
    assert env.observation_space.contains(fitted)
    assert fitted.startswith("caf\u00e9 ??") and "\u2014" in fitted
    assert len(fit_to_charset("a" * 100_000)) == 65536
    assert fit_to_charset("plain\nascii\x07\tbell") == "plain\nascii?\tbell"  # the ASCII fast path still cleans
    assert fit_to_charset("line one\nline two") == "line one\nline two"


def test_step_error_kind_is_closed():
    with pytest.raises(ValueError, match="unknown StepError kind"):
        StepError("oops", "x")  # type: ignore[arg-type]


def test_episode_views():
    task = Task("t", "e", "train", "do it")
    ep = Episode(task, "start")
    ep.add(Turn("a1", "o1", info={"success": False, "score": 0.5}))
    ep.add(Turn("a2", "o2", reward=1.0, terminated=True, feedback="done", info={"success": True, "score": 1.0}))
    assert ep.success and ep.score == 1.0 and ep.return_ == 1.0 and ep.feedback == "done" and ep.done
    assert [m["role"] for m in ep.messages(system="s")] == ["system", "user", "assistant", "user", "assistant"]
    ep.input_ids, ep.loss_mask, ep.turn_index = [1, 2], [0, 1], [-1, 0]
    assert ep.token_view()["loss_mask"] == [0, 1]
    ep.turn_index = [0]
    with pytest.raises(ValueError, match="inconsistent"):
        ep.token_view()
