"""A minimal TextEnv used by the core tests: reach a target number by typing `inc` / `dec`."""

from __future__ import annotations

from agentgym_opd.core import StepOutcome, TextEnv, UnknownTaskError
from agentgym_opd.types import StepError, Task


class CounterEnv(TextEnv):
    description = "count up to a target (core test env)"

    def __init__(self, split: str = "train", num_tasks: int = 5, **kwargs):
        super().__init__(split, **kwargs)
        self._ids = [f"counter/{split}/{i}" for i in range(num_tasks)]
        self.value = 0

    def task_ids(self):
        return list(self._ids)

    def get_task(self, task_id):
        if task_id not in self._ids:
            raise UnknownTaskError(task_id, self._ids)
        target = self._ids.index(task_id) + 1
        return Task(task_id, self.env_id, self.split, f"Reach {target}.", {"walkthrough": ["inc"] * target},
                    {"target": target})

    def _start(self, task):
        self.value = 0
        return f"{task.instruction} The counter is 0."

    def _act(self, action):
        if action not in ("inc", "dec"):
            return StepOutcome(f"Unknown action {action!r}.", error=StepError("invalid_action", f"{action!r} is not inc or dec"))
        self.value += 1 if action == "inc" else -1
        won = self.value == self.task.metadata["target"]
        return StepOutcome(f"The counter is {self.value}.", reward=float(won), terminated=won)

    def admissible_actions(self):
        return ["inc", "dec"]

    def progress(self):
        target = self.task.metadata["target"]
        return self.value == target, max(0.0, min(1.0, self.value / target))
