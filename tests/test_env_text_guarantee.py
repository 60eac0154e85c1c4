"""Envs that set `TextEnv.valid_outcomes` get no per-step repair of their outcomes, so they are held to it here.

Each such env (found through the registry, so a new one is tested without editing this file) plays hostile
agent text: code points from every Unicode block the charset leaves out, combining marks, JSON escapes
that decode to control characters and lone surrogates, maximal lengths, in every place the env might echo
them (command words, object names, tool names, argument names and values). Every observation must be a
member of `observation_space`, every reward a float and every `terminated` a bool, as gymnasium's API
promises; the same holds for actions from the admissible lists and for the gold walkthroughs.
"""

from __future__ import annotations

import json
import random
import string

import pytest

import agentgym_opd
from agentgym_opd.core import TextEnv
from agentgym_opd.registry import list_envs, load_entry_point

# Text an agent could send that the env's charset does not hold (CJK, emoji, Cyrillic, a line separator,
# a dotted capital I whose lower case grows a combining mark), plus text the charset does hold.
ODD = ["\u4e2d\u6587", "\U0001f34e", "\u0416\u0443\u043a", "\u2028", "\u0130stanbul", "e\u0301", "caf\u00e9", "\u00a0"]
# The same through JSON escapes, which decode to any code point, control characters and lone surrogates too.
ESCAPED = ["\\u0000", "\\u001b[31m", "\\ud800", "\\udfff\\u4e2d", "\\u2028", "\\u0007bell"]


def _vouching_env_ids() -> list[str]:
    ids = []
    for spec in list_envs():
        entry = spec.entry_point
        if isinstance(entry, str) and not entry.startswith("environments."):
            continue  # a third-party plugin registered during the test session
        cls = load_entry_point(entry)
        if isinstance(cls, type) and issubclass(cls, TextEnv) and cls.valid_outcomes:
            ids.append(spec.id)
    return ids


VOUCHING = _vouching_env_ids()


def test_the_embedded_worlds_vouch_for_their_outcomes():
    assert {"household/train", "household/valid_unseen", "tooluse/train", "tooluse/valid_unseen"} <= set(VOUCHING)


def _household_actions(rng: random.Random, odd: str, admissible: list[str]) -> list[str]:
    glued = rng.choice([o for o in ODD if not o.isspace()])  # whitespace would be stripped into a valid command
    return [f"go to {odd} 1", f"take {odd} from {admissible[0].split()[-2]} 1", f"{glued}{rng.choice(admissible)}",
            f"put {odd * 50} in/on {odd}", odd * 2000, f"open {odd}", f"use {odd}", f"heat {odd} with {odd}",
            "".join(rng.choice(ODD + list(string.ascii_letters + " ")) for _ in range(rng.randint(1, 400)))]


def _tool_calls(odd: str) -> list[str]:
    def call(name: str, **arguments: str) -> str:
        # hand-written JSON so that the escapes reach the decoder as escapes
        body = ", ".join(f'"{k}": "{v}"' for k, v in arguments.items())
        return f'{{"name": "{name}", "arguments": {{{body}}}}}'

    return [call(f"get_{odd}"), call("get_price", item=odd), call("get_price", **{odd: "apple"}),
            call("convert_currency", amount="1", from_currency=odd, to_currency="USD"),
            '{"name": "convert_currency", "arguments": {"amount": 1, "from_currency": "' + odd + '", "to_currency": "EUR"}}',
            '{"name": "convert_units", "arguments": {"value": 2, "from_unit": "' + odd + '", "to_unit": "kg"}}',
            call("cancel_order", order_id=odd * 700), call("search_catalogue", query=odd),
            call("get_stock", item=odd * 4000)[:4096], f"<tool_call>{odd}", f"```json\n{odd}",
            '{"name": "get_total", "arguments": {"item": "apple", "quantity": "' + odd + '"}}']


def _assert_valid(env: TextEnv, obs, reward=0.0, terminated=False, truncated=False) -> None:
    assert env.observation_space.contains(obs), f"{env.env_id}: observation outside the space: {obs[:200]!a}"
    assert type(reward) is float and type(terminated) is bool and type(truncated) is bool


