"""Bounds on the work agent text can make the trainer's process do.

Policy (README, "Agent text is hostile"): every env step runs agent-controlled work under a time and a
memory bound. Two kinds of work need two mechanisms:

* **Our own code** (parsers, validators, matchers) is bounded by construction: the action's length is
  capped by the env, data walks are iterative, nesting and integer sizes are capped (`environments/bfcl/
  values.py`), regular expressions on agent text never backtrack, and every failure of Python's own
  parser is caught (`parse_python`) and echoed without recursion (`source_excerpt`). Such work costs at
  most a few milliseconds per step and needs no process of its own.
* **Third-party code that computes with agent values** (BFCL's backends: `power(base=10,
  exponent=100000000)` computes a 41 MB integer in one C call, which no signal interrupts) runs in a
  `BoundedWorker`: a child process with a wall-clock deadline per request (the parent SIGKILLs it on
  expiry) and an address-space limit (RLIMIT_AS) set a fixed headroom above the code it loaded. WHY a
  process and not a thread or SIGALRM: a C loop holding the GIL is interrupted by neither, and memory can
  only be bounded per process. WHY one long-lived child instead of one per call: state (BFCL's backends are
  stateful across turns) stays in the child between calls, and a request costs a pipe round trip
  (~0.1 ms) instead of a process start (~1 s).

Numeric libraries keep their precision in process-wide state (`decimal.getcontext()`, `mpmath.mp`);
`local_numeric_context` makes any code run inside it leave that state as it found it.

Everything that crosses the pipe is plain data (None, bool, int, float, str, bytes, list, tuple, dict,
set): both sides unpickle with `find_class` disabled, so neither can make the other build an object.
"""

from __future__ import annotations

import ast
import contextlib
import decimal
import os
import pickle
import resource
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from typing import Any, Iterator

# ----------------------------------------------------------------------------- parsing agent text

PARSER_FAILURES = (SyntaxError, ValueError, MemoryError, RecursionError, OverflowError)


class UnparsableText(ValueError):
    """Agent text Python's parser refused; `message` says why in words fit to show a model."""

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


def parse_python(source: str, *, mode: str = "exec") -> ast.AST:
    """`ast.parse`, with every way the parser can fail on hostile text raised as `UnparsableText`.

    WHY: besides `SyntaxError`, CPython's parser raises `MemoryError` ("parser stack overflow": a run of
    7,000 `-` before a number), `RecursionError` (`1+1+...` 6,000 times: too deep to build the tree),
    `ValueError` (null bytes) and `OverflowError`; each is a property of the text, not of the machine, so
    each becomes the same clear refusal. The parse itself is linear in the text, which the env caps.
    """
    try:
        return ast.parse(source, mode=mode)
    except SyntaxError as exc:
        where = f" at line {exc.lineno}" if exc.lineno else ""
        text = (exc.text or "").rstrip()
        if len(text) > 200:
            text = text[:200] + "..."
        raise UnparsableText(f"SyntaxError{where}: {exc.msg}" + (f"\n    {text}" if text else "")) from None
    except (MemoryError, RecursionError):
        raise UnparsableText("the text is nested too deeply to parse (a long run of operators, brackets or "
                             "chained expressions); write it flat") from None
    except (ValueError, OverflowError) as exc:
        raise UnparsableText(f"the text cannot be parsed: {str(exc)[:200]}") from None


def source_excerpt(source: str, node: ast.AST, limit: int = 120) -> str:
    """The agent's own text of `node`, at most `limit` characters, for an error message.

    WHY not `ast.unparse`: it recurses once per nesting level in Python, so 600 nested unary minuses
    (which the C parser accepts) raise `RecursionError` while *describing* a bad argument. Slicing the
    source by the node's recorded positions costs no recursion and shows exactly what the agent wrote.
    """
    text = None
    with contextlib.suppress(*PARSER_FAILURES, AttributeError, TypeError, IndexError):
        text = ast.get_source_segment(source, node)
    if not text:
        return "an expression"
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit] + "..."


# ----------------------------------------------------------------------------- numeric state

@contextlib.contextmanager
def local_numeric_context() -> Iterator[None]:
    """Run a block with private `decimal` and `mpmath` precision: whatever it sets is undone on exit.

    WHY: BFCL's `square_root(..., precision=2)` sets `decimal.getcontext().prec` and `logarithm(...,
    precision=3)` sets `mpmath.mp.dps` for the whole process, so one call would change every later
    computation in it. `decimal.localcontext()` gives the block a copy of the context; mpmath's precision
    is saved and restored (only where mpmath is already imported: this never imports it).
    """
    mpmath = sys.modules.get("mpmath")
    saved_prec = mpmath.mp.prec if mpmath is not None else None
    try:
        with decimal.localcontext():
            yield
    finally:
        if mpmath is not None:
            mpmath.mp.prec = saved_prec


# ----------------------------------------------------------------------------- the worker process

