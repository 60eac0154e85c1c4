"""Env workers on a real local Ray cluster: same results as in-process, bad actions as StepErrors, and dead
actors replaced without losing or double-counting an episode."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest
import ray
from ray import cloudpickle

from agentgym_opd.core import EnvMisuseError, StepOutcome, TextEnv, UnknownTaskError
from agentgym_opd.executors import make_vector_env
from agentgym_opd.executors.ray_envs import RayVectorTextEnv
from agentgym_opd.playing import play_tasks
from agentgym_opd.policy.scripted import RandomAdmissibleAgent, ScriptedPolicy, TemplateTokens, WalkthroughAgent
from agentgym_opd.types import StepError, Task
from agentgym_opd.vector import VectorTextEnv

pytestmark = pytest.mark.slow  # every test runs under a module-wide Ray cluster (ray.init starts workers)

HALF_CPU = {"num_cpus": 0.5}  # room for replacement actors on the 2-CPU test cluster


def collect_episodes(vec, agent, ids, **kwargs):
    """Play scripted `agent` on `ids` over `vec` through the rollout engine (the one rollout loop)."""
    return play_tasks(ScriptedPolicy(agent, like=TemplateTokens.tiny()), vec, ids, max_context_tokens=10**9, **kwargs)

# The test-only env below is shipped to the actors by value (this file is not an importable package).
cloudpickle.register_pickle_by_value(sys.modules[__name__])


class FlakyEnv(TextEnv):
    """Count up to a target with `inc`; its backend dies (the process is SIGKILLed from inside) on demand.

    `crash_once_in` names a folder: the first time any process reaches turn 2 of a task listed in
    `crash_tasks`, it leaves a marker there and kills itself, so a replay on a fresh actor succeeds.
    `always_crash` tasks kill the process at turn 2 every time. The action `crash` kills it at once,
    `hang` sleeps far past any step timeout, `raise` raises a ValueError (an env bug hit by agent text) and
    `misuse` raises EnvMisuseError (a caller bug).
    """

    def __init__(self, split: str = "train", crash_once_in: str | None = None, crash_tasks: tuple[str, ...] = (),
                 always_crash: tuple[str, ...] = (), crash_reset_once_in: str | None = None, **kwargs):
        super().__init__(split, env_id="flaky/train", **kwargs)
        self._ids = [f"flaky/{i}" for i in range(6)]
        self.crash_once_in, self.crash_tasks, self.always_crash = crash_once_in, crash_tasks, always_crash
        self.crash_reset_once_in = crash_reset_once_in
        self.value = 0

    def task_ids(self):
        return list(self._ids)

    def get_task(self, task_id):
        if task_id not in self._ids:
            raise UnknownTaskError(task_id, self._ids)
        target = self._ids.index(task_id) + 3
        return Task(task_id, self.env_id, self.split, f"Reach {target}.", {"walkthrough": ["inc"] * target},
                    {"target": target})

    def _start(self, task):
        if task.id == "flaky/5":  # a backend that can never start this task
            os.kill(os.getpid(), signal.SIGKILL)
        if self.crash_reset_once_in and _first_to_claim(Path(self.crash_reset_once_in) / "reset"):
            os.kill(os.getpid(), signal.SIGKILL)
        self.value = 0
        return f"{task.instruction} The counter is 0."

    def _act(self, action):
        if action == "crash":
            os.kill(os.getpid(), signal.SIGKILL)
        if action == "hang":
            time.sleep(60)
        if action == "raise":  # an env bug triggered by agent text: its episode ends, the batch goes on
            raise ValueError("Exceeds the limit (4300 digits) for integer string conversion")
        if action == "misuse":
            raise EnvMisuseError("the caller stepped this env out of order")
        if self.turn == 2 and self.task.id in self.always_crash:
            os.kill(os.getpid(), signal.SIGKILL)
        if self.turn == 2 and self.task.id in self.crash_tasks and self.crash_once_in:
            marker = Path(self.crash_once_in) / self.task.id.replace("/", "_")
            if not marker.exists():
                marker.touch()
                os.kill(os.getpid(), signal.SIGKILL)
        if action != "inc":
            return StepOutcome(f"Unknown action {action!r}.", error=StepError("invalid_action", f"{action!r} is not inc"))
        self.value += 1
        won = self.value == self.task.metadata["target"]
        return StepOutcome(f"The counter is {self.value}.", reward=float(won), terminated=won)

    def admissible_actions(self):
        return ["inc"]

    def progress(self):
        return self.value >= self.task.metadata["target"], float(self.value)


@pytest.fixture(scope="module", autouse=True)
def ray_cluster():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


@pytest.fixture()
def household_ray():
    vec = make_vector_env("household/train", 2, executor="ray", actor_options=HALF_CPU)
    yield vec
    vec.close()


def _trace(episodes):
    return [(e.task.id, e.initial_observation, [(t.action, t.observation, t.reward, t.error, t.done) for t in e.turns],
             e.success, e.score) for e in episodes]


def test_make_vector_env_selects_the_executor():
    local = make_vector_env("household/train", 2)
    assert isinstance(local, VectorTextEnv) and local.num_envs == 2
    with pytest.raises(ValueError, match="unknown executor"):
        make_vector_env("household/train", 2, executor="dask")
    with pytest.raises(ValueError, match="executor=.ray. only"):
        make_vector_env("household/train", 2, actor_options=HALF_CPU)


def test_ray_matches_local_executor(household_ray):
    local = make_vector_env("household/train", 2)
    ids = local.envs[0].task_ids()[:5]
    assert household_ray.task_ids()[:5] == ids
    for agent in (WalkthroughAgent(), RandomAdmissibleAgent(seed=3)):
        got_local = collect_episodes(local, agent, ids)
        got_ray = collect_episodes(household_ray, agent, ids)
        assert _trace(got_ray) == _trace(got_local)
        assert [e.task.id for e in got_ray] == ids
    assert all(e.success for e in collect_episodes(household_ray, WalkthroughAgent(), ids))

    # The bare vector interface too: same reset, same step results for the same actions.
    opts = [{"task_id": ids[0]}, {"task_id": ids[1]}]
    (lo, li), (ro, ri) = local.reset(options=opts)[0], household_ray.reset(options=opts)[0]
    assert lo == ro and li["task"] == ri["task"] and li["admissible_actions"] == ri["admissible_actions"]
    actions = [li["admissible_actions"][0], None]
    lr, rr = local.step(actions), household_ray.step(actions)
    assert rr[1] is None and (rr[0].observation, rr[0].reward, rr[0].done) == (lr[0].observation, lr[0].reward, lr[0].done)


def test_bad_actions_come_back_as_step_errors(household_ray):
    ids = household_ray.task_ids()[:2]
    household_ray.reset(options=[{"task_id": t} for t in ids])
    results = household_ray.step(["\x00\x01", "fly to the moon"])
    assert [r.info["error"].kind for r in results] == ["parse_error", "invalid_action"]
    assert "not a command" in results[1].info["error"].message and not any(r.done for r in results)
    # Caller misuse raises, with its own exception type, through Ray.
    with pytest.raises(UnknownTaskError, match="unknown task id 'nope'"):
        household_ray.reset(options=[{"task_id": "nope"}, None])
    with pytest.raises(TypeError, match="an action is a str"):
        household_ray.step([42, None])
    with pytest.raises(ValueError, match="needs 2 actions"):
        household_ray.step(["look"])


def _wait_until_dead(pid: int, timeout: float = 30.0) -> None:
    """ray.kill only asks the raylet to kill the actor; wait until its process is really gone (or a zombie)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return
        if state in ("Z", "X"):
            return
        time.sleep(0.02)
    raise AssertionError(f"actor process {pid} still alive {timeout:.0f} s after ray.kill")


