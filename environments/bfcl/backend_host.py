"""BFCL's backends run in a bounded worker process, and the handle an episode holds on them.

WHY a worker process: BFCL's backend classes compute with agent values in plain Python and C. A call
`power(base=10, exponent=100000000)` builds a 41 MB integer in one C loop that no signal interrupts;
`square_root(..., precision=10**9)` asks `decimal` for a billion digits. In the trainer's process either
one stops training. So every backend call, and BFCL's multi-turn checker (which replays the episode's
calls on fresh instances), runs in one `agentgym_opd.bounded.BoundedWorker` per trainer process, shared by
all BFCL envs in it: each request has a deadline (the env's `step_timeout_s` for one message's calls,
`checker_timeout_s` for the checker and for restoring state), the worker's address space is limited to a
headroom above the code it loaded (`BFCL_BACKEND_MEMORY_HEADROOM_MB`, default 1024), and each backend
method runs inside `local_numeric_context`, so its `decimal` / `mpmath` precision changes are undone.
The trainer's process never imports BFCL's memory backends' sentence encoder either (~600 MB).

State across a bound: when a request hits a bound the worker is killed and its backends' state is lost.
The message whose calls hit it had no effect (none of its calls is recorded), and a `HostedSession`
rebuilds its instances in the next worker by replaying the calls that ran before that message, in order,
on fresh instances made from the task's initial config. Replay reproduces the state because BFCL's
backends are deterministic functions of their calls (their randomness is seeded by the scenario), which
BFCL's own checker relies on in the same way. For memory episodes, earlier conversations live on disk
(the snapshot files BFCL's backend writes when a conversation ends), so only the open conversation is
replayed.

Cost (2026-12-04, 2-core build machine at load ~15, 204 steps of 30 multi_turn_base walkthroughs, two
runs each): the median step took 0.29-0.49 ms against 0.10-0.11 ms in-process before, i.e. +0.2-0.4 ms
for the pipe round trip; plus one worker start (~1 s) per trainer process, or after a bound was hit.
"""

from __future__ import annotations

import atexit
import copy
import json
import os
import threading
import uuid
import weakref
from pathlib import Path
from typing import Any

from agentgym_opd.bounded import BoundExceeded, BoundedWorker, RemoteError, local_numeric_context, loading_code

MAX_RESULT_CHARS = 65536  # a call's result as shown to the agent (the observation space's own size)
MAX_VERDICT_CHARS = 200_000  # the checker's verdict details are cut beyond this (the model sees 1,500)
HEADROOM_ENV = "BFCL_BACKEND_MEMORY_HEADROOM_MB"
LOAD_TIMEOUT_S = 1800.0  # importing backend modules, loading the memory_vector encoder: not agent work


