"""`HouseholdEnv`: the embedded household world (ALFWorld in spirit) behind the `TextEnv` contract.

Pure Python, nothing downloaded: each task's room and goal are generated from (split, index) (see
`generator`), and its exact shortest walkthrough comes from `planner`. The agent speaks ALFWorld's
command language and sees ALFWorld-style observations; a command outside the admissible list is an
`invalid_action` error (ALFWorld prints "Nothing happens."; we say why). Reward is 1.0 on the step
that completes the goal (which ends the episode), else 0; `score` is the fraction of goal conditions met.

The first observation ends with the command grammar (`COMMAND_HELP`), so a model that never saw the world
knows what it may say. With `show_admissible=True` every observation also lists the admissible commands
of the new state (ALFWorld hands them out through its `admissible_commands` info; `info` has them here
either way).

Privileged data per task: `walkthrough` (the planner's shortest plan, which goes straight to hidden
objects), `solution` (the same as text) and `demonstration` (the observable expert of `expert`: it searches
until it sees the object, so a model cloned on it can generalise to rooms it never saw).

Options: `num_tasks` (defaults: 2000 train, 200 per valid split), `task_types` (a subset of the six
types; the registered ids `household/<split>-<task_type>` set it to one), `max_turns` (default 40: the
observable expert needs 16 turns on average and at most 35 on the valid splits (one train task in 2000
needs 41), the planner's walkthrough under 20),
`show_admissible` (default False), `status_line` (default False: every observation after the first ends with
the task and what the agent carries, "Your task is to: ... You are carrying: a bowl 2.", facts the agent can
always ask for with `inventory` or read in the first observation; the bench's household base pair uses it,
because a small model from scratch cannot yet retrieve the goal from many turns back), `goal_in_view`
(default False; needs `status_line`: the status line then ends "Wanted here: newspaper 3." when the agent sees
an object its task still needs: a goal object it has not yet placed while its hands are empty, or the lamp
while it holds the object to look at. It names what is in view, never where anything else is: the search
stays the agent's. Small models from scratch do not learn to compare the goal's object with a list of
objects in view, which an instruction-tuned model does without thinking; the base pair uses it too),
`turn_counter` (default False; needs `status_line`: the first observation and every status line end "Step 4
next.", the number of the coming action. A plan in the agent's context numbers its steps the same way
(`agentgym_opd.distill.actions_block`), so following it is a lookup of the current number; a network
from scratch cannot count its own past turns, which an instruction-tuned model keeps track of unasked). `data_root` is accepted for interface symmetry with the data-backed
families and ignored: this world needs no data.
"""

from __future__ import annotations

import os
from typing import Any

from agentgym_opd.core import StepOutcome, TextEnv, UnknownTaskError, fit_to_charset
from agentgym_opd.types import StepError, Task
from environments.household.commands import COMMAND_HELP, as_sentence, explain, resolve
from environments.household.expert import demonstration
from environments.household.generator import (
    DEFAULT_NUM_TASKS, SPLITS, GoalDraw, build_world, is_unseen_combination, task_indices,
)
from environments.household.goals import TASK_TYPES, GoalChecker
from environments.household.planner import plan
from environments.household.scenes import LAMP
from environments.household.world import WELCOME, World


