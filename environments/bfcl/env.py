"""`BfclEnv`: every BFCL v4 category behind the TextEnv contract, scored by BFCL's own checkers.

* Single-turn categories (`simple_python`, `multiple`, `parallel`, `parallel_multiple`, the `live_*` ones,
  `simple_java`/`simple_javascript`, the relevance ones): the first observation is BFCL's instruction, the
  function docs (JSON) and the user question; the agent answers with its calls (see `calls.py` for the
  accepted formats; Java/JavaScript answers go through BFCL's own tree-sitter decoder). BFCL's AST checker
  judges them against the possible answers; the episode ends with reward 1.0 when it says valid. A message
  that cannot be parsed is a `parse_error` and, where `max_turns` allows (default 1, BFCL's single shot),
  the agent may answer again; the last allowed answer ends the episode (terminated, score 0 if unparsable). Calls that are not callable as documented also carry a `tool_error`.
* Relevance categories follow BFCL's rule: a reply counts as a call when it decodes to at least one
  call; anything else, undecodable output like `[None]` or `Sorry (none apply).` included, is an
  abstention (right on `irrelevance`/`live_irrelevance`, wrong on `live_relevance`), never a parse error.
  BFCL ships no answer for `live_relevance`; its walkthrough is a demonstration call (`data.py`).
* Multi-turn and agentic categories: see `multi_turn.py` for the turn mapping. An agentic final answer
  in BFCL's required format (`{'answer': ..., 'context': ...}`, a dict literal or JSON) is the final text,
  not a malformed call.
* Memory categories (`memory_kv`, `memory_vector`, `memory_rec_sum`): one episode plays the scenario's
  prerequisite conversations and then the question, on BFCL's real memory backend with a per-episode
  snapshot folder (`memory.py`; the choice is documented in `data.py`). `memory_result_dir=` starts the
  question from a `bfcl generate` run's snapshot instead. Default `max_turns`: three steps per user turn
  of the longest episode of the category (BFCL itself allows up to 20 steps per user turn).
* Bounds (multi-turn, agentic, memory): the backends run in a bounded worker process (`backend_host.py`).
  One message's calls get `step_timeout_s` (default 10 s) and a memory limit; a message that exceeds
  either is a `timeout` (time) or `tool_error` (memory) step, none of its calls takes effect, and the
  episode goes on. BFCL's checker gets `checker_timeout_s` (default 60 s); past it the episode ends
  unsolved with a `timeout` error. If the backends cannot be rebuilt after a bound (their replay hits a
  bound too), the episode ends with an `env_crash`. Single-turn categories run no backend: their parser
  and BFCL's AST checker work on bounded plain data in this process.

Ids are `bfcl/<category>`; the split is the category; task ids are BFCL's entry ids.
"""

from __future__ import annotations

import json
from typing import Any

from agentgym_opd.bounded import BoundExceeded
from agentgym_opd.core import StepOutcome, TextEnv, UnknownTaskError
from agentgym_opd.types import StepError, Task
from environments.bfcl._bfcl import CHECKER_MODEL_NAME, ast_parse_foreign, bfcl
from environments.bfcl.calls import Call, is_answer_object, looks_like_calls, parse_calls, Parsed
from environments.bfcl.executor import InvalidCall
from environments.bfcl.data import (
    backend_parameters,
    category_kind,
    checker_docs,
    language_of,
    load_category,
    MEMORY_CATEGORIES,
    relevance_walkthrough,
    memory_prereqs,
    memory_walkthrough,
    render_gold,
    render_turn_calls,
    UNSUPPORTED_CATEGORIES,
)
from environments.bfcl.backend_host import BackendUnavailable
from environments.bfcl.memory import MemoryEpisode
from environments.bfcl.multi_turn import DEFAULT_CHECKER_TIMEOUT_S, DEFAULT_STEP_TIMEOUT_S, MultiTurnSession
from environments.bfcl.schema import check_calls

