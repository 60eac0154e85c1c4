"""Registries: register/make/list, close-match errors, gymnasium mirroring, and third-party plugins."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import gymnasium
import pytest

from agentgym_opd.registry import Registry, UnknownIdError, env_registry, make, register

HERE = Path(__file__).resolve().parent


@pytest.fixture(autouse=True)
def _tests_on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(HERE))


def test_register_make_with_defaults_and_overrides():
    register("testcounter/train", entry_point="counter_env:CounterEnv", description="counter", num_tasks=3)
    env = make("testcounter/train", max_turns=7)
    assert env.max_turns == 7 and len(env.task_ids()) == 3 and env.env_id == "testcounter/train"
    assert env.spec.id == "testcounter/train" and env.spec.kwargs["max_turns"] == 7
    assert "testcounter/train" in [s.id for s in env_registry.list()]
    # gymnasium's own registry sees it too, with its wrappers
    wrapped = gymnasium.make("testcounter/train")
    assert wrapped.unwrapped.task_ids() == env.task_ids()


def test_unknown_id_lists_close_matches():
    register("testcounter/valid_unseen", entry_point="counter_env:CounterEnv")
    with pytest.raises(UnknownIdError) as err:
        make("testcounter/valid_unsen")
    assert "testcounter/valid_unseen" in str(err.value) and "agentgym-opd envs" in str(err.value)


def test_conflicting_registration_is_refused():
    reg = Registry("thing", "agentgym_opd.no_such_group")
    reg.register("a", entry_point="x:Y")
    with pytest.raises(ValueError, match="already registered"):
        reg.register("a", entry_point="x:Z")
    reg.register("a", entry_point="x:Z", override=True)
    assert reg.spec("a").entry_point == "x:Z"


def test_bad_entry_point_is_explained():
    reg = Registry("thing", "agentgym_opd.no_such_group")
    reg.register("b", entry_point="json:no_such_attr")
    with pytest.raises(ImportError, match="no attribute 'no_such_attr'"):
        reg.make("b")
    reg.register("c", entry_point="json")
    with pytest.raises(ValueError, match="package.module:Name"):
        reg.make("c")


PLUGIN_ENV = '''
from agentgym_opd.core import StepOutcome, TextEnv, UnknownTaskError
from agentgym_opd.registry import register
from agentgym_opd.types import Task

class EchoEnv(TextEnv):
    def task_ids(self):
        return ["echo/0"]
    def get_task(self, task_id):
        if task_id != "echo/0":
            raise UnknownTaskError(task_id, ["echo/0"])
        return Task("echo/0", self.env_id, self.split, "Say hello.")
    def _start(self, task):
        return "Say hello."
    def _act(self, action):
        return StepOutcome("you said " + action, reward=float(action == "hello"), terminated=action == "hello")

class EchoAlgorithm:
    """An algorithm from a third-party package."""
    def __init__(self, lr=0.1):
        self.lr = lr

def register_envs():
    register("myplugin/echo", entry_point="myplugin:EchoEnv", description="echo from a plugin")
'''


def test_third_party_plugin_is_discovered_through_entry_points(tmp_path):
    """Build and install a throwaway plugin package into a temporary path; a fresh process finds its env and algo."""
    src = tmp_path / "src"
    (src / "myplugin").mkdir(parents=True)
    (src / "myplugin" / "__init__.py").write_text(PLUGIN_ENV)
    (src / "pyproject.toml").write_text(textwrap.dedent('''
        [build-system]
        requires = ["setuptools"]
        build-backend = "setuptools.build_meta"
        [project]
        name = "myplugin"
        version = "0.0.1"
        [project.entry-points."agentgym_opd.environments"]
        myplugin = "myplugin:register_envs"
        [project.entry-points."agentgym_opd.algorithms"]
        echo_algo = "myplugin:EchoAlgorithm"
        [tool.setuptools]
        packages = ["myplugin"]
    '''))
    site = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation", "--target", str(site), str(src)],
        check=True, capture_output=True, text=True,
    )
    script = textwrap.dedent('''
        import json
        import agentgym_opd, gymnasium
        # importing the package is enough for gymnasium's own registry: built-in and plugin ids
        gym_ids = [gymnasium.make(i).unwrapped.env_id for i in ("household/train", "myplugin/echo")]
        env = agentgym_opd.make("myplugin/echo")
        env.reset(seed=0)
        _, reward, terminated, _, _ = env.step("hello")
        algo = agentgym_opd.make_algorithm("echo_algo", lr=0.5)
        try:
            agentgym_opd.make("myplugin/ech")
        except agentgym_opd.UnknownIdError as exc:
            err = str(exc)
        print(json.dumps({"reward": reward, "terminated": terminated, "lr": algo.lr, "err": err, "gym_ids": gym_ids,
                          "algos": [s.id for s in agentgym_opd.list_algorithms()]}))
    ''')
    out = subprocess.run([sys.executable, "-c", script], check=True, capture_output=True, text=True,
                         env={**__import__("os").environ, "PYTHONPATH": str(site)})
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["reward"] == 1.0 and result["terminated"] is True and result["lr"] == 0.5
    assert "echo_algo" in result["algos"]
    assert "myplugin/echo" in result["err"] and "pip install -e ." in result["err"]  # how a new id becomes visible
    assert result["gym_ids"] == ["household/train", "myplugin/echo"]


def test_an_env_that_does_not_take_env_id_is_told_the_registry_passes_it():
    from agentgym_opd.core import TextEnv
    from agentgym_opd.registry import BadArgumentsError

    class NoKwargsEnv(TextEnv):  # a new user's first try: __init__ without **kwargs
        def __init__(self, split="train", max_turns=5):
            super().__init__(split, max_turns=max_turns)

    register("testnokwargs/train", entry_point=NoKwargsEnv)
    with pytest.raises(BadArgumentsError) as info:
        make("testnokwargs/train")
    message = str(info.value)
    assert "env_id='testnokwargs/train'" in message and "**kwargs" in message
    assert "--env-arg" not in message  # the user passed no argument: the generic advice would mislead


def test_an_argument_the_env_does_not_take_is_a_clear_error_listing_what_it_takes():
    from agentgym_opd.registry import BadArgumentsError

    with pytest.raises(BadArgumentsError) as info:
        make("household/train", num_taks=3)
    message = str(info.value)
    assert "'household/train'" in message and "num_taks" in message
    assert "num_tasks" in message.split("it accepts:")[1]  # the right spelling is offered