class BackendHost:
    """The service inside the worker: the backend instances of every open session, by session name."""

    def __init__(self):
        from environments.bfcl._bfcl import bfcl

        with loading_code():
            self._bfcl = bfcl()
        self._sessions: dict[str, dict[str, Any]] = {}

    # -- sessions
    def load(self, class_names: list[str]) -> None:
        """Import the backend classes' modules (the memory_vector one loads a sentence encoder: up to minutes
        on a loaded machine), outside the memory bound; no agent value is involved."""
        from environments.bfcl._bfcl import prepare_memory_backend

        with loading_code():
            for class_name in class_names:
                prepare_memory_backend(class_name)

    def open(self, name: str, entry: dict, long_context: bool, steps: list[list[tuple[str, dict]]]) -> None:
        """Make the session's instances with BFCL's own code from the task's initial config, then replay the
        steps that ran before (a restore after the worker was replaced); replayed results are discarded."""
        from environments.bfcl.executor import method_table

        entry = _with_paths(entry)
        self.load(entry["involved_classes"])  # already loaded: a dictionary lookup per class
        _, instances = self._bfcl.execute_multi_turn_func_call(
            [], entry.get("initial_config", {}), entry["involved_classes"], name, entry["id"],
            long_context=long_context, is_evaL_run=False)
        self._sessions[name] = {"instances": instances, "methods": method_table(instances)}
        for step in steps:
            self.execute(name, step)

    def execute(self, name: str, calls: list[tuple[str, dict]]) -> list[tuple[bool, str]]:
        """Run one message's validated calls, in order; (whether each ran, its result text) per call."""
        from environments.bfcl.executor import ValidCall, execute

        methods = self._sessions[name]["methods"]
        out = []
        for call_name, kwargs in calls:
            ran, text = execute(ValidCall(call_name, kwargs), methods)
            if len(text) > MAX_RESULT_CHARS:
                text = text[:MAX_RESULT_CHARS] + f" ... [{len(text) - MAX_RESULT_CHARS} more characters]"
            out.append((ran, text))
        return out

    def flush_memory(self, name: str) -> None:
        """End a memory prerequisite conversation as BFCL does: write its memory to the snapshot folder."""
        for instance in self._sessions[name]["instances"].values():
            instance._flush_memory_to_local_file()

    def memory_prompt(self, name: str, question: list, category: str, scenario: str) -> list:
        """BFCL's memory system prompt (agent setting + core-memory dump) added to the conversation."""
        from bfcl_eval.model_handler.utils import add_memory_instruction_system_prompt

        (instance,) = self._sessions[name]["instances"].values()
        return add_memory_instruction_system_prompt(copy.deepcopy(question), category, scenario, instance)

    def check(self, record: list, ground_truth: list, entry: dict, category: str, checker_name: str) -> dict:
        """BFCL's multi-turn checker (it evals the record on fresh instances; the record holds only literal
        calls that ran: `executor.ValidCall.source`); a crash of the checker is an invalid verdict."""
        from environments.bfcl._bfcl import forget_instances

        try:
            with local_numeric_context():
                verdict = self._bfcl.multi_turn_checker(record, ground_truth, entry, category, checker_name)
        except Exception as exc:  # BFCL's checker asserts on mismatched instance sets; report, do not crash
            verdict = {"valid": False, "error_message": f"BFCL's multi-turn checker failed: {type(exc).__name__}: {exc}",
                       "error_type": "multi_turn:checker_error"}
        finally:
            forget_instances(checker_name)
        return _plain_verdict(verdict)

    def close(self, names: list[str]) -> None:
        from environments.bfcl._bfcl import forget_instances

        for name in names:
            self._sessions.pop(name, None)
            forget_instances(name)

    def live_instance_names(self) -> list[str]:
        """The backend instances BFCL's executor holds in this worker (for tests: nothing leaks)."""
        return sorted(k for k in vars(self._bfcl.multi_turn_utils) if k.startswith("agentgymopd"))


def _with_paths(entry: dict) -> dict:
    """The memory backends' `model_result_dir` travels as text (only plain data crosses the pipe)."""
    config = entry.get("initial_config") or {}
    if not any(isinstance(c, dict) and "model_result_dir" in c for c in config.values()):
        return entry
    entry = dict(entry, initial_config={k: dict(c) for k, c in config.items()})
    for c in entry["initial_config"].values():
        if "model_result_dir" in c:
            c["model_result_dir"] = Path(c["model_result_dir"])
    return entry


def _plain_verdict(verdict: dict) -> dict:
    """The verdict as plain data: BFCL puts backend objects (a `Directory`, ...) in its details, written
    here as their `repr`; a value whose JSON form passes `MAX_VERDICT_CHARS` is kept as that text, cut."""
    return {str(key): _plain_value(value) for key, value in verdict.items()}


def _plain_value(value: Any) -> Any:
    try:
        text = json.dumps(value, default=repr)
    except (ValueError, TypeError, RecursionError) as exc:  # a state too odd (or too deep) to write out
        return f"<not printable: {type(exc).__name__}: {str(exc)[:300]}>"
    if len(text) > MAX_VERDICT_CHARS:
        return text[:MAX_VERDICT_CHARS] + " ... [cut]"
    return json.loads(text)


# ----------------------------------------------------------------------------- the trainer's side

_worker: BoundedWorker | None = None
_worker_lock = threading.Lock()
_closed_names: list[str] = []  # sessions collected by the GC, forgotten in the worker at the next request


def backend_worker() -> BoundedWorker:
    """This process's worker for BFCL's backends (started on first use)."""
    global _worker
    with _worker_lock:
        if _worker is None:
            headroom = int(os.environ.get(HEADROOM_ENV, "1024"))
            _worker = BoundedWorker("environments.bfcl.backend_host:BackendHost", memory_headroom_mb=headroom,
                                    start_timeout_s=LOAD_TIMEOUT_S, name="BFCL backend worker")
            atexit.register(_worker.close)
        return _worker


def _forget_later(name: str) -> None:
    _closed_names.append(name)  # no I/O here: a finalizer may run in the middle of another request


def live_instance_names() -> list[str]:
    worker = backend_worker()
    with worker.lock:
        _flush_closed(worker, 30.0)
        return worker.call("live_instance_names", timeout_s=30.0)


