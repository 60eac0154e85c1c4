"""Run untrusted (model-written) Python in a fresh, resource-limited subprocess.

Why a subprocess and not `exec`: generated code loops forever, allocates without bound, forks, calls
`sys.exit`, corrupts interpreter state. Only a separate process that we can kill keeps the host (the
rollout worker) alive. Each `run_program` call:

* writes the program to a fresh temporary directory and runs `python -I -B guard.py main.py` there
  (`-I`: no user site, no PYTHON* variables, script dir not on sys.path; `-B`: no .pyc writes);
* closes stdin (DEVNULL), starts a new session so that a timeout kills the whole process group;
* sets limits in `preexec_fn`: RLIMIT_AS (memory), RLIMIT_CPU, RLIMIT_FSIZE (file size), RLIMIT_NPROC
  (processes; note the kernel does not enforce it for root, hence the audit hook below), RLIMIT_CORE=0;
* cuts the network: on Linux with a working `unshare -rn` (checked once, cached) the child runs in a new
  user + network namespace that has only a downed loopback, so no connection can leave the machine;
  independently of that, the guard's audit hook refuses `socket.connect`/`bind`/`getaddrinfo` etc.
  (on the project's Linux build machines, running as root, `unshare -rn` works, so both layers hold;
  elsewhere, e.g. macOS or a container without user namespaces, only the audit hook does);
* the guard installs a `sys.addaudithook` hook (which cannot be removed from Python code) that refuses
  opening files for writing, and `os.remove/rename/rmdir/mkdir/chmod/symlink/link/truncate/...`, for any
  path outside the temp dir, and refuses process creation (`os.fork`, `os.system`, `subprocess.Popen`,
  `os.exec*`, `os.posix_spawn`), which is what contains a fork bomb even as root.

Guarantees and non-guarantees: this is a *best-effort* sandbox against buggy or careless code, the
threat model of code benchmarks (HumanEval's own harness is weaker). It is NOT a security boundary
against deliberately malicious code: `ctypes` or a C extension can make syscalls that no audit hook sees
(e.g. write files or call fork directly); the child runs as the same user as the host; reads of the file
system are allowed. The wall-clock timeout and the rlimits hold regardless of what the code does (they
are enforced by the kernel and the parent). For hostile code use a container or gVisor on top.
"""

from __future__ import annotations

import functools
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

# The guard runs first in the child; it takes the program path as argv[1]. Kept as source text so the
# child needs nothing from this package (the child's sys.path does not include the repo).
GUARD_SOURCE = r'''
import os, sys
sys.dont_write_bytecode = True
_ROOT = os.path.realpath(os.getcwd())
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
_WRITE_FLAGS = _WRITE_FLAGS
_PATH_EVENTS = {"os.remove", "os.rename", "os.rmdir", "os.mkdir", "os.chmod", "os.chown", "os.link",
                "os.symlink", "os.truncate", "os.utime", "shutil.rmtree", "shutil.move", "shutil.copyfile",
                "shutil.copytree", "os.chflags", "os.lchflags", "os.setxattr", "os.removexattr", "os.mkfifo", "os.mknod"}
_PROCESS_EVENTS = {"os.fork", "os.forkpty", "os.system", "subprocess.Popen", "os.exec", "os.posix_spawn",
                   "os.spawn", "os.startfile", "pty.spawn", "os.kill", "os.killpg"}
_NET_EVENTS = {"socket.connect", "socket.bind", "socket.getaddrinfo", "socket.gethostbyname",
               "socket.gethostbyaddr", "socket.sendto", "socket.sendmsg"}
_realpath = os.path.realpath
_fspath = os.fspath
_SEP = os.sep
_PathLike = os.PathLike

def _inside(path):
    if isinstance(path, int):
        return True  # an already open descriptor: its opening was checked
    try:
        p = _fspath(path)
        if isinstance(p, bytes):
            p = p.decode("utf-8", "surrogateescape")
        full = _realpath(p)
    except Exception:
        return False
    return full == _ROOT or full.startswith(_ROOT + _SEP)

def _hook(event, args):
    if event == "open":
        path, mode, flags = (tuple(args) + (None, None, 0))[:3]
        writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (isinstance(flags, int) and flags & _WRITE_FLAGS)
        if writing and path is not None and not _inside(path):
            raise PermissionError(f"sandbox: writing outside the working directory is not allowed: {path!r}")
    elif event in _PATH_EVENTS:
        for arg in args[:2]:
            if isinstance(arg, (str, bytes, _PathLike)) and not _inside(arg):
                raise PermissionError(f"sandbox: {event} outside the working directory is not allowed: {arg!r}")
    elif event in _PROCESS_EVENTS:
        raise PermissionError(f"sandbox: creating or signalling processes ({event}) is not allowed")
    elif event in _NET_EVENTS:
        raise PermissionError(f"sandbox: network access ({event}) is not allowed")

sys.addaudithook(_hook)
_program = sys.argv[1]
sys.argv = [_program]
import runpy as _runpy
_runpy.run_path(_program, run_name="__main__")
'''

STATUSES = ("passed", "failed", "timeout", "memory", "crashed")
TAIL_CHARS = 4000


@dataclass
class SandboxResult:
    """Outcome of one program run. `failing_test` is the source line where the program failed, if known."""

    status: str  # one of STATUSES
    returncode: int | None
    stdout: str
    stderr: str
    duration_s: float
    failing_test: str | None = None
    details: dict = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return self.status == "passed"