class HouseholdEnv(TextEnv):
    """Embedded household world: ALFWorld's six task types in generated rooms, with exact walkthroughs."""

    description = "household world (ALFWorld-like): six task types, generated rooms, exact walkthroughs"
    # Every observation is built from the world's own ASCII vocabulary; the one place agent text is echoed
    # (why a command failed) is fitted to the charset there, so the base class need not test each step.
    valid_outcomes = True

    def __init__(self, split: str = "train", *, num_tasks: int | None = None,
                 task_types: tuple[str, ...] | list[str] | str | None = None, max_turns: int = 40,
                 show_admissible: bool = False, status_line: bool = False, goal_in_view: bool = False,
                 turn_counter: bool = False, data_root: str | os.PathLike | None = None, **kwargs: Any):
        if split not in SPLITS:
            raise ValueError(f"unknown household split {split!r}; expected one of {', '.join(SPLITS)}")
        if isinstance(task_types, str):
            task_types = (task_types,)
        if task_types is not None:
            task_types = tuple(task_types)
            bad = [t for t in task_types if t not in TASK_TYPES]
            if bad or not task_types:
                raise ValueError(f"unknown task types {bad}; expected a non-empty subset of {', '.join(TASK_TYPES)}")
        num_tasks = DEFAULT_NUM_TASKS[split] if num_tasks is None else int(num_tasks)
        if num_tasks < 1:
            raise ValueError(f"num_tasks must be at least 1, got {num_tasks}")
        default_id = f"household/{split}" + (f"-{task_types[0]}" if task_types and len(task_types) == 1 else "")
        kwargs.setdefault("env_id", default_id)
        super().__init__(split, max_turns=max_turns, **kwargs)
        self.num_tasks = num_tasks
        self.show_admissible = bool(show_admissible)
        self.status_line = bool(status_line)
        self.goal_in_view = bool(goal_in_view)
        if self.goal_in_view and not self.status_line:
            raise ValueError("goal_in_view extends the status line: pass status_line=True with it")
        self.turn_counter = bool(turn_counter)
        if self.turn_counter and not self.status_line:
            raise ValueError("turn_counter extends the status line: pass status_line=True with it")
        self.task_types = task_types
        self._draws = {d.task_id: d for d in (GoalDraw(split, i) for i in task_indices(num_tasks, task_types))}
        self._ids = list(self._draws)
        self._tasks: dict[str, Task] = {}
        self.world: World | None = None
        self.checker: GoalChecker | None = None

    # ------------------------------------------------------------------ tasks
    def task_ids(self) -> list[str]:
        return list(self._ids)

    def get_task(self, task_id: str) -> Task:
        task = self._tasks.get(task_id)
        if task is not None:
            return task
        draw = self._draws.get(task_id)
        if draw is None:
            raise UnknownTaskError(task_id, self._ids)
        world = build_world(draw)
        checker = GoalChecker(draw.goal, world)
        walkthrough = plan(world, checker)
        demo = demonstration(world, checker)
        goal = draw.goal
        if goal.target == LAMP:
            prep, target_type = "", LAMP
        else:
            prep, target_type = world.r_prep[world.r_index[goal.target]], goal.target.split(" ")[0]
        instruction = goal.instruction(prep, draw.variant)
        privileged = {
            "walkthrough": walkthrough,
            "solution": "\n".join(f"> {a}" for a in walkthrough),
            "demonstration": demo,
        }
        metadata = {
            "task_type": goal.task_type, "scene": draw.scene.name, "object_type": goal.obj_type,
            "target": goal.target, "combination": [goal.obj_type, target_type],
            "unseen_combination": is_unseen_combination(goal.obj_type, target_type),
            "index": draw.index, "optimal_turns": len(walkthrough),
            "demonstration_turns": len(demo),
        }
        task = Task(task_id, self.env_id, self.split, instruction, privileged, metadata)
        self._tasks[task_id] = task
        return task

    # ------------------------------------------------------------------ episode
    def _start(self, task: Task) -> str:
        draw = self._draws[task.id]
        self.world = build_world(draw)
        self.checker = GoalChecker(draw.goal, self.world)
        first = f"{WELCOME}\n\n{self.world.look()}\n\nYour task is to: {task.instruction}\n\n{COMMAND_HELP}"
        if self.turn_counter:
            first += "\n\n" + self._next_step()
        return self._with_admissible(first)

    def _with_status(self, observation: str) -> str:
        """The observation of a step, with the status line where it is switched on."""
        if not self.status_line:
            return observation
        status = f"{observation}\nYour task is to: {self.task.instruction} {self.world.inventory()}"
        wanted = self.checker.wanted_in_view() if self.goal_in_view else None
        if wanted is not None:
            status += f" Wanted here: {wanted}."
        return f"{status} {self._next_step()}" if self.turn_counter else status

    def _next_step(self) -> str:
        """The coming action's number, as a numbered plan (`actions_block`) names its steps."""
        return f"Step {self.turn + 1} next."

    def _with_admissible(self, observation: str) -> str:
        if not self.show_admissible:
            return observation
        return f"{observation}\nAdmissible actions: {', '.join(self.world.admissible())}."

    def _act(self, action: str) -> StepOutcome:
        world = self.world
        adm = world._adm
        cmd = (adm if adm is not None else world.admissible()).get(action)
        if cmd is None:
            cmd = resolve(world, action)
            if cmd is None:
                reason = explain(world, action)
                message = f"{as_sentence(reason)} The admissible_actions list the valid commands in this state."
                observation = fit_to_charset(f"Nothing happens. {message}")  # the message quotes the agent
                return StepOutcome(self._with_status(observation), error=StepError("invalid_action", message))
        observation = self._with_admissible(self._with_status(world.execute(cmd)))
        success = self.checker.check()[0]
        return StepOutcome(observation, 1.0 if success else 0.0, success)

    def admissible_actions(self) -> list[str] | None:
        if self.world is None:
            return None
        adm = self.world._adm
        return list(adm if adm is not None else self.world.admissible())

    def progress(self) -> tuple[bool, float]:
        if self.checker is None:
            return False, 0.0
        return self.checker.check()

    def episode_feedback(self) -> str:
        success, score = self.progress()
        if success:
            return f"Task completed in {self.turn} turns."
        parts = [f"Task not completed ({score:.0%} of the goal conditions met)"]
        if self.checker is not None:
            parts += self.checker.explain()
        text = "; ".join(parts) + "."
        if self.turn >= self.max_turns:
            text += f" Ran out of turns: the limit is {self.max_turns}."
        invalid = sum(1 for e in self.error_log if e.kind == "invalid_action")
        others = len(self.error_log) - invalid
        if invalid or others:
            text += f" {len(self.error_log)} of {self.turn} actions failed ({invalid} invalid commands)"
            text += f"; the last error: {self.error_log[-1].message}"
        return text
