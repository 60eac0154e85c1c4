"""`AceBenchEnv`: ACEBench English `normal` categories, one call message per task, AST-matched.

Every `normal` task is one decision: given the API docs and the dialogue so far (ACEBench's multi-turn
categories are stored one row per turn, with the earlier turns in the question), emit the call(s) the
assistant should make next. The agent answers as in the BFCL envs (Python call syntax or a JSON list;
see `environments.bfcl.calls`); `matcher.py` compares them with the possible answers. A message that
cannot be parsed is a `parse_error` (the agent may answer again where `max_turns` allows, default 1; the last allowed answer ends the
episode, terminated);
calls that are not callable as documented also carry a `tool_error`; the episode ends after the first
parsed answer, with reward 1.0 when it matches.
"""

from __future__ import annotations

import json
import os
from typing import Any

from agentgym_opd.core import StepOutcome, TextEnv, UnknownTaskError
from agentgym_opd.types import StepError, Task
from environments.acebench.data import load_category
from environments.acebench.matcher import match, render_answer
from environments.bfcl.calls import parse_calls
from environments.bfcl.schema import check_calls

INSTRUCTION = (
    "You are an AI assistant with the role name \"assistant\". Based on the API descriptions below and the "
    "conversation so far, generate the API request(s) the assistant should make next. Answer with the calls "
    "only, in the format [ApiName(key1='value1', key2='value2', ...)] (or as a JSON list "
    '[{"name": "ApiName", "arguments": {"key1": "value1"}}]), with no other text.'
)


class AceBenchEnv(TextEnv):
    """ACEBench (English, normal categories): API-call generation scored against possible answers."""

    description = "ACEBench normal-category function calling, AST match against possible answers"

    def __init__(self, category: str = "normal_single_turn_single_function", split: str | None = None, *,
                 data_root: str | os.PathLike | None = None, max_turns: int = 1, max_action_chars: int = 8192,
                 **kwargs: Any):
        if split is not None and split != category:
            raise ValueError(f"ACEBench's split is its category: got split={split!r} for category {category!r}")
        kwargs.setdefault("env_id", f"acebench/{category}")
        super().__init__(category, max_turns=max_turns, max_action_chars=max_action_chars, **kwargs)
        self.category = category
        rows, self._answers = load_category(category, data_root)
        self._rows = {row["id"]: row for row in rows}
        self._ids = [row["id"] for row in rows]
        self._success = False

    def task_ids(self) -> list[str]:
        return list(self._ids)

    def _documented(self, row: dict) -> set[str]:
        return {f["name"] for f in row["function"]}

    def get_task(self, task_id: str) -> Task:
        if task_id not in self._rows:
            raise UnknownTaskError(task_id, self._ids)
        row = self._rows[task_id]
        answer = self._answers[task_id]
        alternatives = answer if isinstance(answer, list) else [answer]
        solution = render_answer(alternatives[0], self._documented(row))
        privileged = {"solution": solution, "walkthrough": [solution],
                      "answer": [render_answer(a, self._documented(row)) for a in alternatives]}
        metadata = {"category": self.category, "functions": sorted(self._documented(row))}
        return Task(task_id, self.env_id, self.split, row["question"].strip(), privileged, metadata)

    def _start(self, task: Task) -> str:
        self._success = False
        row = self._rows[task.id]
        context = []
        if row.get("time"):
            context.append(str(row["time"]).strip())
        if row.get("profile"):
            context.append(f"User profile: {row['profile']}")
        docs = json.dumps(row["function"], indent=2, ensure_ascii=False)
        return "\n\n".join([INSTRUCTION, f"API descriptions (JSON):\n{docs}", *context,
                            f"Conversation so far:\n{row['question'].strip()}"])

    def _act(self, action: str) -> StepOutcome:
        row = self._rows[self.task.id]
        parsed = parse_calls(action)
        if parsed.error or not parsed.calls:
            message = parsed.error or "No API call found in the answer."
            last_try = self.turn >= self.max_turns  # the final allowed answer ends the task: terminated
            return StepOutcome(f"{message} {INSTRUCTION}", error=StepError("parse_error", message), terminated=last_try,
                               feedback=f"No valid answer: {message}" if last_try else "")
        problems = check_calls(parsed.calls, row["function"])
        error = StepError("tool_error", " ".join(problems)) if problems else None
        ok, reason = match(parsed.calls, self._answers[self.task.id], self._documented(row))
        self._success = ok
        if ok:
            return StepOutcome("Correct.", reward=1.0, terminated=True, error=error, feedback="Matches a possible answer.")
        feedback = f"Does not match the possible answer: {reason}."
        observation = f"Incorrect. {feedback}" + (f"\n{error.message}" if error else "")
        return StepOutcome(observation, terminated=True, error=error, feedback=feedback)

    def progress(self) -> tuple[bool, float]:
        return self._success, float(self._success)
