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
