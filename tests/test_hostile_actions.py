"""Hostile agent actions against the function-calling envs and the vector stepper (issue 18, parts 1 and 4).

Each case is text a policy could emit. None may run code in the trainer's process, raise out of `step`,
or stop the other episodes of a batch; each must come back as that step's `parse_error` / `tool_error`,
or, for an env that fails anyway, as that episode's `env_crash`.
"""

from __future__ import annotations

import json

import pytest

import agentgym_opd
from agentgym_opd.core import EnvMisuseError
from agentgym_opd.types import StepError
from agentgym_opd.vector import VectorTextEnv
from counter_env import CounterEnv
from environments.bfcl.calls import Call
from environments.bfcl.executor import InvalidCall, validate

SHELL = "__import__('os').system('touch pwned')"


def make(env_id, shared_data=None, **kwargs):
    if env_id.startswith("acebench/"):
        kwargs["data_root"] = shared_data
    return agentgym_opd.registry.make(env_id, **kwargs)


# ----------------------------------------------------------------------------- no eval of agent text
def test_argument_key_of_a_multi_turn_call_cannot_run_code(tmp_path, monkeypatch):
    """The issue's repro: BFCL's executor built `authenticate_travel(x=__import__(...),y=1)` and eval'd it."""
    monkeypatch.chdir(tmp_path)
    env = make("bfcl/multi_turn_base")
    env.reset(options={"task_id": "multi_turn_base_150"})  # a TravelAPI task: authenticate_travel is callable
    action = json.dumps([{"name": "authenticate_travel", "arguments": {f"x={SHELL},y": 1}}])
    obs, reward, terminated, truncated, info = env.step(action)
    assert not (tmp_path / "pwned").exists()
    assert info["error"].kind == "tool_error" and "not a Python identifier" in info["error"].message
    assert "Nothing was executed" in obs and not (terminated or truncated)


