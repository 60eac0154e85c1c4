"""`ToolUseEnv`: the embedded tool-use world (a small shop) behind the `TextEnv` contract.

Pure Python, nothing downloaded. Each turn the agent emits one JSON call (see `calls`); it is executed
for real on the task's seeded `ShopWorld` and the JSON-serialised result is the observation. The
episode ends with `submit_answer` (reward 1.0 and success if it matches the gold answer tolerantly, see
`answers`; 0.0 otherwise - a wrong submit also ends the episode) or at `max_turns` (default 12).

Errors never end the episode: unparseable text is a `parse_error`; an unknown function, a missing,
unexpected or wrongly typed argument, or the function itself refusing (unknown item, out of stock) is a
`tool_error` whose message says how to fix the call.

Score (`progress`): 1.0 on a correct submit; otherwise partial credit 0.5 x the fraction of the gold
chain's calls (same function, arguments equal up to the answer tolerance) that the agent made
successfully, so a policy that does the right lookups but botches the last step is ranked above one
that did nothing. `data_root` is accepted for symmetry with data-backed families and ignored.
"""

from __future__ import annotations

import json
import os
from typing import Any

from agentgym_opd.core import StepOutcome, TextEnv, UnknownTaskError, fit_to_charset
from agentgym_opd.types import StepError, Task
from environments.tooluse.answers import answers_match
from environments.tooluse.calls import FORMAT_HINT, CallError, ToolSpec, parse_call, resolve
from environments.tooluse.tasks import DEFAULT_NUM_TASKS, SPLITS, GeneratedTask, GoldStep, generate
from environments.tooluse.tools import SUBMIT, TOOLS, ShopWorld, ToolFailure

TOOL_SPECS: dict[str, ToolSpec] = {name: ToolSpec.from_function(f) for name, f in TOOLS.items()}


TOOL_LISTING = "\n".join(f"- {s.signature_text()}\n    {s.doc}" for s in TOOL_SPECS.values())


def _same_call(step: GoldStep, name: str, arguments: dict[str, Any]) -> bool:
    if step.name != name or step.arguments.keys() != arguments.keys():
        return False
    return all(answers_match(arguments[k], v) for k, v in step.arguments.items())