def _generic_actions(odd: str) -> list[str]:
    """For a vouching env this file has no special knowledge of: the odd text alone, long, and inside words."""
    return [odd, odd * 4000, f"look at {odd}", f'{{"name": "{odd}", "arguments": {{"{odd}": "{odd}"}}}}']


@pytest.mark.parametrize("env_id", VOUCHING)
def test_hostile_text_never_leaves_the_observation_space(env_id):
    env = agentgym_opd.make(env_id, max_turns=400)
    rng = random.Random(env_id)
    family = env_id.split("/")[0]
    for episode, odd_text in enumerate(ODD + ESCAPED):
        obs, info = env.reset(seed=episode)
        _assert_valid(env, obs)
        if family == "household":
            odd = _household_actions(rng, odd_text, info["admissible_actions"])
        elif family == "tooluse":
            odd = _tool_calls(odd_text)
        else:
            odd = _generic_actions(odd_text)
        for action in odd * 2:  # twice: the second time through the accepted-action memo
            obs, reward, terminated, truncated, info = env.step(action)
            _assert_valid(env, obs, reward, terminated, truncated)
            if terminated or truncated:
                break
        if family in ("household", "tooluse"):  # none of their hostile actions is a valid command or call
            assert len(env.error_log) >= len(odd), (env_id, env.error_log)
        walkthrough = [] if terminated or truncated else env.task.privileged.get("walkthrough", [])
        for action in walkthrough:
            obs, reward, terminated, truncated, info = env.step(action)
            _assert_valid(env, obs, reward, terminated, truncated)
        if walkthrough and family in ("household", "tooluse"):
            assert terminated and reward == 1.0 and info["success"], env_id


@pytest.mark.parametrize("env_id", [i for i in VOUCHING if i.startswith("household/")][:1])
def test_random_admissible_play_stays_in_the_space(env_id):
    env = agentgym_opd.make(env_id)
    rng = random.Random(0)
    for episode in range(40):
        obs, info = env.reset(seed=episode)
        _assert_valid(env, obs)
        while True:
            obs, reward, terminated, truncated, info = env.step(rng.choice(info["admissible_actions"]))
            _assert_valid(env, obs, reward, terminated, truncated)
            if terminated or truncated:
                break


def test_a_tool_raising_any_text_is_fitted(monkeypatch):
    from environments.tooluse import env as tooluse_env

    def broken(world, item: str) -> float:
        raise RuntimeError(f"internal failure on {item} \u4e2d\x00" + "x" * 70_000)

    spec = tooluse_env.TOOL_SPECS["get_price"]
    monkeypatch.setitem(tooluse_env.TOOL_SPECS, "get_price", type(spec)(spec.name, broken, spec.params, spec.doc,
                                                                       spec.returns))
    env = agentgym_opd.make("tooluse/train")
    env.reset(seed=0)
    obs, reward, terminated, truncated, info = env.step(json.dumps({"name": "get_price", "arguments": {"item": "x"}}))
    _assert_valid(env, obs, reward, terminated, truncated)
    assert info["error"].kind == "tool_error" and "get_price raised RuntimeError: internal failure on x ?" in obs


def test_an_env_that_does_not_vouch_is_repaired_by_the_base_class():
    from counter_env import CounterEnv

    assert not CounterEnv.valid_outcomes
    env = CounterEnv()
    env.reset(seed=0)
    obs, reward, terminated, truncated, _ = env.step("caf\u00e9 \u4e2d")  # CounterEnv echoes unknown commands
    _assert_valid(env, obs, reward, terminated, truncated)
    assert "\u4e2d" not in obs


@pytest.mark.parametrize("env_id", VOUCHING)
def test_every_first_observation_is_in_the_space(env_id):
    env = agentgym_opd.make(env_id)
    for task_id in env.task_ids():
        obs, _ = env.reset(options={"task_id": task_id})
        _assert_valid(env, obs)