def _flush_closed(worker: BoundedWorker, timeout_s: float) -> None:
    if _closed_names and worker.alive:
        names = list(_closed_names)
        del _closed_names[:len(names)]
        worker.call("close", names, timeout_s=timeout_s)


class BackendUnavailable(RuntimeError):
    """The session's backends could not be rebuilt in a fresh worker (the replay itself hit a bound)."""


class HostedSession:
    """One episode's (or memory conversation's) backend instances in the worker, and what rebuilds them.

    `steps` are the validated calls of each message that ran, in order (what a restore replays)."""

    def __init__(self, entry: dict, long_context: bool, *, step_timeout_s: float, checker_timeout_s: float):
        self.entry = entry
        self.long_context = long_context
        self.step_timeout_s = step_timeout_s
        self.checker_timeout_s = checker_timeout_s
        self.name = f"agentgymopd{uuid.uuid4().hex}"
        self.steps: list[list[tuple[str, dict]]] = []
        self._generation: int | None = None
        self._closed = False
        self._finalizer = weakref.finalize(self, _forget_later, self.name)
        self._worker = backend_worker()
        with self._worker.lock:
            self._ensure()

    def _plain_entry(self) -> dict:
        config = self.entry.get("initial_config") or {}
        entry = {k: self.entry[k] for k in ("id", "involved_classes") if k in self.entry}
        entry["initial_config"] = {k: ({**c, "model_result_dir": str(c["model_result_dir"])}
                                       if isinstance(c, dict) and "model_result_dir" in c else c)
                                   for k, c in config.items()}
        return entry

    def _ensure(self) -> None:
        """Make (or, after the worker was replaced, rebuild) this session's instances in the worker."""
        worker = self._worker
        generation = worker.ensure_started()
        _flush_closed(worker, self.checker_timeout_s)
        if generation == self._generation:
            return
        try:
            worker.call("load", list(self.entry["involved_classes"]), timeout_s=LOAD_TIMEOUT_S)
            worker.call("open", self.name, self._plain_entry(), self.long_context, self.steps,
                        timeout_s=self.checker_timeout_s)
        except BoundExceeded as exc:
            what = "rebuilt after a limit was hit" if self._generation is not None else "made"
            raise BackendUnavailable(f"the backends could not be {what} ({exc.message})") from None
        self._generation = worker.generation

    def _call(self, method: str, *args: Any, timeout_s: float) -> Any:
        with self._worker.lock:
            self._ensure()
            return self._worker.call(method, self.name, *args, timeout_s=timeout_s)

    def execute(self, calls: list[tuple[str, dict]]) -> list[tuple[bool, str]]:
        """Run one message's calls under the step deadline; the ones that ran join `steps`. Raises
        `BoundExceeded` when the message hits a bound: then none of its calls is kept (the worker is gone,
        and the next request rebuilds the state as it was before this message)."""
        results = self._call("execute", calls, timeout_s=self.step_timeout_s)
        ran = [call for call, (did_run, _) in zip(calls, results) if did_run]
        if ran:
            self.steps.append(ran)
        return results

    def flush_memory(self) -> None:
        self._call_or_unavailable("flush_memory")

    def memory_prompt(self, question: list, category: str, scenario: str) -> list:
        return self._call_or_unavailable("memory_prompt", question, category, scenario)

    def _call_or_unavailable(self, method: str, *args: Any) -> Any:
        """A request made on the env's behalf, not the agent's: a bound there means the backends are lost."""
        try:
            return self._call(method, *args, timeout_s=self.checker_timeout_s)
        except BoundExceeded as exc:
            raise BackendUnavailable(f"{method} hit a limit ({exc.message})") from None

    def check(self, record: list, ground_truth: list, category: str) -> dict:
        """BFCL's multi-turn checker in the worker, under `checker_timeout_s` (raises `BoundExceeded`)."""
        with self._worker.lock:
            self._worker.ensure_started()
            return self._worker.call("check", record, ground_truth, self._plain_entry(), category,
                                     self.name + "check", timeout_s=self.checker_timeout_s)

    def close(self) -> None:
        """Free the instances in the worker now (a session the GC collects is freed at the next request)."""
        if self._closed:
            return
        self._closed = True
        self._finalizer.detach()
        worker = self._worker
        with worker.lock:
            if worker.alive and self._generation == worker.generation:
                try:
                    worker.call("close", [self.name], timeout_s=self.checker_timeout_s)
                except (BoundExceeded, RemoteError):
                    pass  # a worker that cannot free them is replaced, and its instances with it
