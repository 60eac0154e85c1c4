"""ScienceWorld behind the `TextEnv` contract.

Decisions, and why:
* One id per task (`scienceworld/<task-name>`); tasks of a split are that task's variations in the
  benchmark's own train/dev/test folds, as `<task-name>/var-<n>`. `get_task` loads the variation with
  `generateGoldPath=True`, so `privileged["walkthrough"]` is the simulator's own gold path.
* Score is ScienceWorld's 0-100 (`info["score"]`); `success` is completion with score 100; the reward is the
  score delta, as in the benchmark. A negative score ends the episode (the benchmark's failure state).
* The raw `ScienceWorldEnv.step` also asks the JVM for look, inventory, task description and the full
  valid-action list on every step: several extra round trips, the valid-action enumeration the costliest.
  Here they are lazy: `step` calls the simulator once (plus score/completion); `valid_actions=True` puts
  the admissible list in `info` every step and `extras=True` adds `info["look"]`/`info["inventory"]`.
  `benchmarks/bench_real_envs.py` measures the difference.
* A JVM that dies mid-episode is an `env_crash` StepError on that step; the env starts a fresh JVM, reloads
  the variation and replays the episode's actions so far (the simulator is deterministic), so the episode
  continues from the same state.
"""

from __future__ import annotations

import shutil

from agentgym_opd.core import StepOutcome, TextEnv, UnknownTaskError
from agentgym_opd.types import StepError, Task

INSTALL_HINT = "pip install 'agentgym-opd[scienceworld]' (needs Java 17+ on PATH)"
_FOLDS = {"train": "train", "dev": "dev", "valid": "dev", "test": "test"}
_INVALID_PREFIXES = ("No known action matches that input.", "Unknown action")


def _load_engine_class():
    try:
        from scienceworld import ScienceWorldEnv
    except ImportError as exc:
        raise ImportError(f"ScienceWorld is not installed: {INSTALL_HINT}") from exc
    if shutil.which("java") is None:
        raise RuntimeError(f"ScienceWorld needs a Java runtime (java on PATH): {INSTALL_HINT}")
    return ScienceWorldEnv