@functools.lru_cache(maxsize=1)
def network_namespace_available() -> bool:
    """True when `unshare -rn` can start a process here (Linux, unprivileged user namespaces or root)."""
    exe = shutil.which("unshare")
    if not sys.platform.startswith("linux") or exe is None:
        return False
    try:
        return subprocess.run([exe, "-rn", "true"], stdin=subprocess.DEVNULL, capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def _limits(memory_mb: int, cpu_s: float, max_file_mb: int, max_procs: int):
    """preexec_fn: runs in the child between fork and exec, so the limits bind the child only.

    It only calls setrlimit (no locks, no imports), which keeps `preexec_fn` safe enough when rollouts
    call the sandbox from several threads."""

    def apply() -> None:
        def setlimit(which: int, value: int) -> None:
            try:
                soft, hard = resource.getrlimit(which)
                value = value if hard == resource.RLIM_INFINITY else min(value, hard)
                resource.setrlimit(which, (value, value))
            except (ValueError, OSError):
                pass  # a limit this platform does not support: the others and the timeout still hold

        setlimit(resource.RLIMIT_AS, memory_mb * 1024 * 1024)
        setlimit(resource.RLIMIT_CPU, max(1, int(cpu_s + 0.999)))
        setlimit(resource.RLIMIT_FSIZE, max_file_mb * 1024 * 1024)
        setlimit(resource.RLIMIT_CORE, 0)
        if hasattr(resource, "RLIMIT_NPROC"):
            setlimit(resource.RLIMIT_NPROC, max_procs)

    return apply


def _tail(data: bytes | str | None, limit: int = TAIL_CHARS) -> str:
    if data is None:
        return ""
    text = data.decode("utf-8", "replace") if isinstance(data, bytes) else data
    return text if len(text) <= limit else "[...]\n" + text[-limit:]


_FRAME = re.compile(r'File "([^"]+)", line (\d+)')


def clean_traceback(stderr: str, workdir: str) -> str:
    """Drop the sandbox's own frames (guard, runpy) and the temp path, so a model sees only its code's frames."""
    out, skip_source = [], False
    for line in stderr.splitlines():
        stripped = line.strip()
        if stripped.startswith('File "'):
            skip_source = "_sandbox_guard.py" in stripped or "<frozen runpy>" in stripped
            if skip_source:
                continue
        elif skip_source and line.startswith("    "):
            continue  # the source line (and caret line) of a dropped frame
        else:
            skip_source = False
        out.append(line.replace(workdir + os.sep, ""))
    return "\n".join(out)


def failing_line(stderr: str, program: str, program_path: str, first_test_line: int = 1) -> str | None:
    """The source line of the innermost traceback frame in the program's test part (line >= first_test_line):
    the failed test, even when the exception was raised deeper, inside the code under test."""
    lines = program.splitlines()
    hit = None
    for path, lineno in _FRAME.findall(stderr):
        if os.path.basename(path) == os.path.basename(program_path) and int(lineno) >= first_test_line:
            hit = int(lineno)
    if hit is None or not 1 <= hit <= len(lines):
        return None
    return lines[hit - 1].strip()


def run_program(
    program: str,
    *,
    timeout_s: float = 10.0,
    memory_mb: int = 1024,
    max_file_mb: int = 16,
    max_procs: int = 64,
    python: str | None = None,
    isolate_network: bool = True,
    first_test_line: int = 1,
) -> SandboxResult:
    """Run `program` (Python source) in a fresh sandboxed interpreter; never raises for what the program does.

    Exit status 0 -> "passed"; killed by the wall clock (or RLIMIT_CPU's SIGXCPU) -> "timeout"; a
    MemoryError or a kill after hitting RLIMIT_AS -> "memory"; any other exception -> "failed"
    (with the failing source line, searched from `first_test_line` on); death by another signal -> "crashed".
    """
    workdir = tempfile.mkdtemp(prefix="agentgym_code_")
    program_path = os.path.join(workdir, "main.py")
    guard_path = os.path.join(workdir, "_sandbox_guard.py")
    try:
        with open(program_path, "w", encoding="utf-8", errors="surrogateescape") as handle:
            handle.write(program)
        with open(guard_path, "w", encoding="utf-8") as handle:
            handle.write(GUARD_SOURCE)
        command = [python or sys.executable, "-I", "-B", guard_path, program_path]
        if isolate_network and network_namespace_available():
            command = [shutil.which("unshare") or "unshare", "-rn", *command]
        env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "PYTHONHASHSEED": "0", "HOME": workdir, "TMPDIR": workdir}
        start = time.monotonic()
        proc = subprocess.Popen(
            command,
            cwd=workdir,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            start_new_session=True,
            preexec_fn=_limits(memory_mb, timeout_s, max_file_mb, max_procs),
        )
        timed_out = False
        try:
            out, err = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill_group(proc)
            out, err = proc.communicate()
        duration = time.monotonic() - start
        _kill_group(proc)  # stray children that outlived the main process
        stdout = _tail(out)
        stderr = _tail(clean_traceback((err or b"").decode("utf-8", "replace"), workdir))
        code = proc.returncode
        if timed_out or code == -signal.SIGXCPU:
            status = "timeout"
        elif code == 0:
            status = "passed"
        elif "MemoryError" in stderr or code == -signal.SIGKILL:
            status = "memory"
        elif code is not None and code < 0:
            status = "crashed"
        else:
            status = "failed"
        failing = failing_line(stderr, program, "main.py", first_test_line) if status in ("failed", "memory") else None
        return SandboxResult(status, code, stdout, stderr, duration, failing)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError, OSError):
        pass
