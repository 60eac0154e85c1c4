"""Hostile calls against BFCL's stateful backends (issue 35): bounded, local, and replayed exactly as they ran.

* `power(base=10, exponent=100000000)` computed in the trainer's process for as long as it took (a C loop no
  signal interrupts); now every backend call runs in a bounded worker process (`backend_host.py`), and a
  message that hits the time or memory bound is a typed error turn that changed nothing.
* `square_root(..., precision=2)` / `logarithm(..., precision=3)` changed the trainer's `decimal` and
  `mpmath` precision for everything after them; now each call runs in a local numeric context.
* A forged success: argument names in fullwidth letters were refused when the call ran, but BFCL's checker
  replayed the recorded source with `eval`, which normalises identifiers (NFKC), so the replay ran the real
  call: a walkthrough played that way scored 1.0 with every live call refused. Now such names are refused
  before anything runs, and the record holds only calls that ran, rebuilt from what ran.
"""

from __future__ import annotations

import decimal
import json

import mpmath
import pytest

from agentgym_opd.types import StepError
from environments.bfcl.calls import Call, parse_calls
from environments.bfcl.env import BfclEnv
from environments.bfcl.executor import InvalidCall, ValidCall, validate

MATH_TASK = "multi_turn_base_15"  # GorillaFileSystem + MathAPI
STEP_LIMIT_S = 2.0


@pytest.fixture
def math_env():
    env = BfclEnv("multi_turn_base", step_timeout_s=STEP_LIMIT_S)
    env.reset(options={"task_id": MATH_TASK})
    yield env
    env.close()


def step(env, action):
    obs, reward, terminated, truncated, info = env.step(action)
    return obs, info["error"], terminated


def recorded(env) -> list[str]:
    return [call for turn in env._session.record for message in turn for call in message]


# ----------------------------------------------------------------------------- time and memory bounds
HUGE_CALLS = {  # each would run for minutes or take gigabytes in the trainer's process
    "issue_power": ("[power(base=10, exponent=100000000)]", {"timeout"}),
    "huge_decimal_precision": ("[square_root(number=2, precision=1000000000)]", {"timeout", "tool_error"}),
    "huge_mpmath_precision": ("[logarithm(value=10, base=3, precision=100000000)]", {"timeout", "tool_error"}),
    # the memory bound: decimal / mpmath ask for the digits at once and get a MemoryError in the worker
    "max_decimal_precision": ("[square_root(number=2, precision=999999999999999999)]", {"tool_error"}),
}


@pytest.mark.timeout(600)
@pytest.mark.parametrize("name", sorted(HUGE_CALLS))
def test_a_call_past_a_bound_is_a_typed_error_that_changed_nothing(math_env, name):
    action, kinds = HUGE_CALLS[name]
    assert step(math_env, "[mkdir(dir_name='before')]")[1] is None
    obs, error, terminated = step(math_env, f"[mkdir(dir_name='lost'), {action[1:]}")
    assert isinstance(error, StepError) and error.kind in kinds and not terminated, (name, error)
    assert "none of them took effect" in error.message and error.message in obs
    # the worker was replaced; the next step finds the state as it was before that message (replayed)
    obs, error, _ = step(math_env, "[ls()]")
    assert error is None and '"before"' in obs and "lost" not in obs
    assert recorded(math_env) == ["mkdir(dir_name='before')", "ls()"]  # the bounded message left no trace


def test_a_backend_that_catches_its_own_memory_error_answers_with_it(math_env):
    """BFCL's `logarithm` catches every exception, its MemoryError included: that is its own error result."""
    before = decimal.getcontext().prec, mpmath.mp.prec
    obs, error, _ = step(math_env, "[logarithm(value=10, base=3, precision=1000000000000000)]")
    assert error is not None and error.kind == "tool_error" and "logarithm(" in obs
    assert (decimal.getcontext().prec, mpmath.mp.prec) == before
    assert step(math_env, "[logarithm(value=8, base=2, precision=5)]")[1] is None


def test_a_big_result_is_cut_in_the_worker_before_it_crosses_the_pipe():
    from environments.bfcl.backend_host import MAX_RESULT_CHARS, BackendHost

    host = BackendHost()  # the worker's service, here in the test's process
    host.open("agentgymopdtestbig", {"id": "multi_turn_base_0", "involved_classes": ["MathAPI"]}, False, [])
    host._sessions["agentgymopdtestbig"]["methods"]["big"] = lambda: "x" * (3 * MAX_RESULT_CHARS)
    ((ran, text),) = host.execute("agentgymopdtestbig", [("big", {})])
    assert ran and len(text) < MAX_RESULT_CHARS + 100 and text.endswith(f"[{2 * MAX_RESULT_CHARS} more characters]")
    host.close(["agentgymopdtestbig"])
    assert host.live_instance_names() == []


