"""One BFCL memory episode: the scenario's prerequisite conversations, then the question.

WHY a chain of sessions: in BFCL each prerequisite conversation (`memory_<backend>_prereq_<i>-<scenario>-<k>`)
is its own test entry. Its backend (`MemoryAPI_kv` / `_vector` / `_rec_sum`) loads the scenario's latest
snapshot from the model's result folder, the model chats through the user turns with the memory tools,
and at the end BFCL flushes the memory to `<scenario>_final.json`; the question entry then loads that
file. Here every conversation is a `MultiTurnSession` (same parser, executor, step limit and StepErrors as
the multi-turn categories) on BFCL's real backend class, with `initial_config` pointing at a temporary
result folder owned by the episode, so episodes never share memory and nothing is left behind.

Each conversation opens with BFCL's own memory system prompt (`add_memory_instruction_system_prompt`:
the scenario's agent setting and the core-memory dump of the loaded snapshot), as BFCL's inference loop
builds it. The switch to the next conversation is announced in the observation. A user who has a
`bfcl generate` result folder can skip the prerequisites: `result_dir=<result>/<model_name>` makes the
question load that run's snapshot (read only).
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from environments.bfcl._bfcl import bfcl
from environments.bfcl.calls import Call
from environments.bfcl.multi_turn import DEFAULT_CHECKER_TIMEOUT_S, DEFAULT_STEP_TIMEOUT_S, MultiTurnSession


def conversation_switch_message(finished: int, total: int) -> str:
    return (f"[Conversation {finished} of {total} is over. Only what you stored with the memory functions is "
            f"kept; a new conversation begins.]")


class MemoryEpisode:
    """The session interface `BfclEnv` drives, over the episode's chain of conversations."""

    def __init__(self, question: dict, ground_truth: Any, category: str, prereqs: tuple[dict, ...],
                 result_dir: str | Path | None = None, *, step_timeout_s: float = DEFAULT_STEP_TIMEOUT_S,
                 checker_timeout_s: float = DEFAULT_CHECKER_TIMEOUT_S):
        self.category = category
        self.timeouts = {"step_timeout_s": step_timeout_s, "checker_timeout_s": checker_timeout_s}
        self._tmp = None
        if result_dir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="agentgym_opd_bfcl_memory_")
            self.result_dir = Path(self._tmp.name)
            self.plan = list(prereqs) + [question]
        else:
            self.result_dir = Path(result_dir)
            if not self.result_dir.is_dir():
                raise FileNotFoundError(f"memory_result_dir {self.result_dir} is not a folder (BFCL's result/<model_name>)")
            self.plan = [question]
        self.ground_truth = ground_truth
        self.index = 0  # the backend modules (the vector one loads a sentence encoder) load in the worker
        self._notice = ""
        self.session = self._open(0)

    # ------------------------------------------------------------------ conversations
    @property
    def on_question(self) -> bool:
        return self.index == len(self.plan) - 1

    def _open(self, index: int) -> MultiTurnSession:
        entry = dict(self.plan[index])
        b = bfcl()
        entry["initial_config"] = {
            entry["involved_classes"][0]: {
                "model_result_dir": self.result_dir,
                "scenario": entry["scenario"],
                "test_id": entry["id"],
                "test_category": b.utils.extract_test_category_from_id(entry["id"]),
            }
        }
        last = index == len(self.plan) - 1
        session = MultiTurnSession(entry, self.ground_truth if last else None, self.category,
                                   kind="agentic" if last else "memory_prereq", **self.timeouts)
        session.entry["question"] = session.backends.memory_prompt(session.entry["question"], self.category,
                                                                   entry["scenario"])
        return session

    def _advance(self) -> str:
        """Open the next conversation; return its announcement and first user message."""
        self.session.close()
        self.index += 1
        self.session = self._open(self.index)
        return f"{conversation_switch_message(self.index, len(self.plan))}\n{self.session.user_message()}"

    # ------------------------------------------------------------------ the session interface
    @property
    def functions(self) -> list[dict]:
        return self.session.functions

    @property
    def finished(self) -> bool:
        return self.on_question and self.session.finished

    @property
    def finish_bound(self):
        return self.session.finish_bound

    @property
    def final_text(self) -> str:
        return self.session.final_text

    def function_names(self) -> set[str]:
        return self.session.function_names()

    def user_message(self) -> str:
        return self.session.user_message()

    def end_turn(self, text: str) -> str | None:
        message = self.session.end_turn(text)
        if message is not None or self.on_question:
            return message
        return self._advance()

    def unknown_calls(self, calls: list[Call]) -> list[str]:
        return self.session.unknown_calls(calls)

    def validate(self, calls: list[Call]) -> list:
        return self.session.validate(calls)

    def execute(self, calls: list) -> list[tuple[str, str]]:
        try:
            return self.session.execute(calls)  # may raise BoundExceeded, after its bookkeeping
        finally:
            if self.session.finished and not self.on_question:  # BFCL's step limit ended a prerequisite
                self._notice = "Step limit reached: " + self._advance()

    def pop_notice(self) -> str:
        notice, self._notice = self._notice, ""
        return notice

    def failures(self, pairs: list[tuple[str, str]]) -> list[str]:
        return self.session.failures(pairs)

    def failed(self, result: str) -> bool:
        return self.session.failed(result)

    def held_out_docs(self) -> list[dict]:
        return self.session.held_out_docs()

    def finish(self) -> dict:
        verdict = self.session.finish()
        self.close()
        return verdict

    def close(self) -> None:
        self.session.close()
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None
