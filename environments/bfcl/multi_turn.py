"""One BFCL multi-turn (or agentic) episode run against BFCL's real backend classes.

Turn mapping (WHY: one env step must be one agent message, the turn boundary turn-level methods use):

* The task's user turns are BFCL's `question` list. The first observation shows user turn 0.
* Each agent message with calls is one BFCL *step*: the calls run for real against the task's backend
  instances (`GorillaFileSystem`, `MathAPI`, `TwitterAPI`, ...; made by BFCL's own code with the task's
  `initial_config`), by method lookup with validated keyword arguments (`executor.py`: BFCL's executor
  `eval`s source text, which agent text must never reach), and the results are the observation. The
  instances live in a bounded worker process (`backend_host.py`): one message's calls run under the env's
  `step_timeout_s` and a memory limit; a message that hits a bound has no effect (`BoundExceeded`, which
  the env reports as a `timeout` / `tool_error` step) and the episode goes on from the state before it.
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
the other calls of such a message are not run either. The record BFCL's checker replays holds exactly
the calls that ran (a call refused before its method ran, e.g. for an unknown keyword, is left out: in
BFCL it would fail again on replay and change nothing), each rebuilt from its validated name and
arguments and checked to parse back to them (`executor.ValidCall.source`); a message none of whose calls
ran adds no step to the record. The checker runs in the worker too, under `checker_timeout_s`.
Positional arguments are dropped, as BFCL's decoder drops them, and the step says so (`tool_error`).
"""

from __future__ import annotations

import json
from typing import Any

from agentgym_opd.bounded import BoundExceeded, RemoteError
from environments.bfcl._bfcl import bfcl
from environments.bfcl.backend_host import BackendUnavailable, HostedSession
from environments.bfcl.calls import Call
from environments.bfcl.data import entry_copy
from environments.bfcl.executor import EXECUTION_ERROR_PREFIX, validate, ValidCall

DEFAULT_STEP_TIMEOUT_S = 10.0  # one message's calls (BFCL's backends answer in microseconds)
DEFAULT_CHECKER_TIMEOUT_S = 60.0  # BFCL's checker replaying an episode, or a restore of the backends


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

    def __init__(self, entry: dict, ground_truth: Any, category: str, *, kind: str,
                 step_timeout_s: float = DEFAULT_STEP_TIMEOUT_S, checker_timeout_s: float = DEFAULT_CHECKER_TIMEOUT_S):
        self.entry = entry_copy(entry)
        self.ground_truth = ground_truth
        self.category = category
        self.kind = kind
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
        self.finish_bound: BoundExceeded | BackendUnavailable | None = None  # why the verdict could not be had
        self.backends = HostedSession(self.entry, self.long_context, step_timeout_s=step_timeout_s,
                                      checker_timeout_s=checker_timeout_s)

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
    def unknown_calls(self, calls: list[Call]) -> list[str]:
        return [c.name for c in calls if c.name not in self.callable_names]

    @staticmethod
    def validate(calls: list[Call]) -> list[ValidCall]:
        """Each call reduced to BFCL's decoded form, with source that replays exactly; raises
        `executor.InvalidCall` (nothing runs)."""
        valid = [validate(c) for c in calls]
        for call in valid:
            call.source()
        return valid

    def execute(self, calls: list[ValidCall]) -> list[tuple[str, str]]:
        """Run one step's validated calls for real, in the bounded worker; returns (call source, result) pairs.

        The calls that ran join the record. A step counts toward BFCL's step limit even when it hits a
        bound; then `BoundExceeded` propagates after the bookkeeping, and none of its calls is recorded."""
        sources = [c.source() for c in calls]
        self.steps_in_turn += 1
        bound = None
        try:
            results = self.backends.execute([(c.name, c.kwargs) for c in calls])
        except BoundExceeded as exc:
            bound, results = exc, []
        ran = [source for source, (did_run, _) in zip(sources, results) if did_run]
        if ran:
            self.record[-1].append(ran)
        if self.steps_in_turn > bfcl().default_prompts.MAXIMUM_STEP_LIMIT:
            self.force_quit = True
            self.finish()
        if bound is not None:
            raise bound
        return [(source, text) for source, (_, text) in zip(sources, results)]

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
            try:
                self.backends.flush_memory()
            except (BoundExceeded, BackendUnavailable) as exc:  # the next conversation starts empty (BFCL's rule)
                self.finish_bound = exc
            self.verdict = {"valid": True, "prerequisite": True, "force_quit": self.force_quit}
        elif self.force_quit:
            limit = b.default_prompts.MAXIMUM_STEP_LIMIT
            self.verdict = {"valid": False, "error_message": f"Model has been forced to quit after {limit} steps.",
                            "error_type": "multi_turn:force_terminated"}
        elif self.kind == "agentic":
            answers = self.ground_truth if isinstance(self.ground_truth, list) else [self.ground_truth]
            self.verdict = b.agentic_checker(self.final_text, [str(a) for a in answers])
        else:
            try:  # in the worker: the checker evals the record (literal calls that ran) on fresh instances
                self.verdict = self.backends.check(self.record, self.ground_truth, self.category)
            except (BoundExceeded, BackendUnavailable) as exc:
                self.finish_bound = exc
                self.verdict = {"valid": False, "error_type": "multi_turn:checker_bound",
                                "error_message": f"BFCL's checker could not replay the episode's calls within its "
                                                 f"limits: {exc}"}
            except RemoteError as exc:  # a failure of the worker's own code: an unscored episode, not a crash
                self.verdict = {"valid": False, "error_type": "multi_turn:checker_error",
                                "error_message": f"BFCL's multi-turn checker failed: {exc}"}
        self.close()  # the episode is over: nothing runs on these backends again
        return self.verdict

    def close(self) -> None:
        self.backends.close()