@pytest.mark.timeout(600)
def test_a_crashed_worker_is_replaced_and_the_state_replayed(math_env):
    from environments.bfcl.backend_host import backend_worker

    step(math_env, "[mkdir(dir_name='kept'), cd(folder='kept'), touch(file_name='f.txt')]")
    backend_worker()._proc.kill()  # as if the OS had killed it
    backend_worker()._proc.wait()
    obs, error, _ = step(math_env, "[ls()]")
    assert error is None and '"f.txt"' in obs


@pytest.mark.timeout(600)
def test_the_checker_runs_under_its_own_bound():
    env = BfclEnv("multi_turn_base", step_timeout_s=60, checker_timeout_s=0.5)
    env.reset(options={"task_id": MATH_TASK})
    error = step(env, "[power(base=10, exponent=3000000)]")[1]  # ~1 s of CPU: within the step bound
    assert "cannot be shown as text" in error.message  # 3,000,001 digits: past Python's str limit
    assert recorded(env) == ["power(base=10, exponent=3000000)"]  # it ran, so the checker replays it
    while not env.done:
        obs, error, terminated = step(env, "Done.")
    assert terminated and isinstance(error, StepError) and error.kind == "timeout"
    assert env.verdict["valid"] is False and "0.5 s" in error.message


# ----------------------------------------------------------------------------- numeric state
def test_precision_calls_leave_the_trainers_precision_alone(math_env):
    before = decimal.getcontext().prec, mpmath.mp.prec
    obs, error, _ = step(math_env, "[square_root(number=2, precision=2), logarithm(value=10, base=2, precision=3)]")
    assert error is None and "Decimal('1.4')" in obs
    assert (decimal.getcontext().prec, mpmath.mp.prec) == before


def test_each_backend_call_runs_in_a_local_numeric_context():
    """The same calls run in this process, through the executor: precision before == after."""
    from bfcl_eval.eval_checker.multi_turn_eval.func_source_code.math_api import MathAPI

    from environments.bfcl.executor import execute, method_table

    table = method_table({"MathAPI": MathAPI()})
    before = decimal.getcontext().prec, mpmath.mp.prec
    for call in ("square_root(number=2, precision=2)", "logarithm(value=10, base=2, precision=3)"):
        (parsed,) = parse_calls(f"[{call}]").calls
        ran, text = execute(validate(parsed), table)
        assert ran and "result" in text
    assert (decimal.getcontext().prec, mpmath.mp.prec) == before


# ----------------------------------------------------------------------------- what the checker replays
FULLWIDTH = {chr(c): chr(c + 0xFEE0) for c in range(ord("a"), ord("z") + 1)}


def fullwidth(name: str) -> str:
    return "".join(FULLWIDTH.get(ch, ch) for ch in name)


def forged(action: str) -> str:
    """A walkthrough message rewritten as JSON calls whose argument names are fullwidth letters."""
    parsed = parse_calls(action)
    if not parsed.calls:
        return action
    return json.dumps([{"name": c.name, "arguments": {fullwidth(k): v for k, v in c.kwargs.items()}}
                       for c in parsed.calls])


def test_the_issues_forged_walkthrough_no_longer_succeeds():
    """Before: success, reward 1.0, with every call that had arguments refused when it ran."""
    env = BfclEnv("multi_turn_base")
    walkthrough = env.get_task("multi_turn_base_0").privileged["walkthrough"]
    env.reset(options={"task_id": "multi_turn_base_0"})
    refused = 0
    for action in walkthrough:
        obs, reward, terminated, truncated, info = env.step(forged(action))
        if any(call.kwargs for call in parse_calls(action).calls or ()):
            assert info["error"] is not None and info["error"].kind == "tool_error"
            assert "is not a plain identifier" in info["error"].message and "Nothing was executed" in obs
            refused += 1
    assert refused > 0 and env.done and not info["success"] and reward == 0.0
    assert all(source.isascii() for source in recorded(env))


# Identifiers Python's NFKC normalisation changes: fullwidth, ligature, mathematical bold, script,
# superscript, compatibility letters, and a decomposed accent (NFKC composes it).
NORMALISING_NAMES = ["ａ", "ﬁle_name", "𝐝𝐢𝐫_𝐧𝐚𝐦𝐞", "ℌ", "dirⁿame", "ǆ", "e\u0301", "ｄｉｒ＿ｎａｍｅ", "ª"]