class BoundExceeded(RuntimeError):
    """A request to a `BoundedWorker` hit a bound; the worker was killed (its state is gone).

    `kind`: "timeout" (the deadline passed), "memory" (the address-space limit was reached) or "crash"
    (the worker died otherwise, or answered with something that is not plain data)."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind
        self.message = message


class RemoteError(RuntimeError):
    """The service's method raised; `type_name` and the message are the worker's exception's."""

    def __init__(self, type_name: str, message: str):
        super().__init__(f"{type_name}: {message}")
        self.type_name = type_name
        self.message = message


MAX_MESSAGE_BYTES = 64 * 1024 * 1024  # a reply larger than this is refused (the parent never buffers more)
_HEADER = struct.Struct("!Q")
_WORKER_ENV = {  # one computation at a time: thread pools and malloc arenas would only eat the headroom
    "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MALLOC_ARENA_MAX": "2",
    "TOKENIZERS_PARALLELISM": "false",
}


class _PlainUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):  # noqa: D401 - pickle's hook
        raise pickle.UnpicklingError(f"{module}.{name} is not plain data")


def _loads_plain(data: bytes) -> Any:
    import io

    return _PlainUnpickler(io.BytesIO(data)).load()


def _send(sock: socket.socket, obj: Any) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    sock.sendall(_HEADER.pack(len(data)) + data)


def _recv_exactly(sock: socket.socket, size: int, deadline: float | None) -> bytes:
    chunks, got = [], 0
    while got < size:
        if deadline is not None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError
            sock.settimeout(remaining)
        else:
            sock.settimeout(None)
        chunk = sock.recv(min(size - got, 1 << 20))
        if not chunk:
            raise EOFError
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def _recv(sock: socket.socket, deadline: float | None) -> Any:
    (size,) = _HEADER.unpack(_recv_exactly(sock, _HEADER.size, deadline))
    if size > MAX_MESSAGE_BYTES:
        raise OverflowError(f"a message of {size} bytes (the limit is {MAX_MESSAGE_BYTES})")
    return _loads_plain(_recv_exactly(sock, size, deadline))


def _boot_code() -> str:
    """What the child runs: import this file by path, without importing the `agentgym_opd` package (whose
    import discovers every env plugin: ~1 s the worker does not need)."""
    return ("import importlib.util, sys\n"
            f"spec = importlib.util.spec_from_file_location('agentgym_opd_bounded_worker', {os.path.abspath(__file__)!r})\n"
            "module = importlib.util.module_from_spec(spec)\n"
            "sys.modules[spec.name] = module\n"
            "spec.loader.exec_module(module)\n"
            "module.serve(int(sys.argv[1]), sys.argv[2], int(sys.argv[3]))\n")


class BoundedWorker:
    """A child process hosting one service object (`factory` = "module:callable", made in the child), whose
    public methods the parent calls by name with a deadline (`call`).

    Bounds: a request that outlives `timeout_s` gets the child SIGKILLed and raises `BoundExceeded
    ("timeout")`; the child's address space is limited to what it had loaded plus `memory_headroom_mb`
    (a `MemoryError` there raises `BoundExceeded("memory")` and the child exits, its state being suspect);
    a child that dies raises `BoundExceeded("crash")`. After any of these the next `call` starts a fresh
    child and `generation` goes up by one, so a client holding state in the child knows to rebuild it.
    Thread-safe: one request at a time. A forked copy of the parent never talks to its parent's child.
    """

    def __init__(self, factory: str, *, memory_headroom_mb: int = 1024, start_timeout_s: float = 120.0,
                 name: str = "bounded worker"):
        self.factory = factory
        self.memory_headroom_mb = memory_headroom_mb
        self.start_timeout_s = start_timeout_s
        self.name = name
        self.generation = 0
        self._proc: subprocess.Popen | None = None
        self._sock: socket.socket | None = None
        self._pid = os.getpid()
        self._lock = threading.RLock()

    # -- lifecycle
    @property
    def lock(self) -> threading.RLock:
        """Held by `call`; a client holds it across several calls that must meet the same child."""
        return self._lock

    @property
    def alive(self) -> bool:
        return self._proc is not None and self._pid == os.getpid() and self._proc.poll() is None

    def _start(self) -> None:
        parent_end, child_end = socket.socketpair()
        env = dict(os.environ, **_WORKER_ENV)
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p and os.path.isdir(p))
        try:
            proc = subprocess.Popen(
                [sys.executable, "-c", _boot_code(), str(child_end.fileno()), self.factory, str(self.memory_headroom_mb)],
                pass_fds=(child_end.fileno(),), env=env, stdin=subprocess.DEVNULL, close_fds=True)
        finally:
            child_end.close()
        self._proc, self._sock, self._pid = proc, parent_end, os.getpid()
        self.generation += 1
        try:
            status = _recv(parent_end, time.monotonic() + self.start_timeout_s)
        except (TimeoutError, EOFError, OSError, OverflowError, pickle.UnpicklingError) as exc:
            self._kill()
            raise RuntimeError(f"the {self.name} did not start ({type(exc).__name__}); see its stderr above") from None
        if status[0] != "ready":
            self._kill()
            raise RuntimeError(f"the {self.name} could not make its service {self.factory}: {status[1]}")

    def _kill(self) -> None:
        proc, sock = self._proc, self._sock
        self._proc = self._sock = None
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.close()
        if proc is not None and self._pid == os.getpid():
            with contextlib.suppress(OSError):
                proc.kill()
            with contextlib.suppress(Exception):
                proc.wait(timeout=10)

    def close(self) -> None:
        with self._lock:
            if self._pid == os.getpid():
                self._kill()
            self._proc = self._sock = None

    def ensure_started(self) -> int:
        """Start the child if it is not running; return the current generation."""
        with self._lock:
            if not self.alive:
                self._kill()  # in a forked copy of the parent this only closes the copy's end of the pipe
                self._start()
            return self.generation

    # -- requests
    def call(self, method: str, *args: Any, timeout_s: float, **kwargs: Any) -> Any:
        """Run `service.method(*args, **kwargs)` in the child within `timeout_s` seconds; return its result."""
        with self._lock:
            self.ensure_started()
            sock = self._sock
            deadline = time.monotonic() + timeout_s
            try:
                _send(sock, (method, args, kwargs))
                reply = _recv(sock, deadline)
            except TimeoutError:
                self._kill()
                raise BoundExceeded("timeout", f"no answer within {timeout_s:g} s") from None
            except (EOFError, OSError, OverflowError, pickle.UnpicklingError, struct.error) as exc:
                code = None
                with contextlib.suppress(Exception):
                    code = self._proc.wait(timeout=2) if isinstance(exc, EOFError) else self._proc.poll()
                self._kill()
                raise BoundExceeded("crash", f"the {self.name} died ({type(exc).__name__}, exit status {code})") from None
            status = reply[0]
            if status == "ok":
                return reply[1]
            if status == "raised":
                raise RemoteError(reply[1], reply[2])
            self._kill()  # "memory": the child exits after reporting it
            raise BoundExceeded("memory", reply[1])

    def __del__(self):  # pragma: no cover - interpreter shutdown order varies
        with contextlib.suppress(Exception):
            self.close()


