"""Calls into a py4j-backed simulator (ScienceWorld, TextWorldExpress) that survive a dead or frozen JVM.

Both simulators are Scala programs driven through py4j: a JVM child process and a socket. Left alone, a
JVM that died makes every later call fail (py4j retries once, then logs each failure with a chained
traceback through the root logger: hundreds of lines per call), and a JVM that stopped answering
(SIGSTOP, a livelock, a full heap in GC) blocks the socket read forever, which stops a whole rollout.

This module gives an env three things, and nothing simulator-specific:

- :func:`set_call_timeout`: a read timeout on every py4j socket of an engine, so a frozen JVM turns into
  an exception after ``seconds`` instead of a hang (a socket timeout costs nothing per call, unlike a
  watchdog thread, which matters for TextWorldExpress's thousands of steps per second);
- :func:`guarded`: runs one call and turns any failure of it into :class:`JVMFailure`, checking first that
  the process is still there (a call into a dead JVM is what floods the log) and silencing py4j's own
  records while the call runs, in this thread only;
- :func:`kill`: SIGKILL the JVM (a stopped process dies too) and close the gateway quietly, so the env
  can start a fresh one. The env logs one line per restart with :func:`log_restart`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from typing import Any, Callable, Iterator, TypeVar

logger = logging.getLogger("agentgym_opd.jvm")
_T = TypeVar("_T")
# py4j's own source files, matched by path so that importing this module needs no py4j (the envs that
# use it say how to install their simulator when it is missing)
_PY4J_PART = f"{os.sep}py4j{os.sep}"
_state = threading.local()


class JVMFailure(RuntimeError):
    """The simulator's JVM died, stopped answering, or failed a call; the env must restart it."""


class _SilencePy4J(logging.Filter):
    """Drops records emitted from py4j's own files while a guarded call runs in the current thread.

    py4j logs a dead connection with ``logging.exception`` on the *root* logger and on
    ``py4j.java_gateway``; the env reports the failure itself, in one line, so these are noise there.
    Outside guarded calls (another library using py4j) nothing is filtered."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (getattr(_state, "quiet", False) and _PY4J_PART in record.pathname)


_FILTER = _SilencePy4J()
for _name in ("", "py4j", "py4j.java_gateway", "py4j.clientserver"):
    logging.getLogger(_name).addFilter(_FILTER)


@contextlib.contextmanager
def quiet_py4j() -> Iterator[None]:
    """Silence py4j's log records in this thread for the duration (re-entrant)."""
    previous = getattr(_state, "quiet", False)
    _state.quiet = True
    try:
        yield
    finally:
        _state.quiet = previous


def java_process(engine: Any) -> Any:
    """The ``subprocess.Popen`` of an engine's JVM (both simulators keep it on their gateway), or None."""
    return getattr(getattr(engine, "_gateway", None), "java_process", None)


def alive(engine: Any) -> bool:
    """Whether the JVM process has not exited (a stopped JVM is alive: only a timeout reveals it)."""
    proc = java_process(engine)
    return proc is not None and proc.poll() is None


def set_call_timeout(engine: Any, seconds: float | None) -> None:
    """Every py4j call of ``engine`` raises after ``seconds`` without an answer (None: wait forever).

    py4j reads the timeout from the gateway parameters when it opens a connection, so it is set there for
    future connections and on the sockets of the pooled ones."""
    client = getattr(getattr(engine, "_gateway", None), "_gateway_client", None)
    if client is None:
        return
    client.gateway_parameters.read_timeout = seconds
    for connection in list(client.deque):
        with contextlib.suppress(OSError, AttributeError):
            connection.socket.settimeout(seconds)


@contextlib.contextmanager
def call_timeout(engine: Any, seconds: float | None, restore: float | None) -> Iterator[None]:
    """A different timeout for a few slow calls (loading a task with its gold path), then ``restore``."""
    set_call_timeout(engine, seconds)
    try:
        yield
    finally:
        set_call_timeout(engine, restore)