FORMAT_HINT = (
    "Answer with the function calls only, in Python syntax `[func_name1(param1=value1, param2=value2), "
    'func_name2(param=value)]` or as JSON `[{"name": "func_name1", "arguments": {"param1": value1}}]`. '
    "If none of the functions can be used, or the request lacks required parameters, say so in plain text."
)
MULTI_TURN_HINT = (
    "Each of your messages with calls is executed and the results are shown to you. Keep calling functions "
    "until the user's request is fulfilled; then reply in plain text without calls: that ends your turn and "
    "the next user request, if any, is shown."
)
END_OF_TURN_MESSAGE = "Done."
DEFAULT_MAX_TURNS = {"ast": 1, "relevance": 1, "multi_turn": 120, "agentic": 40}
MEMORY_STEPS_PER_USER_TURN = 3


def _memory_max_turns(category: str) -> int:
    """Enough steps for the longest episode: its prerequisite and question user turns, three steps each."""
    entries, _ = load_category(category)
    prereqs = memory_prereqs(category)
    longest = max(sum(len(c["question"]) for c in prereqs.get(e["scenario"], ())) + len(e["question"]) for e in entries)
    return MEMORY_STEPS_PER_USER_TURN * longest


def bound_error(exc: BoundExceeded | BackendUnavailable, *, step_timeout_s: float, what: str = "These calls") -> StepError:
    """The step's error when a message's calls (or the checker) hit a bound in the backend worker."""
    if isinstance(exc, BackendUnavailable):
        return StepError("env_crash", f"The function backends could not be restored: {exc}. The episode ends.")
    undone = "none of them took effect (the backends are as they were before this message)"
    if exc.kind == "timeout":
        return StepError("timeout", f"{what} ran longer than the limit of {step_timeout_s:g} s for one message "
                                    f"(for example a huge power, precision or size); {undone}. Use smaller values.")
    if exc.kind == "memory":
        return StepError("tool_error", f"{what} needed more memory than the function backends may use; {undone}. "
                                       "Use smaller values.")
    return StepError("env_crash", f"The function backends crashed while running {what.lower()}; {undone}; they "
                                  "were restarted.")


def _multi_turn_feedback(verdict: dict, limit: int = 1500) -> str:
    """BFCL's verdict as text: its message plus what differed (state attributes or missing results)."""
    message = str(verdict.get("error_message") or verdict.get("error") or verdict.get("error_type"))
    details = verdict.get("details") or {}
    if details.get("differences"):
        message += f" Differences (model vs ground truth): {details['differences']}"
    elif details.get("missing_items"):
        message += f" Missing results: {details['missing_items']}"
    return message if len(message) <= limit else message[: limit - 5] + " ..."