class ScienceWorldTextEnv(TextEnv):
    """One ScienceWorld task; its variations in the split are the env's tasks."""

    description = "ScienceWorld science tasks"

    def __init__(
        self,
        split: str = "train",
        *,
        task_name: str = "boil",
        simplifications: str = "",
        valid_actions: bool = False,
        extras: bool = False,
        max_tasks: int | None = None,
        max_turns: int = 100,
        env_id: str | None = None,
        **kwargs,
    ):
        if split not in _FOLDS:
            raise ValueError(f"split must be one of {sorted(_FOLDS)}, got {split!r}")
        super().__init__(split, max_turns=max_turns, env_id=env_id or f"scienceworld/{task_name}", **kwargs)
        self._engine_cls = _load_engine_class()
        self.task_name, self.simplifications = task_name, simplifications
        self.want_valid_actions, self.want_extras = valid_actions, extras
        self.fold, self.max_tasks = _FOLDS[split], max_tasks
        self.engine = self._new_engine()
        if task_name not in list(self.engine.get_task_names()):
            raise ValueError(f"unknown ScienceWorld task {task_name!r}; see environments.scienceworld.TASK_NAMES")
        self._ids: list[str] | None = None
        self._tasks: dict[str, Task] = {}
        self._loaded: int | None = None
        self._history: list[str] = []
        self._score = 0
        self._completed = False
        self.restarts = 0

    def _new_engine(self):
        return self._engine_cls("", envStepLimit=self.max_turns + 10)

    # ------------------------------------------------------------------ tasks
    def task_ids(self) -> list[str]:
        if self._ids is None:
            self.engine.load(self.task_name, 0, self.simplifications)
            self._loaded = None
            getter = {"train": self.engine.get_variations_train, "dev": self.engine.get_variations_dev,
                      "test": self.engine.get_variations_test}[self.fold]
            variations = sorted(int(v) for v in getter())
            variations = variations[: self.max_tasks] if self.max_tasks else variations
            self._ids = [f"{self.task_name}/var-{v}" for v in variations]
        return list(self._ids)

    def _load(self, variation: int) -> None:
        self.engine.load(self.task_name, variation, self.simplifications, generateGoldPath=True)
        self._loaded = variation

    def get_task(self, task_id: str) -> Task:
        if task_id in self._tasks:
            return self._tasks[task_id]
        if task_id not in set(self.task_ids()):
            raise UnknownTaskError(task_id, self.task_ids())
        variation = int(task_id.rsplit("var-", 1)[1])
        self._load(variation)
        task = Task(
            id=task_id,
            env_id=self.env_id,
            split=self.split,
            instruction=str(self.engine.get_task_description()),
            privileged={"walkthrough": list(self.engine.get_gold_action_sequence())},
            metadata={"task_name": self.task_name, "variation": variation, "simplifications": self.simplifications},
        )
        self._tasks[task_id] = task
        return task

    # ------------------------------------------------------------------ episode
    def _start(self, task: Task) -> str:
        variation = task.metadata["variation"]
        if self._loaded != variation:
            self._load(variation)
        self.engine.server.reset()
        self._history = []
        self._score, self._completed = 0, False
        obs = self._raw_step("look around")
        return f"{task.instruction}\n\n{obs}"

    def _raw_step(self, action: str) -> str:
        """One simulator call plus score and completion: the minimum an episode needs."""
        server = self.engine.server
        obs = server.step(action)
        self._score = int(round(100 * server.getScore()))
        self._completed = bool(server.getCompleted()) or self._score < 0
        return str(obs)

    def _act(self, action: str) -> StepOutcome:
        before = self._score
        if self._jvm_exited():  # checked first: a call into a dead JVM floods py4j's log with retries
            return self._crash_and_restart("the JVM process exited")
        try:
            obs = self._raw_step(action)
        except Exception as exc:  # py4j errors: the JVM died or the connection broke
            if not self._engine_dead():
                raise
            return self._crash_and_restart(type(exc).__name__)
        self._history.append(action)
        error = None
        if obs.startswith(_INVALID_PREFIXES):
            error = StepError(
                "invalid_action",
                f"'{action}' does not match any ScienceWorld action. Use forms like 'look around', "
                "'go to <room>', 'open <object>', 'pick up <object>', 'move <object> to <container>', "
                "'focus on <object>', 'wait', 'inventory'.",
            )
        return StepOutcome(obs, reward=float(self._score - before), terminated=self._completed, error=error)

    def _crash_and_restart(self, cause: str) -> StepOutcome:
        self._restart()
        return StepOutcome(
            "The simulator crashed and was restarted; the world is as it was before your last action. "
            "Try the action again or choose another.",
            error=StepError("env_crash", f"ScienceWorld's JVM died ({cause}); it was restarted and the episode replayed."),
        )

    def _jvm_exited(self) -> bool:
        proc = getattr(getattr(self.engine, "_gateway", None), "java_process", None)
        return proc is not None and proc.poll() is not None

    def jvm_pid(self) -> int | None:
        """The simulator's JVM process id (tests kill it to check crash recovery)."""
        proc = getattr(getattr(self.engine, "_gateway", None), "java_process", None)
        return None if proc is None else proc.pid

    def _engine_dead(self) -> bool:
        if self._jvm_exited():
            return True
        try:
            self.engine.server.getScore()
            return False
        except Exception:
            return True

    def _restart(self) -> None:
        """A fresh JVM, the same variation, and the episode's actions replayed to restore the state."""
        self.restarts += 1
        old, self.engine = self.engine, self._new_engine()
        try:
            old._gateway.shutdown()
        except Exception:
            pass
        self._loaded = None
        self._load(self.task.metadata["variation"])
        self.engine.server.reset()
        history, self._history = self._history, []
        self._raw_step("look around")
        for action in history:
            self._raw_step(action)
            self._history.append(action)

    def admissible_actions(self) -> list[str] | None:
        if not self.want_valid_actions:
            return None
        return list(self.engine.get_valid_action_object_combinations())

    def progress(self) -> tuple[bool, float]:
        return self._completed and self._score >= 100, float(self._score)

    def step(self, action: str):
        obs, reward, terminated, truncated, info = super().step(action)
        if self.want_extras:
            info["look"] = str(self.engine.look())
            info["inventory"] = str(self.engine.inventory())
        return obs, reward, terminated, truncated, info

    def close(self) -> None:
        engine, self.engine = getattr(self, "engine", None), None
        if engine is not None:
            try:
                engine.close()
            except Exception:
                pass