def guarded(engine: Any, call: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
    """``call(*args, **kwargs)`` with any failure (or a JVM that already exited) as :class:`JVMFailure`."""
    if not alive(engine):
        raise JVMFailure("the JVM process exited")
    previous = getattr(_state, "quiet", False)
    _state.quiet = True
    started = time.monotonic()
    try:
        return call(*args, **kwargs)
    except Exception as exc:  # py4j network errors, a socket timeout, a Java exception, a garbled answer
        # py4j replaces a socket timeout by its own error without a chain, so the clock tells a freeze apart
        limit = _read_timeout(engine)
        if not alive(engine):
            cause = f"the JVM process exited ({type(exc).__name__})"
        elif limit and time.monotonic() - started >= 0.9 * limit:
            cause = f"no answer within {limit:g} s"
        else:
            cause = f"{type(exc).__name__}: {_first_line(exc)}"
        raise JVMFailure(cause) from None
    finally:
        _state.quiet = previous


def _read_timeout(engine: Any) -> float | None:
    client = getattr(getattr(engine, "_gateway", None), "_gateway_client", None)
    return getattr(getattr(client, "gateway_parameters", None), "read_timeout", None)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:200] if text else ""


def kill(engine: Any) -> None:
    """SIGKILL the engine's JVM (stopped or not), reap it, and close the gateway without a word."""
    proc = java_process(engine)
    with quiet_py4j():
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(OSError):
                proc.kill()
            with contextlib.suppress(Exception):
                proc.wait(timeout=10)
        gateway = getattr(engine, "_gateway", None)
        client = getattr(gateway, "_gateway_client", None)
        if client is not None:
            with contextlib.suppress(Exception):
                client.close()
            # py4j's finalisers of Java object handles ask the JVM to free them later, from whatever code
            # runs the garbage collector, and log a traceback each when it is gone: a closed client skips them
            client.is_connected = False
        if gateway is not None:
            with contextlib.suppress(Exception):
                gateway.shutdown_callback_server()
        with contextlib.suppress(Exception):  # the simulator's own close (TextWorldExpress runs it from
            engine.close = _closed              # __del__) would talk to the dead JVM again
        for stream in (getattr(proc, "stdin", None), getattr(proc, "stdout", None), getattr(proc, "stderr", None)):
            with contextlib.suppress(Exception):
                if stream is not None:
                    stream.close()


def _closed() -> None:
    """What an engine's ``close`` becomes once :func:`kill` has closed it."""


def log_restart(env_id: str, where: str, cause: str, restarts: int) -> None:
    """The one line a JVM restart leaves in the log."""
    logger.warning("%s: JVM failed during %s (%s); restarted it (restart #%d)", env_id, where, cause, restarts)


