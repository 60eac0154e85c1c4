"""Hostile agent text against the in-process parsers of the code, BFCL, ACEBench and tool-use envs (issue 35).

Every case is text a policy could emit, sent through the public env API. None may raise out of `step`
(issue 35: a 7,000-character run of `-` made the code env raise MemoryError, `1+1+...` RecursionError, and
a 611-character call made BFCL and ACEBench raise RecursionError while *describing* a bad argument); each
ends as a typed error turn. The variants go beyond the issue's texts: every nesting shape Python's parser
or `ast.unparse` recurses on, and the fenced-block formats whose regular expressions used to backtrack
quadratically (each must now cost a few milliseconds of CPU time, measured with `process_time`, with a
bound far above that so a loaded machine cannot fail it).
"""

from __future__ import annotations

import json
import time

import pytest

from agentgym_opd.registry import make
from agentgym_opd.types import StepError

# ----------------------------------------------------------------------------- texts Python's parser chokes on
# Each is a module the host parses (code env) before anything runs. The two, then other shapes.
DEEP_MODULES = {
    "issue_minus_run": "x = " + "-" * 7000 + "1",  # MemoryError (parser stack)
    "issue_plus_chain": "x = " + "+".join(["1"] * 6000),  # RecursionError (AST construction)
    "not_run": "x = " + "not " * 3000 + "y",
    "invert_run": "x = " + "~" * 7000 + "1",
    "unary_mix": "x = " + "-+~" * 2500 + "1",
    "subscript_chain": "x = y" + "[0]" * 4000,
    "call_chain": "x = f" + "()" * 6000,
    "attribute_chain": "x = a" + ".b" * 6000,
    "power_chain": "x = " + "**".join(["2"] * 5000),
    "product_chain": "x = " + "*".join(["a"] * 6000),
    "indentation": "".join(" " * i + "if 1:\n" for i in range(120)) + " " * 120 + "pass",
    "parentheses": "x = " + "(" * 3000 + "1" + ")" * 3000,
}


@pytest.fixture(scope="module", params=["humaneval", "mbpp"])
def code_env(request, shared_data):
    """HumanEval first checks whether the code defines the entry point (a parse); MBPP parses it once."""
    turns = 2 * len(DEEP_MODULES) + 1
    if request.param == "humaneval":
        return make("code/humaneval", max_turns=turns)
    return make("code/mbpp", data_root=shared_data, max_turns=turns)


def test_code_env_turns_every_parser_failure_into_a_parse_error(code_env):
    code_env.reset(options={"task_id": code_env.task_ids()[0]})
    for name, code in DEEP_MODULES.items():
        for action in (code, f"```python\n{code}\n```"):
            obs, reward, terminated, truncated, info = code_env.step(action)
            error = info["error"]
            assert isinstance(error, StepError) and error.kind == "parse_error", (name, error)
            assert error.message.startswith("Your code does not parse.") and reward == 0.0 and not terminated, name
            assert code_env.last_result is None, name  # refused in the host: nothing reached the sandbox


def test_code_env_still_runs_code_that_parses():
    env = make("code/humaneval")
    _, info = env.reset(options={"task_id": "HumanEval/0"})
    reward = env.step(info["task"].privileged["walkthrough"][0])[1]
    assert reward == 1.0


# ----------------------------------------------------------------------------- call parsers (BFCL, ACEBench)
# Texts that parse as Python but whose pieces are not calls / names / literals: the env used to describe
# them with `ast.unparse`, which recurses once per level (the 611-character case is the first).
NOT_CALLS = {
    "issue_unary_run_as_a_call": "[" + "-" * 600 + "x]",
    "not_run_as_a_call": "[" + "not " * 400 + "x]",
    "attribute_chain_as_a_call": "[a" + ".b" * 900 + "]",
    "subscript_chain_as_a_name": "[x" + "[0]" * 500 + "(a=1)]",
    "call_chain_as_a_name": "[f" + "()" * 600 + "(a=1)]",
    "unary_run_as_an_argument": "[f(a=" + "-" * 600 + "x)]",
    "power_chain_as_an_argument": "[f(a=" + "**".join(["2"] * 700) + ")]",
    "lambda_run_as_an_argument": "[f(a=" + "lambda: " * 300 + "0)]",
    "plus_chain_as_a_call": "[" + "+".join(["1"] * 900) + "]",
    "parser_memory_error": "[f(a=" + "-" * 7000 + "1)]",
    "parser_recursion_error": "[f(a=" + "+".join(["1"] * 3000) + ")]",
}
CALL_ENVS = ["bfcl/simple_python", "bfcl/multi_turn_base", "acebench/normal_single_turn_single_function"]


