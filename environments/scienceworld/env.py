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
* A JVM that dies or stops answering is never fatal (`agentgym_opd.jvm`): every simulator call has a
  timeout (`step_timeout_s`; loading a variation with its gold path is slower and gets `load_timeout_s`),
  a failed call kills what is left of the JVM and starts a fresh one, and the restart leaves one log line.
  Mid-episode the step is an `env_crash` StepError and the env reloads the variation and replays the
  episode's actions (the simulator is deterministic), so the episode continues from the same state; on
  `reset` the fresh JVM starts the new episode and `info["error"]` reports the `env_crash`. A JVM that
  cannot be brought back (it fails again at once) ends the episode as an `env_crash`.
"""

from __future__ import annotations

import shutil

from agentgym_opd import jvm
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


class ScienceWorldTextEnv(jvm.JVMSimulatorEnv, TextEnv):
    """One ScienceWorld task; its variations in the split are the env's tasks."""

    description = "ScienceWorld science tasks"
    simulator = "ScienceWorld"

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
        step_timeout_s: float = 30.0,
        load_timeout_s: float = 300.0,
        env_id: str | None = None,
        **kwargs,
    ):
        if split not in _FOLDS:
            raise ValueError(f"split must be one of {sorted(_FOLDS)}, got {split!r}")
        if not (step_timeout_s > 0 and load_timeout_s > 0):
            raise ValueError(f"step_timeout_s and load_timeout_s must be > 0 seconds, got {step_timeout_s}, {load_timeout_s}")
        super().__init__(split, max_turns=max_turns, env_id=env_id or f"scienceworld/{task_name}", **kwargs)
        self.step_timeout_s, self.load_timeout_s = float(step_timeout_s), float(load_timeout_s)
        self._engine_cls = _load_engine_class()
        self.task_name, self.simplifications = task_name, simplifications
        self.want_valid_actions, self.want_extras = valid_actions, extras
        self.fold, self.max_tasks = _FOLDS[split], max_tasks
        self.restarts = 0
        self.engine = self._new_engine()
        if task_name not in list(self._call("startup", lambda: self.engine.get_task_names())):
            raise ValueError(f"unknown ScienceWorld task {task_name!r}; see environments.scienceworld.TASK_NAMES")
        self._ids: list[str] | None = None
        self._tasks: dict[str, Task] = {}
        self._loaded: int | None = None
        self._history: list[str] = []
        self._score = 0
        self._completed = False

    def _new_engine(self):
        engine = self._engine_cls("", envStepLimit=self.max_turns + 10)
        jvm.set_call_timeout(engine, self.step_timeout_s)
        return engine

    def _on_fresh_engine(self) -> None:
        self._loaded = None  # the new JVM has no variation loaded

    # ------------------------------------------------------------------ tasks
    def task_ids(self) -> list[str]:
        if self._ids is None:
            def variations_of_fold() -> list:
                self.engine.load(self.task_name, 0, self.simplifications)
                getter = {"train": self.engine.get_variations_train, "dev": self.engine.get_variations_dev,
                          "test": self.engine.get_variations_test}[self.fold]
                return list(getter())

            variations = sorted(int(v) for v in self._call("task listing", variations_of_fold))
            self._loaded = None
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

        def load_with_gold_path() -> tuple[str, list[str]]:
            self._load(variation)
            return str(self.engine.get_task_description()), list(self.engine.get_gold_action_sequence())

        instruction, walkthrough = self._call("task loading", load_with_gold_path)
        task = Task(
            id=task_id,
            env_id=self.env_id,
            split=self.split,
            instruction=instruction,
            privileged={"walkthrough": walkthrough},
            metadata={"task_name": self.task_name, "variation": variation, "simplifications": self.simplifications},
        )
        self._tasks[task_id] = task
        return task

    # ------------------------------------------------------------------ episode
    def _start(self, task: Task) -> str:
        self._history = []
        self._score, self._completed = 0, False
        obs = self._start_call(lambda: self._begin(task.metadata["variation"]))
        return f"{task.instruction}\n\n{obs}"

    def _begin(self, variation: int) -> str:
        """Load the variation if needed and start an episode in it: the first observation."""
        if self._loaded != variation:
            self._load(variation)
        self.engine.server.reset()
        return self._raw_step("look around")

    def _raw_step(self, action: str) -> str:
        """One simulator call plus score and completion: the minimum an episode needs."""
        server = self.engine.server
        obs = server.step(action)
        self._score = int(round(100 * server.getScore()))
        self._completed = bool(server.getCompleted()) or self._score < 0
        return str(obs)

    def _act(self, action: str) -> StepOutcome:
        before = self._score
        obs = self._step_call(self._raw_step, action)
        if isinstance(obs, StepOutcome):  # the JVM failed: restarted, episode replayed
            return obs
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

    def _replay(self) -> None:
        """Reload the episode's variation and replay its actions (the simulator is deterministic); the
        history is left as it is, so a second attempt after a failed one replays all of it again."""
        self._load(self.task.metadata["variation"])
        self.engine.server.reset()
        self._raw_step("look around")
        for action in self._history:
            self._raw_step(action)

    def admissible_actions(self) -> list[str] | None:
        if not self.want_valid_actions:
            return None
        try:
            return list(jvm.guarded(self.engine, self.engine.get_valid_action_object_combinations))
        except jvm.JVMFailure:  # the next step finds the failure and restarts the JVM
            return None

    def progress(self) -> tuple[bool, float]:
        return self._completed and self._score >= 100, float(self._score)

    def step(self, action: str):
        obs, reward, terminated, truncated, info = super().step(action)
        if self.want_extras:
            try:
                info["look"] = str(jvm.guarded(self.engine, self.engine.look))
                info["inventory"] = str(jvm.guarded(self.engine, self.engine.inventory))
            except jvm.JVMFailure:  # the next step finds the failure and restarts the JVM
                info["look"] = info["inventory"] = ""
        return obs, reward, terminated, truncated, info
