"""One BFCL multi-turn (or agentic) episode run against BFCL's real backend classes.

Turn mapping (WHY: one env step must be one agent message, the turn boundary turn-level methods use):

* The task's user turns are BFCL's `question` list. The first observation shows user turn 0.
* Each agent message with calls is one BFCL *step*: the calls run for real against the task's backend
  instances (`GorillaFileSystem`, `MathAPI`, `TwitterAPI`, ...; made by BFCL's own code with the task's
  `initial_config`), by method lookup with validated keyword arguments (`executor.py`: BFCL's executor
  `eval`s source text, which agent text must never reach), and the results are the observation.
* An agent message with no calls (prose, or `[]`) ends the user turn, exactly as a non-call reply ends a
  turn in BFCL's prompting inference loop; the next user turn is shown. After the last user turn the
  episode ends and BFCL's `multi_turn_checker` replays the recorded calls on fresh instances and
  compares state and results with the ground truth (agentic categories: BFCL's `agentic_checker` scores
  the final text answer instead).
* A held-out function of `multi_turn_miss_func` appears at its turn with BFCL's own "I have updated some
  more functions" prompt; before that it is not callable.
* More than BFCL's `MAXIMUM_STEP_LIMIT` (20) steps in one user turn force-quits the episode, as in BFCL.
* Memory categories chain several sessions (prerequisite conversations, then the question): `memory.py`.

Differences from BFCL's loop, chosen for a training signal: a message that tries to call but cannot be
parsed is a `parse_error` and does not end the user turn (BFCL ends it); a call of a function not offered
of none of the involved classes, or with an argument name that is not an identifier, is refused with a
`tool_error` before execution (a held-out function is callable, as in BFCL, though not yet documented);
the other calls of such a message are not run either, so the replayed record equals what ran.
Positional arguments are dropped, as BFCL's decoder drops them, and the step says so (`tool_error`).
"""

from __future__ import annotations

import json
import uuid
import weakref
from typing import Any

from environments.bfcl._bfcl import bfcl, forget_instances
from environments.bfcl.calls import Call
from environments.bfcl.data import entry_copy
from environments.bfcl.executor import EXECUTION_ERROR_PREFIX, execute, method_table, validate, ValidCall


def _is_failed_result(result: str) -> str | None:
    """The error text of a backend result that reports failure, else None."""
    if result.startswith(EXECUTION_ERROR_PREFIX):
        return result
    if result.startswith("{"):
        try:
            data = json.loads(result)
        except json.JSONDecodeError:
            return None
        if isinstance(data, dict) and "error" in data and len(data) == 1:
            return str(data["error"])
    return None