@pytest.mark.parametrize("env_id", CALL_ENVS)
def test_call_envs_describe_bad_calls_without_recursion(env_id, shared_data):
    kwargs = {"data_root": shared_data} if env_id.startswith("acebench") else {}
    env = make(env_id, max_action_chars=20_000, max_turns=len(NOT_CALLS) + 1, **kwargs)
    env.reset(options={"task_id": env.task_ids()[0]})
    for name, text in NOT_CALLS.items():
        if env.done:
            env.reset(options={"task_id": env.task_ids()[0]})
        obs, reward, terminated, truncated, info = env.step(text)
        assert isinstance(info["error"], StepError) and info["error"].kind == "parse_error", (name, info["error"])
        assert reward == 0.0 and len(obs) < 5000, name


def test_a_bad_argument_is_quoted_from_the_agents_own_text():
    from environments.bfcl.calls import parse_calls

    parsed = parse_calls("[f(a=" + "-" * 600 + "x)]")
    assert "`" + "-" * 120 + "...`" in parsed.error and "only literal values" in parsed.error
    assert "`g(1) + 2`" in parse_calls("[f(a=g(1) + 2)]").error


# ----------------------------------------------------------------------------- linear-time fence handling
LONG = 16_000
FENCE_TEXTS = {
    "unclosed_fence_with_letters": "```" + "a" * LONG,
    "unclosed_fence_with_spaces": "```" + " " * LONG + "x",
    "unclosed_fence_with_dashes": "```" + "-" * LONG,
    "unclosed_json_fence_with_newlines": "```json" + "\n" * LONG,
    "many_unclosed_fences": "```a" * (LONG // 4),
}


def _cpu_seconds(function, *args) -> float:
    start = time.process_time()
    function(*args)
    return time.process_time() - start


@pytest.mark.parametrize("name", sorted(FENCE_TEXTS))
def test_fence_parsers_are_linear_in_the_reply(name):
    """Before: strip_fences 1.6 s, BFCL's parse_reply 6.1 s, tool use 1.1-2.2 s, the code env 0.14 s on these
    16,000-character texts (quadratic backtracking); now each takes milliseconds."""
    from environments.bfcl.calls import strip_fences
    from environments.bfcl.protocol import parse_reply
    from environments.code.programs import extract_code
    from environments.tooluse.calls import CallError, parse_call

    text = FENCE_TEXTS[name]

    def tooluse(t):
        try:
            parse_call(t)
        except CallError:
            pass

    for function, args in [(strip_fences, (text,)), (parse_reply, (text, "length")), (parse_reply, (text, "stop")),
                           (extract_code, (text,)), (tooluse, (text,))]:
        assert _cpu_seconds(function, *args) < 0.05, (name, function.__name__)


# ----------------------------------------------------------------------------- tool use
TOOLUSE_TEXTS = {
    "deep_arguments": '{"name": "add", "arguments": {"a": %s}}' % ("[" * 5000 + "]" * 5000),
    "huge_integer": '{"name": "get_total", "arguments": {"item": "apple", "quantity": %s}}' % ("9" * 5000),
    "unclosed_fence": "```json\n" + " " * LONG,
    "fullwidth_argument_name": json.dumps({"name": "add", "arguments": {"ａ": 1, "b": 2}}),
}


def test_tooluse_refuses_hostile_calls_with_typed_errors():
    env = make("tooluse/train", max_action_chars=20_000, max_turns=len(TOOLUSE_TEXTS) + 1)
    env.reset(options={"task_id": env.task_ids()[0]})
    for name, text in TOOLUSE_TEXTS.items():
        obs, reward, terminated, truncated, info = env.step(text)
        assert isinstance(info["error"], StepError) and info["error"].kind in ("parse_error", "tool_error"), name
        assert not terminated, name


def test_tooluse_does_not_cache_names_too_long_to_be_close_to_any_tool():
    from environments.tooluse.tools import _close_matches

    env = make("tooluse/train")
    env.reset(options={"task_id": env.task_ids()[0]})
    misses = _close_matches.cache_info().misses
    for i in range(20):
        info = env.step(json.dumps({"name": f"{i}" + "x" * 3000, "arguments": {}}))[4]
        assert info["error"].kind == "tool_error" and "unknown function" in info["error"].message
        if env.done:
            env.reset(options={"task_id": env.task_ids()[0]})
    assert _close_matches.cache_info().misses == misses  # difflib never ran, nothing was cached
    assert "Did you mean get_price" in env.step(json.dumps({"name": "get_prise", "arguments": {}}))[4]["error"].message


# ----------------------------------------------------------------------------- ACEBench's answer matching
def test_acebench_list_matching_is_polynomial():
    """Lists of near-duplicates: backtracking over orders tried 12! of them before failing."""
    from environments.acebench.matcher import values_equal

    want = ["x"] * 12 + ["y"]
    got = ["x"] * 12 + ["z"]
    assert _cpu_seconds(values_equal, got, want) < 0.5
    assert not values_equal(got, want)
    assert values_equal(["b", "a", "a"], ["a", "b", "a"]) and not values_equal(["a", "a", "b"], ["a", "b", "b"])
    assert values_equal([[1, 2], [3]], [[3], [2, 1]])