class ToolUseEnv(TextEnv):
    """Embedded shop world: answer questions by chaining 1-4 typed function calls, then submit_answer."""

    description = "embedded tool-use world: typed JSON function calls on a seeded shop, 1-4 dependent calls"
    # Observations are JSON (ASCII-escaped by json.dumps) or error messages that quote agent text through
    # `tools.quote` (ascii(), bounded), so every one is in the text space without a per-step test.
    valid_outcomes = True

    def __init__(self, split: str = "train", *, num_tasks: int | None = None, max_turns: int = 12,
                 data_root: str | os.PathLike | None = None, **kwargs: Any):
        if split not in SPLITS:
            raise ValueError(f"unknown tooluse split {split!r}; expected one of {', '.join(SPLITS)}")
        num_tasks = DEFAULT_NUM_TASKS[split] if num_tasks is None else int(num_tasks)
        if num_tasks < 1:
            raise ValueError(f"num_tasks must be at least 1, got {num_tasks}")
        kwargs.setdefault("env_id", f"tooluse/{split}")
        super().__init__(split, max_turns=max_turns, **kwargs)
        self.num_tasks = num_tasks
        self._ids = [f"{split}-{i:05d}" for i in range(num_tasks)]
        self._index = {tid: i for i, tid in enumerate(self._ids)}
        self._generated: dict[str, GeneratedTask] = {}
        self._tasks: dict[str, Task] = {}
        self.world: ShopWorld | None = None
        self.current: GeneratedTask | None = None
        self.submitted: Any = None
        self.correct = False
        self.calls_made: list[tuple[str, dict[str, Any]]] = []

    # ------------------------------------------------------------------ tasks
    def task_ids(self) -> list[str]:
        return list(self._ids)

    def generated(self, task_id: str) -> GeneratedTask:
        gen = self._generated.get(task_id)
        if gen is None:
            if task_id not in self._index:
                raise UnknownTaskError(task_id, self._ids)
            gen = self._generated[task_id] = generate(self.split, self._index[task_id])
        return gen

    def get_task(self, task_id: str) -> Task:
        task = self._tasks.get(task_id)
        if task is None:
            gen = self.generated(task_id)
            walkthrough = gen.walkthrough
            task = Task(
                id=task_id, env_id=self.env_id, split=self.split, instruction=gen.instruction,
                privileged={"walkthrough": walkthrough, "solution": "\n".join(walkthrough),
                            "answer": str(gen.answer)},
                metadata={"template": gen.template, "num_calls": len(gen.gold)},
            )
            self._tasks[task_id] = task
        return task

    def tool_schemas(self) -> list[dict[str, Any]]:
        """JSON-schema-like dicts of the callable functions (for prompts and the CLI `play` command)."""
        return [s.schema() for s in TOOL_SPECS.values()]

    # ------------------------------------------------------------------ episode
    def _start(self, task: Task) -> str:
        self.current = self.generated(task.id)
        self.world = self.current.world.copy()
        self.submitted, self.correct = None, False
        self.calls_made = []
        return (f"You are a shop assistant with access to functions. Task: {task.instruction}\n\n"
                f"Available functions:\n{TOOL_LISTING}\n\n"
                f"{FORMAT_HINT} Each call's result is returned as JSON. Call one function per turn; feed results "
                f"into later calls. When you know the answer, call {SUBMIT} with it (this ends the episode).")

    def _act(self, action: str) -> StepOutcome:
        try:
            name, arguments = parse_call(action)
            spec = resolve(TOOL_SPECS, name)
            bound = spec.bind(arguments)
        except CallError as exc:
            return StepOutcome(f"Error: {exc.message}", error=StepError(exc.kind, exc.message))
        if name == SUBMIT:
            self.submitted = bound["answer"]
            self.correct = answers_match(self.submitted, self.current.answer)
            verdict = "correct" if self.correct else "incorrect"
            return StepOutcome(json.dumps(f"answer {str(self.submitted)[:200]} submitted: {verdict}"),
                               reward=1.0 if self.correct else 0.0, terminated=True)
        try:
            result = spec.func(self.world, **bound)
        except ToolFailure as exc:
            message = f"{name} failed: {exc}"
            return StepOutcome(f"Error: {message}", error=StepError("tool_error", message))
        except Exception as exc:  # a tool bug must not kill the rollout; report it as the tool's failure
            message = f"{name} raised {type(exc).__name__}: {exc}"
            # an exception's text can be anything: fit the observation to the text space
            return StepOutcome(fit_to_charset(f"Error: {message}"), error=StepError("tool_error", message))
        self.calls_made.append((name, bound))
        return StepOutcome(json.dumps(result))

    def _gold_steps_done(self) -> list[bool]:
        return [any(_same_call(step, n, a) for n, a in self.calls_made) for step in self.current.gold]

    def progress(self) -> tuple[bool, float]:
        if self.current is None:
            return False, 0.0
        if self.correct:
            return True, 1.0
        done = self._gold_steps_done()
        return False, 0.5 * sum(done) / len(done) if done else 0.0

    def episode_feedback(self) -> str:
        if self.correct:
            return f"Correct answer submitted in {self.turn} turns."
        parts = []
        if self.submitted is None:
            parts.append(f"No answer was submitted within {self.max_turns} turns; finish with {SUBMIT}.")
        else:
            parts.append(f"The submitted answer {self.submitted!s} is wrong.")
        done = self._gold_steps_done()
        missed = [i for i, ok in enumerate(done) if not ok]
        if missed:
            first = self.current.gold[missed[0]]
            tried = [a for n, a in self.calls_made if n == first.name]
            how = (f"it was called, but with different arguments ({json.dumps(tried[-1])})" if tried
                   else "it was never called successfully")
            parts.append(f"The solution needs {len(done)} function call(s) before submitting; step {missed[0] + 1} "
                         f"({first.name}) was missed: {how}.")
        elif self.submitted is not None:
            parts.append("All the needed calls were made; the final answer was not taken from the last result.")
        if self.error_log:
            parts.append(f"{len(self.error_log)} call(s) failed; the last error: {self.error_log[-1]}")
        return " ".join(parts)