def test_argument_key_of_a_memory_call_cannot_run_code(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    env = make("bfcl/memory_kv")
    env.reset(options={"task_id": env.task_ids()[0]})
    action = json.dumps([{"name": "archival_memory_add", "arguments": {"key": "k", f"value='v',x={SHELL},y": 1}}])
    info = env.step(action)[4]
    assert not (tmp_path / "pwned").exists()
    assert info["error"].kind == "tool_error"


def test_string_values_stay_data_through_execution_and_bfcl_checker_replay(tmp_path, monkeypatch):
    """Quotes, parentheses and code in a value: executed as a plain string, and BFCL's checker, which
    replays the recorded calls with eval at the end of the episode, sees a string literal too."""
    monkeypatch.chdir(tmp_path)
    env = make("bfcl/multi_turn_base")
    env.reset(options={"task_id": "multi_turn_base_0"})
    for value in [f"x'),{SHELL}#", f'x"),{SHELL}#', f"x\\'),{SHELL}#", "\n" + SHELL]:
        obs = env.step(json.dumps([{"name": "mkdir", "arguments": {"dir_name": value}}]))[0]
        assert "Execution results" in obs
    while not env.done:  # end every user turn: the checker replays the record
        env.step("Done.")
    assert env.verdict is not None and not (tmp_path / "pwned").exists()


@pytest.mark.parametrize("key", ["a b", "1x", "class", "x)", "x=1,y", "", "__import__('os')"])
def test_call_validation_refuses_keys_that_are_not_identifiers(key):
    with pytest.raises(InvalidCall, match="not a Python identifier"):
        validate(Call("mkdir", {key: 1}))


@pytest.mark.parametrize("value", [float("inf"), float("nan"), {1, 2}, b"x", 1j, [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]])
def test_call_validation_refuses_values_that_are_not_plain_bounded_data(value):
    with pytest.raises(InvalidCall):
        validate(Call("mkdir", {"dir_name": value}))


# ----------------------------------------------------------------------------- no crash on hostile text
BIG = "1" * 5000
DEEP = "[" * 3000 + "]" * 3000
HOSTILE_TEXTS = {
    "integer_beyond_python_digit_limit": '[{"name": "f", "arguments": {"a": %s}}]' % BIG,
    "integer_in_arguments_string": json.dumps([{"name": "f", "arguments": '{"a": %s}' % BIG}]),
    "open_brackets": "[" * 3000,
    "deep_arguments_string": json.dumps([{"name": "f", "arguments": "[" * 3000}]),
    "deep_arguments_object": '[{"name": "f", "arguments": {"a": %s}}]' % DEEP,
    "deep_but_parsable_arguments": '[{"name": "f", "arguments": {"a": %s}}]' % ("[" * 500 + "]" * 500),
    "deep_python_call": "[f(a=%s)]" % DEEP,
    "deep_python_literal_within_parser": "[f(a=%s)]" % ("[" * 90 + "]" * 90),
    "infinite_float": '[{"name": "f", "arguments": {"a": Infinity}}]',
}
HOSTILE_ENVS = ["bfcl/simple_python", "bfcl/multi_turn_base", "bfcl/memory_kv",
                "acebench/normal_single_turn_single_function", "tooluse/train"]


@pytest.mark.parametrize("env_id", HOSTILE_ENVS)
def test_hostile_text_is_a_parse_error_and_the_env_keeps_working(env_id, shared_data):
    env = make(env_id, shared_data, max_action_chars=20_000, max_turns=len(HOSTILE_TEXTS) + 2)
    env.reset(options={"task_id": env.task_ids()[0]})
    for name, text in HOSTILE_TEXTS.items():
        obs, reward, terminated, truncated, info = env.step(text)
        # tooluse decodes a non-finite number and refuses it as its own type error (a tool_error)
        expected = "tool_error" if (env_id, name) == ("tooluse/train", "infinite_float") else "parse_error"
        assert isinstance(info["error"], StepError) and info["error"].kind == expected, (name, info["error"])
        assert reward == 0.0 and not terminated and len(obs) < 5000, name
    env.reset(options={"task_id": env.task_ids()[0]})  # and the env starts over cleanly


# ----------------------------------------------------------------------------- one bad env, not the batch
class FragileEnv(CounterEnv):
    """A counter whose `step` raises on one action, as an env with a parser bug would."""

    def _act(self, action):
        if action == "boom":
            raise RecursionError("maximum recursion depth exceeded" + "!" * 2000)
        return super()._act(action)


class MisusedEnv(CounterEnv):
    def _act(self, action):
        raise EnvMisuseError("the caller stepped this env out of order")


def test_an_env_that_raises_ends_its_own_episode_as_env_crash_and_the_batch_goes_on():
    vec = VectorTextEnv([FragileEnv(), FragileEnv(), FragileEnv()])
    vec.reset(options=[{"task_id": "counter/train/1"}] * 3)  # target 2: two incs
    results = vec.step(["inc", "boom", "inc"])
    crashed = results[1]
    assert crashed.truncated and not crashed.terminated and crashed.reward == 0.0
    assert crashed.info["error"].kind == "env_crash" and "RecursionError" in crashed.info["error"].message
    assert len(crashed.info["error"].message) < 500 and crashed.info["exception"] == "RecursionError"
    assert vec.active == [True, False, True]
    results = vec.step(["inc", None, "inc"])  # the others go on to the end
    assert [r is None or r.terminated for r in results] == [True, True, True]
    (obs, info), = vec.reset_at([1], [None], [{"task_id": "counter/train/0"}])  # the crashed slot is reusable
    assert vec.step([None, "inc", None])[1].terminated


def test_caller_misuse_still_raises():
    vec = VectorTextEnv([MisusedEnv()])
    vec.reset(seeds=[0])
    with pytest.raises(EnvMisuseError):
        vec.step(["inc"])


def test_hostile_text_through_a_vector_of_real_envs(shared_data):
    envs = [make(env_id, shared_data, max_action_chars=20_000) for env_id in HOSTILE_ENVS]
    vec = VectorTextEnv(envs)
    vec.reset(options=[{"task_id": e.task_ids()[0]} for e in envs])
    results = vec.step([HOSTILE_TEXTS["deep_arguments_string"]] * len(envs))
    assert all(r.info["error"].kind == "parse_error" for r in results)



class AlwaysFailingEnv(CounterEnv):
    def _act(self, action):
        raise ValueError("Exceeds the limit (4300 digits) for integer string conversion")


@pytest.mark.slow
def test_rollout_engine_keeps_the_other_episodes_when_one_env_raises():
    """The rollout engine steps through `VectorTextEnv`: a raising env ends its episode as env_crash."""
    from agentgym_opd.policy.base import SamplingParams
    from agentgym_opd.policy.hf import HFPolicy
    from agentgym_opd.policy.tiny import default_tiny_model
    from agentgym_opd.rollout import RolloutEngine

    engine = RolloutEngine(HFPolicy.from_pretrained(default_tiny_model()), SamplingParams(max_new_tokens=4, seed=0),
                           max_context_tokens=1024, action_parser=lambda text, finish_reason: ("inc", None))
    batch = engine.collect([CounterEnv(), AlwaysFailingEnv(), CounterEnv()], tasks=["counter/train/1"], group_size=3)
    healthy, crashed, other = batch.episodes
    assert crashed.num_turns == 1 and crashed.turns[0].error.kind == "env_crash" and crashed.turns[0].truncated
    assert healthy.success and other.success and healthy.num_turns == other.num_turns == 2