def _first_to_claim(marker: Path) -> bool:
    """Create ``marker`` atomically; True for the one process that created it. (Checking that it exists and
    then touching it let two actors resetting side by side both crash: a fresh-clone CI run saw 2 restarts.)"""
    try:
        with open(marker, "x"):
            return True
    except FileExistsError:
        return False


def _flaky(**kwargs):
    return RayVectorTextEnv.from_env_fns([lambda: FlakyEnv(**kwargs) for _ in range(2)], actor_options=HALF_CPU)


@pytest.mark.parametrize("how", ["ray.kill", "os.kill from outside", "os.kill from inside"])
def test_dead_actor_gives_one_env_crash_result_and_is_replaced(how):
    with _flaky() as vec:
        vec.reset(options=[{"task_id": "flaky/0"}, {"task_id": "flaky/1"}])
        old_pids = vec.pids()
        action0 = "inc"
        if how == "ray.kill":
            ray.kill(vec.actors[0])
            _wait_until_dead(old_pids[0])
        elif how == "os.kill from outside":
            os.kill(old_pids[0], signal.SIGKILL)
        else:
            action0 = "crash"
        results = vec.step([action0, "inc"])
        crash, ok = results
        assert crash.truncated and not crash.terminated and crash.reward == 0.0
        assert crash.info["error"].kind == "env_crash" and crash.info["env_crashed"]
        assert crash.info["task"].id == "flaky/0" and crash.info["turn"] == 1
        assert ok.info["error"] is None and ok.observation == "The counter is 1."
        assert vec.restarts == [1, 0] and vec.crash_log[0]["task_id"] == "flaky/0"
        # The crashed episode is over: it is never reported again, and its slot must be skipped.
        with pytest.raises(RuntimeError, match="not running"):
            vec.step(["inc", None])
        for _ in range(3):
            assert vec.step([None, "inc"])[0] is None
        # A fresh actor (a new process) serves the slot from the next reset on.
        obs, info = vec.reset_at([0], options=[{"task_id": "flaky/0"}])[0]
        assert info["task"].id == "flaky/0" and vec.pids()[0] != old_pids[0]
        assert vec.step(["inc", None])[0].observation == "The counter is 1."


