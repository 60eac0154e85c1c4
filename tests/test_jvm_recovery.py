"""JVM-backed envs survive a JVM that is killed (SIGKILL) or frozen (SIGSTOP), with one log line per restart.

Each case: the env's JVM is killed or stopped at a point of an episode; the next `step` or `reset` must come
back (a frozen JVM within the configured step timeout) with an `env_crash`, the episode must go on where it
was (or the next one must start), and the log must hold one line for the restart and no traceback.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from pathlib import Path

import pytest

from agentgym_opd.registry import make

pytestmark = pytest.mark.slow

pytest.importorskip("scienceworld")
pytest.importorskip("textworld_express")

STEP_TIMEOUT_S = 5.0  # short for the test, yet above a step of a loaded machine


def _restart_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "agentgym_opd.jvm"]


def _assert_quiet(caplog, capfd, restarts: int) -> None:
    """Exactly one warning line per restart, nothing from py4j, no traceback on the terminal."""
    lines = _restart_lines(caplog)
    assert len(lines) == restarts, lines
    assert all("restarted it" in line for line in lines)
    loud = [r for r in caplog.records if r.levelno >= logging.WARNING and r.name != "agentgym_opd.jvm"]
    assert not loud, [r.getMessage()[:200] for r in loud]
    out, err = capfd.readouterr()
    assert "Traceback" not in out + err and len((out + err).splitlines()) <= restarts, (out + err)[-2000:]


def _gone(pid: int) -> bool:
    """The process exited and was reaped (a killed JVM must not linger as a stopped process)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def _freeze(pid: int) -> None:
    """SIGSTOP the JVM and wait until every one of its threads is stopped (delivery is not instantaneous,
    and a step sent meanwhile could still be answered)."""
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        states = [Path(f"/proc/{pid}/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()[0]
                  for tid in os.listdir(f"/proc/{pid}/task")]
        if all(state in ("T", "t") for state in states):
            return
        time.sleep(0.01)
    raise AssertionError(f"the JVM {pid} did not stop within 10 s of SIGSTOP")


def _play(env, actions):
    step = {}
    for action in actions:
        _, _, terminated, truncated, step = env.step(action)
        if terminated or truncated:
            break
    return step


# ---------------------------------------------------------------------------------------------- ScienceWorld
def test_scienceworld_frozen_jvm_times_out_restarts_and_the_episode_goes_on(caplog, capfd):
    caplog.set_level(logging.WARNING)
    env = make("scienceworld/find-plant", split="train", max_tasks=1, step_timeout_s=STEP_TIMEOUT_S)
    try:
        _, info = env.reset(options={"task_id": env.task_ids()[0]})
        walkthrough = info["task"].privileged["walkthrough"]
        _, _, _, _, step = env.step(walkthrough[0])
        score_before = step["score"]
        capfd.readouterr()
        frozen = env.jvm_pid()
        _freeze(frozen)
        started = time.monotonic()
        _, reward, terminated, _, step = env.step(walkthrough[1])
        waited = time.monotonic() - started
        assert step["error"].kind == "env_crash" and "no answer within" in step["error"].message
        assert not terminated and reward == 0.0 and step["score"] == score_before
        assert waited < STEP_TIMEOUT_S + 120, f"the frozen step took {waited:.0f} s"
        assert _gone(frozen) and env.jvm_pid() != frozen and env.restarts == 1
        step = _play(env, walkthrough[1:])
        assert step["success"], "the episode continues on the restarted JVM"
        _assert_quiet(caplog, capfd, restarts=1)
    finally:
        env.close()


def test_scienceworld_jvm_killed_after_an_episode_next_reset_works(caplog, capfd):
    caplog.set_level(logging.WARNING)
    env = make("scienceworld/find-plant", split="train", max_tasks=1, step_timeout_s=STEP_TIMEOUT_S)
    try:
        task_id = env.task_ids()[0]
        _, info = env.reset(options={"task_id": task_id})
        assert _play(env, info["task"].privileged["walkthrough"])["success"]
        capfd.readouterr()
        os.kill(env.jvm_pid(), signal.SIGKILL)
        env.engine._gateway.java_process.wait()
        obs, info = env.reset(options={"task_id": task_id})
        assert info["error"] is not None and info["error"].kind == "env_crash" and env.restarts == 1
        assert obs and info["score"] == 0
        assert _play(env, info["task"].privileged["walkthrough"])["success"]
        _, info = env.reset(options={"task_id": task_id})
        assert info["error"] is None, "a healthy reset reports no crash"
        _assert_quiet(caplog, capfd, restarts=1)
    finally:
        env.close()


# ---------------------------------------------------------------------------------------------- TextWorldExpress
def test_textworld_express_killed_and_frozen_jvm_restart_mid_episode(caplog, capfd):
    caplog.set_level(logging.WARNING)
    env = make("textworld_express/coin", split="dev", max_tasks=2, step_timeout_s=STEP_TIMEOUT_S)
    try:
        _, info = env.reset(options={"task_id": env.task_ids()[0]})
        walkthrough = info["task"].privileged["walkthrough"]
        assert len(walkthrough) >= 3
        _, _, _, _, step = env.step(walkthrough[0])
        admissible = step["admissible_actions"]
        capfd.readouterr()
        killed = env.jvm_pid()
        os.kill(killed, signal.SIGKILL)
        env.engine._gateway.java_process.wait()
        _, _, terminated, _, step = env.step(walkthrough[1])
        assert step["error"].kind == "env_crash" and "exited" in step["error"].message and not terminated
        assert step["admissible_actions"] == admissible, "the replayed game is where it was"
        frozen = env.jvm_pid()
        assert frozen != killed and env.restarts == 1
        _, _, _, _, step = env.step(walkthrough[1])
        assert step["error"] is None
        _freeze(frozen)
        started = time.monotonic()
        _, _, terminated, _, step = env.step(walkthrough[2])
        assert step["error"].kind == "env_crash" and "no answer within" in step["error"].message and not terminated
        assert time.monotonic() - started < STEP_TIMEOUT_S + 60
        assert _gone(frozen) and env.restarts == 2
        assert _play(env, walkthrough[2:])["success"], "the episode continues on the restarted JVM"
        _assert_quiet(caplog, capfd, restarts=2)
    finally:
        env.close()


def test_textworld_express_jvm_killed_after_an_episode_next_reset_works(caplog, capfd):
    caplog.set_level(logging.WARNING)
    env = make("textworld_express/coin", split="dev", max_tasks=2, step_timeout_s=STEP_TIMEOUT_S)
    try:
        task_id = env.task_ids()[0]
        _, info = env.reset(options={"task_id": task_id})
        assert _play(env, info["task"].privileged["walkthrough"])["success"]
        capfd.readouterr()
        os.kill(env.jvm_pid(), signal.SIGKILL)
        env.engine._gateway.java_process.wait()
        _, info = env.reset(options={"task_id": task_id})
        assert info["error"] is not None and info["error"].kind == "env_crash" and env.restarts == 1
        assert _play(env, info["task"].privileged["walkthrough"])["success"]
        _assert_quiet(caplog, capfd, restarts=1)
    finally:
        env.close()


def test_step_timeout_must_be_positive():
    with pytest.raises(ValueError, match="step_timeout_s"):
        make("textworld_express/coin", split="dev", step_timeout_s=0)