class JVMSimulatorEnv:
    """The crash handling every ``TextEnv`` over a py4j simulator shares; mix in before ``TextEnv``.

    The env provides ``simulator`` (its name in messages), ``step_timeout_s``, ``load_timeout_s``,
    ``_new_engine()`` (a fresh engine with :func:`set_call_timeout` applied) and ``_replay()`` (reload the
    current task and replay ``self._history``: the simulators are deterministic), sets ``self.restarts = 0``
    and ``self.engine = self._new_engine()``, and runs its simulator calls through :meth:`_call` (outside a
    step) or :meth:`_step_call` (a step). In return: a failed call kills the JVM, starts a fresh one and logs
    one line; a failed step is an ``env_crash`` after which the episode goes on from the same state; a reset
    that needed a restart reports the ``env_crash`` in ``info["error"]``.
    """

    simulator = "The simulator"
    # the JVM child each instance starts (RSS measured on 2026-12-06: ScienceWorld 520-600 MB per JVM during a
    # 50-game eval), counted by `agentgym_opd.playing.rows_for_memory` when it sizes a batch of games
    process_memory_bytes = 600 * 2**20
    restarts: int
    engine: Any

    def _new_engine(self) -> Any:
        raise NotImplementedError

    def _replay(self) -> None:
        raise NotImplementedError

    def _on_fresh_engine(self) -> None:
        """Forget what the old engine held (e.g. which task it had loaded)."""

    def _call(self, where: str, call: Callable[[], _T], *, slow: bool = True) -> _T:
        """``call()`` against the engine; a JVM failure restarts it (one log line) and retries once.

        For calls outside a step (task lists, loading a task, replaying an episode): nothing to replay.
        ``slow`` calls get ``load_timeout_s`` (a fresh JVM loads classes and warms up), others
        ``step_timeout_s``. ``call`` must look the engine up when it runs (``self.engine``): a retry gets a
        new one."""
        for attempt in (0, 1):
            try:
                with call_timeout(self.engine, self.load_timeout_s if slow else self.step_timeout_s,
                                  self.step_timeout_s):
                    return guarded(self.engine, call)
            except JVMFailure as failure:
                self._fresh_engine(where, str(failure))
                if attempt:
                    raise RuntimeError(f"{self.env_id}: {self.simulator}'s JVM failed twice in a row during {where} "
                                       f"({failure}); is Java 17+ working?") from None
        raise AssertionError("unreachable")

    def _fresh_engine(self, where: str, cause: str) -> None:
        """Kill the old JVM (dead, frozen or failing), start a new one, log one line."""
        self.restarts += 1
        log_restart(self.env_id, where, cause, self.restarts)
        old, self.engine = self.engine, None
        kill(old)
        self.engine = self._new_engine()
        self._on_fresh_engine()

    def _start_call(self, call: Callable[[], _T]) -> _T:
        """The call that starts an episode; a restart it needed is reported by :meth:`reset`."""
        restarts = self.restarts
        result = self._call("reset", call)
        if self.restarts != restarts:
            self._reset_crash = f"{self.restarts - restarts} restart(s)"
        return result

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        """The base reset; a JVM that had to be restarted to start the episode is reported as ``env_crash``."""
        from agentgym_opd.types import StepError

        self._reset_crash = None
        obs, info = super().reset(seed=seed, options=options)  # type: ignore[misc]
        if self._reset_crash is not None:
            info["error"] = StepError("env_crash", f"{self.simulator}'s JVM failed ({self._reset_crash}) and was "
                                                   "restarted before this episode began.")
        return obs, info

    def _step_call(self, call: Callable[..., _T], *args: Any) -> Any:
        """One step's simulator call; on a JVM failure, the ``StepOutcome`` of :meth:`_crash_and_restart`."""
        try:
            return guarded(self.engine, call, *args)
        except JVMFailure as failure:
            return self._crash_and_restart(str(failure))

    def _crash_and_restart(self, cause: str) -> Any:
        """A fresh JVM with the episode replayed; if that fails too, the episode ends as a crash."""
        from agentgym_opd.core import StepOutcome
        from agentgym_opd.types import StepError

        self._fresh_engine("step", cause)
        try:
            self._call("episode replay", self._replay)
        except RuntimeError:
            return StepOutcome("The simulator crashed and could not be restarted; the episode ends here.",
                               terminated=True,
                               error=StepError("env_crash", f"{self.simulator}'s JVM failed ({cause}) and could not "
                                                            "be restored; the episode was ended."))
        return StepOutcome(
            "The simulator crashed and was restarted; the world is as it was before your last action. "
            "Try the action again or choose another.",
            error=StepError("env_crash", f"{self.simulator}'s JVM failed ({cause}); it was restarted and the "
                                         "episode replayed."))

    def jvm_pid(self) -> int | None:
        """The simulator's JVM process id (tests kill and freeze it to check crash recovery)."""
        proc = java_process(self.engine)
        return None if proc is None else proc.pid

    def close(self) -> None:
        engine, self.engine = getattr(self, "engine", None), None
        if engine is not None:
            kill(engine)