class BfclEnv(TextEnv):
    """BFCL v4 function calling (single-turn AST, relevance, multi-turn execution, agentic)."""

    description = "BFCL function calling, scored by BFCL's own checkers"

    def __init__(self, category: str = "simple_python", split: str | None = None, *, max_turns: int | None = None,
                 max_action_chars: int = 8192, memory_result_dir: str | None = None,
                 step_timeout_s: float = DEFAULT_STEP_TIMEOUT_S, checker_timeout_s: float = DEFAULT_CHECKER_TIMEOUT_S,
                 **kwargs: Any):
        for name, value in (("step_timeout_s", step_timeout_s), ("checker_timeout_s", checker_timeout_s)):
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0:
                raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")
        self.timeouts = {"step_timeout_s": float(step_timeout_s), "checker_timeout_s": float(checker_timeout_s)}
        if category in UNSUPPORTED_CATEGORIES:
            raise NotImplementedError(f"bfcl/{category}: {UNSUPPORTED_CATEGORIES[category]}")
        self.category = category
        self.kind = category_kind(category)
        self.language = language_of(category)
        if split is not None and split != category:
            raise ValueError(f"BFCL's split is its category: got split={split!r} for category {category!r}")
        kwargs.setdefault("env_id", f"bfcl/{category}")
        if memory_result_dir is not None and category not in MEMORY_CATEGORIES:
            raise ValueError(f"memory_result_dir is for the memory categories, not {category!r}")
        self.memory_result_dir = memory_result_dir
        if max_turns is None:
            max_turns = _memory_max_turns(category) if category in MEMORY_CATEGORIES else DEFAULT_MAX_TURNS[self.kind]
        super().__init__(category, max_turns=max_turns,
                         max_action_chars=max_action_chars, **kwargs)
        entries, self._answers = load_category(category)
        self._entries = {e["id"]: e for e in entries}
        self._ids = [e["id"] for e in entries]
        self._session: MultiTurnSession | MemoryEpisode | None = None
        self._success = False
        self._score = 0.0
        self._verdict: dict | None = None

    # ------------------------------------------------------------------ tasks
    def task_ids(self) -> list[str]:
        return list(self._ids)

    def get_task(self, task_id: str) -> Task:
        if task_id not in self._entries:
            raise UnknownTaskError(task_id, self._ids)
        entry = self._entries[task_id]
        answer = self._answers.get(task_id)
        privileged: dict[str, Any] = {}
        if self.kind == "ast":
            docs = checker_docs(self.category)[task_id] if self.language == "java" else None
            privileged["solution"] = render_gold(answer, self.language, docs)
            privileged["walkthrough"] = [privileged["solution"]]
        elif self.kind == "relevance" and "irrelevance" in self.category:
            privileged["walkthrough"] = ["None of the provided functions can be used for this request."]
        elif self.kind == "relevance":  # live_relevance: any call scores (BFCL's rule); see relevance_walkthrough
            privileged["walkthrough"] = [relevance_walkthrough(entry)]
        elif self.kind == "multi_turn":
            parameters = backend_parameters(tuple(entry["involved_classes"]))
            privileged["solution"] = "\n".join(render_turn_calls(turn, parameters) for turn in answer)
            walkthrough = []
            for turn in answer:
                walkthrough += [render_turn_calls(turn, parameters), END_OF_TURN_MESSAGE] if turn else [
                    "I cannot complete this request with the information and functions I have."]
            privileged["walkthrough"] = walkthrough
        elif self.kind == "agentic":
            privileged["answer"] = answer
            if self.category in MEMORY_CATEGORIES:  # an oracle demonstration, not BFCL data (see data.py)
                walkthrough = memory_walkthrough(self.category, entry, answer, self._prereqs(entry))
                privileged["walkthrough"] = walkthrough
                privileged["solution"] = "\n".join(a for a in walkthrough if a.startswith("["))
        first_turn = entry["question"][0] if entry["question"] else []
        instruction = "\n".join(m["content"] for m in first_turn if m.get("role") == "user")
        metadata = {
            "category": self.category,
            "kind": self.kind,
            "num_user_turns": len(entry["question"]),
            "functions": [f["name"] for f in entry.get("function", [])],
        }
        if "involved_classes" in entry:
            metadata["involved_classes"] = list(entry["involved_classes"])
        if self.category in MEMORY_CATEGORIES:
            prereqs = self._prereqs(entry)
            metadata.update(scenario=entry["scenario"], prerequisites=[c["id"] for c in prereqs],
                            num_prerequisite_user_turns=sum(len(c["question"]) for c in prereqs))
        return Task(task_id, self.env_id, self.split, instruction, privileged, metadata)

    def _prereqs(self, entry: dict) -> tuple[dict, ...]:
        """The prerequisite conversations an episode plays (none when starting from a BFCL result folder)."""
        return () if self.memory_result_dir else memory_prereqs(self.category).get(entry["scenario"], ())

    # ------------------------------------------------------------------ episode
    def _start(self, task: Task) -> str:
        self.close_session()
        self._success, self._score, self._verdict = False, 0.0, None
        entry = self._entries[task.id]
        if self.category in MEMORY_CATEGORIES:
            self._session = MemoryEpisode(entry, self._answers.get(task.id), self.category, self._prereqs(entry),
                                          result_dir=self.memory_result_dir, **self.timeouts)
        elif self.kind in ("multi_turn", "agentic"):
            self._session = MultiTurnSession(entry, self._answers.get(task.id), self.category, kind=self.kind,
                                             **self.timeouts)
        if self._session is not None:
            docs = json.dumps(self._session.functions, indent=2)
            return (f"{FORMAT_HINT}\n{MULTI_TURN_HINT}\n\nAvailable functions (JSON):\n{docs}\n\n"
                    f"{self._session.user_message()}")
        docs = json.dumps(entry["function"], indent=2)
        hint = FORMAT_HINT if self.language == "python" else FORMAT_HINT.split(" or as JSON")[0] + (
            f". Write argument values in {self.language.capitalize()} syntax.")
        conversation = "\n".join(f"{m['role']}: {m['content']}" for turn in entry["question"] for m in turn)
        return f"{hint}\n\nAvailable functions (JSON):\n{docs}\n\n{conversation}"

    def _act(self, action: str) -> StepOutcome:
        if self._session is not None:
            return self._act_multi_turn(action)
        return self._act_single_turn(action)

    def progress(self) -> tuple[bool, float]:
        return self._success, self._score

    def close_session(self) -> None:
        if self._session is not None:
            self._session.close()
            self._session = None

    def close(self) -> None:
        self.close_session()
        super().close()

    # ------------------------------------------------------------------ single turn
    def _decode(self, action: str) -> tuple[list[dict] | None, list[Call] | None, str | None, str | None]:
        """(BFCL decoded calls, parsed calls, plain text, parse error message)."""
        if self.language != "python":
            if not looks_like_calls(action):
                return None, None, action, None
            try:
                decoded = ast_parse_foreign(action, self.language)
            except Exception as exc:  # BFCL's tree-sitter decoder raises bare Exceptions
                return None, None, None, f"Could not parse the {self.language} function calls: {exc}"
            return decoded, None, None, None
        parsed = parse_calls(action)
        if parsed.error:
            return None, None, None, parsed.error
        if parsed.text is not None:
            return None, None, parsed.text, None
        return [c.to_bfcl() for c in parsed.calls], parsed.calls, None, None

    def _finish(self, valid: bool, feedback: str, error: StepError | None = None, observation: str | None = None) -> StepOutcome:
        self._success, self._score = valid, float(valid)
        verdict = "Correct." if valid else f"Incorrect. {feedback}"
        return StepOutcome(observation or verdict, reward=float(valid), terminated=True, error=error,
                           feedback=feedback if not valid else "BFCL's checker: valid.")

    def _act_single_turn(self, action: str) -> StepOutcome:
        entry = self._entries[self.task.id]
        decoded, calls, text, parse_error = self._decode(action)
        last_try = self.turn >= self.max_turns  # the final allowed answer ends the task: terminated, not a time-out
        if parse_error and self.kind == "relevance":
            # BFCL's relevance rule: output its decoder cannot read as calls (`[None]`, `Sorry (none apply).`)
            # is no call, i.e. an abstention, not a malformed answer
            decoded, parse_error = None, None
        if parse_error:
            return StepOutcome(parse_error + " " + FORMAT_HINT, error=StepError("parse_error", parse_error),
                               terminated=last_try, feedback=f"No valid answer: {parse_error}" if last_try else "")
        made_calls = bool(decoded) and not (len(decoded) == 1 and not decoded[0])
        if self.kind == "relevance":
            if "irrelevance" in self.category:
                feedback = "" if not made_calls else "Valid syntax. Successfully decode AST when it should not."
                return self._finish(not made_calls, feedback)
            feedback = "" if made_calls else "Failed to decode AST when it should have: no function call was made."
            return self._finish(made_calls, feedback)
        if not made_calls:
            message = "No function call found in the answer. " + FORMAT_HINT
            return StepOutcome(message, error=StepError("parse_error", message), terminated=last_try,
                               feedback="No valid answer: no function call found." if last_try else "")
        error = None
        if calls is not None:
            problems = check_calls(calls, entry["function"])
            if problems:
                error = StepError("tool_error", " ".join(problems))
        b = bfcl()
        language = {"python": b.Language.PYTHON, "java": b.Language.JAVA, "javascript": b.Language.JAVASCRIPT}[self.language]
        try:
            result = b.ast_checker(checker_docs(self.category)[self.task.id], decoded, self._answers[self.task.id], language, self.category,
                                   CHECKER_MODEL_NAME)
        except Exception as exc:  # the checker indexes into odd shapes; a crash there is a wrong answer
            result = {"valid": False, "error": [f"BFCL's AST checker could not evaluate the calls: {type(exc).__name__}: {exc}"]}
        self._verdict = result
        errors = result.get("error") or []
        feedback = " ".join(map(str, errors)) if isinstance(errors, list) else str(errors)
        if result.get("valid"):
            return self._finish(True, "", error)
        observation = f"Incorrect. {feedback}" + (f"\n{error.message}" if error else "")
        return self._finish(False, feedback, error, observation)

    # ------------------------------------------------------------------ multi turn
    def _act_multi_turn(self, action: str) -> StepOutcome:
        session = self._session
        parsed = parse_calls(action)
        if self.kind == "agentic" and parsed.error and is_answer_object(action):
            parsed = Parsed(text=action.strip())  # BFCL's final-answer format
        if parsed.error:
            return StepOutcome(parsed.error + " " + FORMAT_HINT, error=StepError("parse_error", parsed.error))
        if parsed.text is not None or not parsed.calls:
            try:
                next_message = session.end_turn(parsed.text or "")
            except BackendUnavailable as exc:
                return self._backends_lost(exc)
            if next_message is not None:
                return StepOutcome(next_message)
            return self._multi_turn_outcome()
        unknown = session.unknown_calls(parsed.calls)
        if unknown:
            message = (f"Unknown function(s) {', '.join(map(repr, unknown))}; nothing was executed. The available "
                       f"functions are: {', '.join(sorted(session.function_names()))}.")
            return StepOutcome(message, error=StepError("tool_error", message))
        try:
            valid_calls = session.validate(parsed.calls)
        except InvalidCall as exc:
            message = f"{exc} Nothing was executed."
            return StepOutcome(message, error=StepError("tool_error", message))
        try:
            pairs = session.execute(valid_calls)
        except BoundExceeded as exc:
            error = bound_error(exc, step_timeout_s=self.timeouts["step_timeout_s"])
            observation = error.message + self._take_notice(session)
            if session.finished:  # the step limit ended the episode with this step
                return self._multi_turn_outcome(observation, error)
            return StepOutcome(observation, error=error)
        except BackendUnavailable as exc:
            return self._backends_lost(exc)
        lines = [f"{source} -> {result}" for source, result in pairs]
        failures = session.failures(pairs)
        if failures:  # add what the docs say about a failed call, beside the backend's own message
            failures += check_calls([c for c, (_, result) in zip(parsed.calls, pairs) if session.failed(result)],
                                    session.functions + session.held_out_docs(), allow_positional=True)
        dropped = [c.name for c in valid_calls if c.dropped_positional]
        if dropped:  # BFCL's decoder keeps keyword arguments only; so does this env, and says so
            failures.append(f"Positional arguments were not passed to {', '.join(dropped)} (only name=value "
                            "arguments are: BFCL's decoder drops positional ones); write each argument as name=value.")
        error = StepError("tool_error", " | ".join(failures)) if failures else None
        observation = "Execution results:\n" + "\n".join(lines) + self._take_notice(session)
        if session.finished:  # BFCL's step limit
            return self._multi_turn_outcome(observation, error)
        return StepOutcome(observation, error=error)

    @staticmethod
    def _take_notice(session) -> str:
        notice = session.pop_notice()
        return "\n" + notice if notice else ""

    def _backends_lost(self, exc: BackendUnavailable) -> StepOutcome:
        """The backends could not be rebuilt after a bound: the episode ends, unsolved."""
        error = bound_error(exc, step_timeout_s=self.timeouts["step_timeout_s"])
        self._verdict = {"valid": False, "error_type": "backends_unavailable", "error_message": str(exc)}
        self.close_session()
        return self._finish(False, error.message, error, error.message)

    def _multi_turn_outcome(self, observation: str = "", error: StepError | None = None) -> StepOutcome:
        verdict = self._session.finish()
        if self._session.finish_bound is not None and error is None:
            if isinstance(self._session.finish_bound, BoundExceeded) and self._session.finish_bound.kind == "timeout":
                error = StepError("timeout", f"BFCL's checker replaying this episode's calls ran longer than "
                                             f"{self.timeouts['checker_timeout_s']:g} s; the episode is scored unsolved.")
            else:
                error = bound_error(self._session.finish_bound, step_timeout_s=self.timeouts["step_timeout_s"],
                                    what="BFCL's checker")
        self._verdict = verdict
        valid = bool(verdict.get("valid"))
        feedback = "" if valid else _multi_turn_feedback(verdict)
        closing = "The conversation is over. " + ("All user requests were fulfilled." if valid else f"Not solved: {feedback}")
        return self._finish(valid, feedback, error, (observation + "\n" if observation else "") + closing)

    @property
    def verdict(self) -> dict | None:
        """BFCL's checker result of the finished episode (its `error`/`details` fields), for analysis."""
        return self._verdict