@pytest.mark.parametrize("name", NORMALISING_NAMES)
def test_names_that_python_would_normalise_are_refused(name):
    assert name.isidentifier()  # a Python identifier, but not the string its source text would name
    with pytest.raises(InvalidCall, match="Python reads it as"):
        validate(Call("mkdir", {name: "x"}))
    with pytest.raises(InvalidCall, match="Python reads it as"):
        validate(Call(name, {}))
    with pytest.raises(InvalidCall, match="replays exactly"):  # the last gate, if validation were bypassed
        ValidCall("mkdir", {name: "x"}).source()


def test_plain_identifiers_outside_ascii_still_pass():
    assert validate(Call("mkdir", {"café": 1})).source() == "mkdir(café=1)"


def test_replay_source_is_exactly_the_call_that_ran():
    call = ValidCall("mkdir", {"dir_name": "a'b\"c\\)", "n": 1, "f": 1.0, "t": True, "l": [1, (2, 3)], "d": {"k": None}})
    assert call.source() == ("mkdir(dir_name='a\\'b\"c\\\\)', n=1, f=1.0, t=True, l=[1, (2, 3)], d={'k': None})")


def test_only_calls_that_ran_are_recorded(math_env):
    step(math_env, "[mkdir(dir_name='x', mode=1)]")  # unknown keyword: refused before the method runs
    obs, error, _ = step(math_env, "[mkdir()]")  # missing argument: refused before the method runs
    assert "missing 1 required positional argument: 'dir_name'" in error.message
    step(math_env, "[mkdir(dir_name='y'), mkdir(dir_name='z', mode=2)]")
    step(math_env, "[cd(folder='no_such_dir')]")  # ran (and failed inside the backend): recorded, as in BFCL
    assert recorded(math_env) == ["mkdir(dir_name='y')", "cd(folder='no_such_dir')"]
    assert math_env._session.record == [[["mkdir(dir_name='y')"], ["cd(folder='no_such_dir')"]]]


def test_the_checkers_verdict_crosses_the_pipe_as_bounded_plain_data():
    from environments.bfcl.backend_host import MAX_VERDICT_CHARS, _plain_verdict

    deep: list = []
    for _ in range(5000):
        deep = [deep]
    verdict = _plain_verdict({"valid": False, "details": {"state": object(), "big": "x" * (2 * MAX_VERDICT_CHARS)},
                              "deep": deep})
    assert verdict["valid"] is False and verdict["details"].endswith("... [cut]")
    assert verdict["deep"].startswith("<not printable: RecursionError")
    assert _plain_verdict({"valid": True}) == {"valid": True}
    assert _plain_verdict({"d": {"o": object()}})["d"]["o"].startswith("<object object")


@pytest.mark.timeout(900)
def test_a_memory_episode_survives_its_worker_being_replaced_mid_conversation():
    """The open conversation is replayed on the snapshot the earlier ones left on disk: the oracle still wins."""
    from environments.bfcl.backend_host import backend_worker

    env = BfclEnv("memory_kv")
    task_id = "memory_kv_130-notetaker-0"
    walkthrough = env.get_task(task_id).privileged["walkthrough"]
    env.reset(options={"task_id": task_id})
    kills = 0
    for i, action in enumerate(walkthrough):
        obs, reward, terminated, truncated, info = env.step(action)
        assert info["error"] is None, (i, info["error"])
        if action.startswith("[") and not terminated:
            backend_worker()._proc.kill()
            backend_worker()._proc.wait()
            kills += 1
    assert kills >= 2 and terminated and reward == 1.0


@pytest.mark.timeout(600)
def test_backends_that_cannot_be_rebuilt_end_the_episode_with_a_typed_error():
    from environments.bfcl.backend_host import backend_worker

    env = BfclEnv("multi_turn_base", step_timeout_s=60, checker_timeout_s=0.3)
    env.reset(options={"task_id": MATH_TASK})
    step(env, "[power(base=10, exponent=3000000)]")  # ~1 s: fine for a step, too slow to replay in 0.3 s
    backend_worker()._proc.kill()
    backend_worker()._proc.wait()
    obs, error, terminated = step(env, "[ls()]")
    assert terminated and isinstance(error, StepError) and error.kind == "env_crash"
    assert "could not be rebuilt" in error.message and env.verdict["valid"] is False