def test_collect_survives_a_kill_mid_run_without_losing_or_duplicating(household_ray):
    ids = household_ray.task_ids()[:6]
    walk = WalkthroughAgent()
    calls = {"n": 0}

    def agent_that_kills_a_worker(obs, info):
        calls["n"] += 1
        if calls["n"] == 7:  # mid-collection: several episodes done, two running
            pid = household_ray.pids()[1]
            ray.kill(household_ray.actors[1])
            _wait_until_dead(pid)  # else the actor may finish its work before the kill lands, and never crash
        return walk(obs, info)

    episodes = collect_episodes(household_ray, agent_that_kills_a_worker, ids)
    assert [e.task.id for e in episodes] == ids  # exactly the requested ones, once each, in order
    assert all(e.success and e.done for e in episodes)
    crashed = [e for e in episodes if e.metadata["crashes"]]
    assert len(crashed) == 1 and crashed[0].metadata["attempts"] == 2
    assert crashed[0].metadata["crashes"][0]["kind"] == "env_crash" and not crashed[0].metadata["gave_up"]
    assert all(t.error is None for e in episodes for t in e.turns)  # the replayed episode starts clean
    assert sum(household_ray.restarts) == 1 and len(household_ray.crash_log) == 1


def test_collect_replays_crashed_episodes_and_gives_up_after_the_limit(tmp_path):
    with _flaky(crash_once_in=str(tmp_path), crash_tasks=("flaky/1", "flaky/3"), always_crash=("flaky/4",)) as vec:
        ids = ["flaky/0", "flaky/1", "flaky/2", "flaky/3", "flaky/4", "flaky/1"]
        episodes = collect_episodes(vec, WalkthroughAgent(), ids, max_attempts=2)
    assert [e.task.id for e in episodes] == ids
    by_entry = {k: e for k, e in enumerate(episodes)}
    for k in (0, 2, 5):  # clean runs (the second flaky/1 entry: its crash marker already exists)
        assert by_entry[k].success and by_entry[k].metadata["attempts"] == 1 and not by_entry[k].metadata["crashes"]
    for k in (1, 3):  # crashed once, replayed from the first turn on a fresh actor
        e = by_entry[k]
        assert e.success and e.metadata["attempts"] == 2 and len(e.metadata["crashes"]) == 1
        assert e.num_turns == e.task.metadata["target"]
    gave_up = by_entry[4]
    assert not gave_up.success and gave_up.metadata["gave_up"] and gave_up.metadata["attempts"] == 2
    assert gave_up.turns[-1].error.kind == "env_crash" and gave_up.turns[-1].truncated
    assert len(vec.crash_log) == 4  # flaky/1, flaky/3 once each, flaky/4 twice


def test_hung_step_times_out_and_the_actor_is_replaced():
    vec = RayVectorTextEnv.from_env_fns([FlakyEnv, FlakyEnv], actor_options=HALF_CPU, step_timeout_s=2.0)
    try:
        vec.reset(options=[{"task_id": "flaky/0"}, {"task_id": "flaky/1"}])
        hung, ok = vec.step(["hang", "inc"])
        assert hung.truncated and hung.info["error"].kind == "timeout" and hung.info["env_timed_out"]
        assert ok.info["error"] is None and vec.restarts == [1, 0]
        obs, _ = vec.reset_at([0], options=[{"task_id": "flaky/2"}])[0]
        assert obs.startswith("Reach 5.")
    finally:
        vec.close()


def test_reset_is_retried_on_a_fresh_actor_and_gives_up_clearly(tmp_path):
    with _flaky(crash_reset_once_in=str(tmp_path)) as vec:
        (obs0, _), (obs1, _) = vec.reset(options=[{"task_id": "flaky/0"}, {"task_id": "flaky/1"}])
        assert obs0.startswith("Reach 3.") and obs1.startswith("Reach 4.")
        assert sum(vec.restarts) == 1 and vec.crash_log[0]["phase"] == "reset"
        with pytest.raises(RuntimeError, match="died during reset 3 times"):
            vec.reset_at([1], options=[{"task_id": "flaky/5"}])
        assert vec.active[0] and not vec.active[1]  # the other env's episode is untouched
        assert vec.step(["inc", None])[0].observation == "The counter is 1."


def test_an_env_that_raises_on_agent_text_ends_that_episode_only_and_misuse_still_raises():
    with _flaky() as vec:
        vec.reset(options=[{"task_id": "flaky/0"}, {"task_id": "flaky/0"}])
        raised, fine = vec.step(["raise", "inc"])
        assert raised.truncated and not raised.terminated and raised.reward == 0.0
        assert raised.info["error"].kind == "env_crash" and "ValueError" in raised.info["error"].message
        assert not raised.info.get("env_crashed")  # the actor lives: nothing to replay, no restart
        assert vec.restarts == [0, 0] and vec.active == [False, True]
        assert fine.info["error"] is None and fine.observation == "The counter is 1."
        with pytest.raises(EnvMisuseError):
            vec.step([None, "misuse"])