class MultiTurnSession:
    """Backend state and the per-turn call record of one episode (see the module docstring)."""

    def __init__(self, entry: dict, ground_truth: Any, category: str, *, kind: str):
        self.entry = entry_copy(entry)
        self.ground_truth = ground_truth
        self.category = category
        self.kind = kind
        self.name = f"agentgymopd{uuid.uuid4().hex}"
        self.functions: list[dict] = list(self.entry.get("function", []))
        self.holdouts: dict[str, list[dict]] = dict(self.entry.get("missed_function", {}) or {})
        # Callable names: every documented function of the involved classes, held-out ones included (BFCL
        # executes any method of the backends; a held-out one is only missing from the docs shown).
        self.callable_names = {f["name"] for f in self.functions} | {
            f["name"] for docs in self.holdouts.values() for f in docs}
        self.turn_index = 0
        self.steps_in_turn = 0
        self.record: list[list[list[str]]] = [[]]
        self.final_text = ""
        self.finished = False
        self.force_quit = False
        self.verdict: dict | None = None
        # BFCL's executor caches instances in its module globals; free them however this session ends.
        self._release = weakref.finalize(self, forget_instances, self.name)
        self._instantiate()

    # ------------------------------------------------------------------ turns
    @property
    def num_user_turns(self) -> int:
        return len(self.entry["question"])

    @property
    def long_context(self) -> bool:
        return "long_context" in self.category or "composite" in self.category

    def function_names(self) -> set[str]:
        return {f["name"] for f in self.functions}

    def user_message(self) -> str:
        """The user turn now open, as text (BFCL's additional-function prompt for a held-out turn)."""
        key = str(self.turn_index)
        if key in self.holdouts:
            added = self.holdouts.pop(key)
            self.functions.extend(added)
            prompt = bfcl().default_prompts.DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_FC
            return f"user: {prompt}\nNew functions (JSON):\n{json.dumps(added, indent=2)}"
        messages = self.entry["question"][self.turn_index]
        return "\n".join(f"{m['role']}: {m['content']}" for m in messages)

    def end_turn(self, text: str) -> str | None:
        """Close the user turn; return the next user message, or None when the conversation is over."""
        self.final_text = text
        self.turn_index += 1
        self.steps_in_turn = 0
        if self.turn_index >= self.num_user_turns:
            self.finish()
            return None
        self.record.append([])
        return self.user_message()

    # ------------------------------------------------------------------ calls
    def _instantiate(self) -> None:
        """The task's backend instances, made by BFCL's own code (an empty call list: nothing is evaluated)."""
        _, self.instances = bfcl().execute_multi_turn_func_call(
            [],
            self.entry.get("initial_config", {}),
            self.entry["involved_classes"],
            self.name,
            self.entry["id"],
            long_context=self.long_context,
            is_evaL_run=False,
        )
        self._methods = method_table(self.instances)

    def unknown_calls(self, calls: list[Call]) -> list[str]:
        return [c.name for c in calls if c.name not in self.callable_names]

    @staticmethod
    def validate(calls: list[Call]) -> list[ValidCall]:
        """Each call reduced to BFCL's decoded form; raises `executor.InvalidCall` (nothing runs)."""
        return [validate(c) for c in calls]

    def execute(self, calls: list[ValidCall]) -> list[tuple[str, str]]:
        """Run one step's validated calls for real, by method lookup; returns (call source, result) pairs."""
        sources = [c.source() for c in calls]
        results = [execute(c, self._methods) for c in calls]
        self.record[-1].append(sources)
        self.steps_in_turn += 1
        limit = bfcl().default_prompts.MAXIMUM_STEP_LIMIT
        if self.steps_in_turn > limit:
            self.force_quit = True
            self.finish()
        return list(zip(sources, results))

    def pop_notice(self) -> str:
        """Text the env appends to the next observation (a memory episode's conversation switch)."""
        return ""

    @staticmethod
    def failed(result: str) -> bool:
        return _is_failed_result(result) is not None

    def held_out_docs(self) -> list[dict]:
        return [f for docs in self.holdouts.values() for f in docs]

    @staticmethod
    def failures(pairs: list[tuple[str, str]]) -> list[str]:
        out = []
        for source, result in pairs:
            error = _is_failed_result(result)
            if error is not None:
                out.append(f"{source}: {error}")
        return out

    # ------------------------------------------------------------------ scoring
    def finish(self) -> dict:
        if self.verdict is not None:
            return self.verdict
        self.finished = True
        b = bfcl()
        if self.kind == "memory_prereq":
            # BFCL does not score a prerequisite conversation; it flushes the memory to the snapshot that
            # the next conversation loads (also after a force-quit, as BFCL's inference loop does).
            for instance in self.instances.values():
                instance._flush_memory_to_local_file()
            self.verdict = {"valid": True, "prerequisite": True, "force_quit": self.force_quit}
        elif self.force_quit:
            limit = b.default_prompts.MAXIMUM_STEP_LIMIT
            self.verdict = {"valid": False, "error_message": f"Model has been forced to quit after {limit} steps.",
                            "error_type": "multi_turn:force_terminated"}
        elif self.kind == "agentic":
            answers = self.ground_truth if isinstance(self.ground_truth, list) else [self.ground_truth]
            self.verdict = b.agentic_checker(self.final_text, [str(a) for a in answers])
        else:
            entry = {k: self.entry[k] for k in ("id", "initial_config", "involved_classes") if k in self.entry}
            entry.setdefault("initial_config", {})
            try:
                self.verdict = b.multi_turn_checker(self.record, self.ground_truth, entry, self.category, self.name + "check")
            except Exception as exc:  # BFCL's checker asserts on mismatched instance sets; report, do not crash
                self.verdict = {"valid": False, "error_message": f"BFCL's multi-turn checker failed: {type(exc).__name__}: {exc}",
                                "error_type": "multi_turn:checker_error"}
        self.close()  # the episode is over: nothing runs on these backends again
        return self.verdict

    def close(self) -> None:
        self._release()