# ----------------------------------------------------------------------------- the child's side

_HEADROOM_BYTES: int | None = None


def _address_space_bytes() -> int | None:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def _tighten_memory() -> None:
    """Set RLIMIT_AS (soft) to the current address space plus the headroom; the hard limit stays, so a
    later `loading_code` may lift it again."""
    if _HEADROOM_BYTES is None:
        return
    current = _address_space_bytes()
    if current is None:
        return
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    soft = current + _HEADROOM_BYTES
    if hard != resource.RLIM_INFINITY:
        soft = min(soft, hard)
    resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


@contextlib.contextmanager
def loading_code() -> Iterator[None]:
    """For a service inside a `BoundedWorker`: lift the memory limit while importing code or loading a model
    (a sentence encoder maps ~3 GB of address space), then set it again above what is now loaded. Outside a
    worker it does nothing."""
    if _HEADROOM_BYTES is None:
        yield
        return
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (hard, hard))
    try:
        yield
    finally:
        _tighten_memory()


def _set_parent_death_signal() -> None:
    """Die with the parent (Linux `PR_SET_PDEATHSIG`), so a busy worker never outlives a killed trainer."""
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)


def _make_service(factory: str) -> Any:
    import importlib

    module_name, _, attr = factory.partition(":")
    target = importlib.import_module(module_name)
    for part in attr.split("."):
        target = getattr(target, part)
    return target()


def serve(fd: int, factory: str, headroom_mb: int) -> None:
    """The child's loop: make the service, then answer (method, args, kwargs) requests until EOF."""
    global _HEADROOM_BYTES
    _set_parent_death_signal()
    sys.modules.setdefault("agentgym_opd.bounded", sys.modules[__name__])  # one copy of `loading_code`
    sock = socket.socket(fileno=fd)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    try:
        service = _make_service(factory)
    except BaseException as exc:  # report why, then exit
        _send(sock, ("failed", f"{type(exc).__name__}: {str(exc)[:2000]}"))
        return
    _HEADROOM_BYTES = headroom_mb * 1024 * 1024
    _tighten_memory()
    _send(sock, ("ready",))
    while True:
        try:
            method, args, kwargs = _recv(sock, None)
        except (EOFError, OSError):
            return  # the parent closed the pipe or exited
        if not isinstance(method, str) or method.startswith("_") or not callable(getattr(service, method, None)):
            _send(sock, ("raised", "AttributeError", f"the service has no public method {method!r}"))
            continue
        try:
            reply = ("ok", getattr(service, method)(*args, **kwargs))
        except MemoryError:
            reply = None
        except Exception as exc:  # the service's own failure is the request's answer
            reply = ("raised", type(exc).__name__, str(exc)[:2000])
        if reply is None:
            _send(sock, ("memory", f"more memory than the limit ({headroom_mb} MB above the loaded code)"))
            return  # state after a MemoryError is suspect: the parent starts a fresh worker
        try:
            _send(sock, reply)
        except MemoryError:
            _send(sock, ("memory", "the answer did not fit in the memory limit"))
            return
        except (pickle.PicklingError, TypeError, AttributeError, RecursionError) as exc:
            _send(sock, ("raised", type(exc).__name__, f"the answer is not plain data: {str(exc)[:500]}"))
