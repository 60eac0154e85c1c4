"""Run model-written Python inside bubblewrap, with limits the kernel enforces and output the host bounds.

Why bubblewrap: it is the isolation tool Debian ships (`apt-get install bubblewrap`; nsjail is not in
Debian 12), it needs no daemon, starts in a few milliseconds, and sets up the namespaces from a plain
command line. Each run gets:

* its own user, pid, mount, network, IPC, UTS and cgroup namespaces (`--unshare-*`), no capabilities,
  no new privileges, and no further user namespaces (`--disable-userns`);
* a root file system holding only /usr read-only (the Debian interpreter and its standard library), a
  fresh /proc of its own pid namespace, a read-only minimal /dev, the run's files read-only under /sandbox
  (copied in through file descriptors: no host path of the task is mounted) and one private scratch tmpfs
  bounded in bytes (`tmpfs_mb`) and in files (`TMPFS_INODES`), seen as /tmp (the working directory) and
  /dev/shm (`sandboxed/scratch_mount.py` mounts it; bubblewrap's own `--size` cannot bound files). No
  /etc, /home, /root, /work, no host /tmp, no host sockets;
* a network namespace with only a loopback interface: nothing reaches the host or beyond;
* a bound on ALL memory the run holds, whichever way it holds it (anonymous pages, files, memfds, shared
  memory, pipes, sockets, many processes), by the strongest mechanism this host offers, checked once per
  process (`memory_bound()` says which is in force, and every result carries it in `details`):
  - "cgroup": a cgroup v2 per run (`sandboxed/cgroup.py`): memory.max = memory_mb + tmpfs_mb +
    RUN_OVERHEAD_MB for the whole run, swap 0, pids.max; over the limit the kernel ends the run and the
    result is status "memory". Needs a delegated cgroup ($AGENTGYM_SANDBOX_CGROUP, or this process's own
    cgroup when it hands memory and pids to children);
  - "rlimits" (no usable cgroup, e.g. cgroup v1 or a container without delegation): per-process limits
    plus a syscall filter (`sandboxed/syscall_filter.py`) that refuses what no rlimit counts (memfd_create,
    SysV shm/msg/sem, sockets, io_uring, BPF, perf buffers, inotify, F_SETPIPE_SZ) and one process making
    another hold memory (ptrace, process_vm_writev, pidfd_getfd). Then the run holds at
    most: max_procs processes x their RLIMIT_AS, plus the scratch tmpfs, plus kernel buffers bounded by
    counts (RLIMIT_NOFILE descriptors x a 64 KB pipe each, TMPFS_INODES inodes);
* limits on every process: RLIMIT_AS (memory), RLIMIT_CPU, RLIMIT_FSIZE, RLIMIT_CORE=0, RLIMIT_NOFILE
  (MAX_OPEN_FILES), RLIMIT_MEMLOCK=0, RLIMIT_MSGQUEUE=0 (no POSIX message queues), and RLIMIT_NPROC set
  *inside* the namespace. When the host runs as root, bubblewrap itself is started as the unprivileged uid
  SANDBOX_UID: the kernel never enforces RLIMIT_NPROC for real uid 0 (even inside a user namespace), so
  the process limit would not hold otherwise; set inside the namespace, it counts that namespace's
  processes only, so concurrent runs do not share a budget;
* a wall-clock timeout: the host SIGKILLs bubblewrap, whose `--die-with-parent` takes down the pid
  namespace's init, and with it every process of the run (setsid() grandchildren and daemons included);
* output read through a bounded reader: the host keeps at most `TAIL_BYTES` of each stream and stops the
  run once `max_output_bytes` have arrived.

Where bubblewrap is missing or cannot create namespaces, `SandboxUnavailable` says how to fix it; there is
no weaker fallback.

`run_program` runs a plain program and reports its exit status (the program's own claim, fine for
containment). Verdicts on tests use `run_checked` (see `environments.code.sandboxed.supervisor`): the
tests run in a process the candidate cannot touch, and the host accepts only a verdict that carries the
run's random token.
"""

from __future__ import annotations

import atexit
import functools
import json
import logging
import os
import re
import resource
import secrets
import selectors
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from environments.code.sandboxed import cgroup, syscall_filter

SANDBOX_UID = 65534  # nobody/nogroup: an unprivileged identity for bubblewrap when the host is root
SANDBOX_DIR = "/sandbox"
INSTALL_HINT = "install bubblewrap (Debian/Ubuntu: apt-get install -y bubblewrap; it ships in scripts/install.sh)"
STATUSES = ("passed", "failed", "timeout", "memory", "crashed")
TAIL_BYTES = 16384
TAIL_CHARS = 4000
VERDICT_LIMIT = 65536
TMPFS_INODES = 4096  # files, folders and links in the scratch tmpfs: each costs the kernel ~1 KB outside its size
MAX_OPEN_FILES = 64  # RLIMIT_NOFILE: also bounds the pipes a process can keep filled (64 KB each)
CHECKED_MAX_PROCS = 3  # bubblewrap's init, the checker and the candidate's process: no thread or child beyond them
RUN_OVERHEAD_MB = 256  # cgroup mode: the harness's share of a run (bubblewrap, the checker and the tests' data)
_HELPERS = Path(__file__).with_name("sandboxed")
LOG = logging.getLogger(__name__)


class SandboxUnavailable(RuntimeError):
    """The sandbox cannot run here; the message says what is missing and how to install it."""


@dataclass
class SandboxResult:
    """Outcome of one run. `failing_test` is the test source line that failed, if known."""

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


@dataclass
class _Raw:
    returncode: int | None
    stdout: bytes
    stderr: bytes
    verdict: bytes
    timed_out: bool
    output_exceeded: bool
    duration_s: float
    kernel: dict = field(default_factory=dict)  # the run cgroup's record (memory peak, OOM kills), if any

    @property
    def over_memory(self) -> bool:
        return self.kernel.get("oom_kills", 0) > 0


@dataclass(frozen=True)
class MemoryBound:
    """Which mechanism bounds the memory a run holds on this host: "cgroup" (a cgroup v2 per run) or
    "rlimits" (per-process limits, the syscall filter and the sized tmpfs); `detail` says where or why."""

    kind: str
    detail: str
    cgroup_parent: Path | None = None

    def describe(self) -> dict:
        return {"memory_bound": self.kind, "memory_bound_detail": self.detail}


def sandbox_python() -> str:
    """The interpreter for the sandbox: Debian's /usr/bin/python3 (its standard library lives under /usr,
    the only host tree the sandbox sees)."""
    for candidate in ("/usr/bin/python3", "/usr/local/bin/python3"):
        if os.path.exists(candidate) and os.path.realpath(candidate).startswith("/usr/"):
            return candidate
    raise SandboxUnavailable("no Python under /usr for the sandbox: apt-get install -y python3")


@functools.lru_cache(maxsize=1)
def _bwrap() -> str:
    exe = shutil.which("bwrap")
    if exe is None:
        raise SandboxUnavailable(f"the code sandbox needs bubblewrap (bwrap), which is not installed: {INSTALL_HINT}")
    return exe


def check_sandbox() -> None:
    """Raise SandboxUnavailable unless bubblewrap can start a sandbox here (checked once per process)."""
    memory_bound()


@functools.lru_cache(maxsize=1)
def memory_bound() -> MemoryBound:
    """The memory bound in force for every run of this process, found by trying: a cgroup where one is
    delegated, else rlimits with the syscall filter. Raises SandboxUnavailable if no sandbox starts."""
    parent, where = cgroup.find_parent()
    if parent is not None:
        failure = _probe(parent)
        if failure is None:
            bound = MemoryBound("cgroup", f"cgroup v2 per run (memory.max, memory.swap.max=0, pids.max) under {where}", parent)
            LOG.info("code sandbox memory bound: %s", bound.detail)
            return bound
        where = f"a run in a child cgroup of {parent} failed: {failure}"
    if not syscall_filter.supported():
        raise SandboxUnavailable(
            f"no cgroup bounds the sandbox's memory here ({where}) and the syscall filter that the rlimits need has no "
            f"table for this architecture ({syscall_filter.machine()}): set ${cgroup.CGROUP_ENV} to a delegated cgroup v2 directory")
    failure = _probe(None)
    if failure is not None:
        raise SandboxUnavailable(
            "bubblewrap is installed but cannot create its namespaces here (it needs user namespaces: "
            "sysctl kernel.unprivileged_userns_clone=1 / user.max_user_namespaces > 0): " + failure)
    bound = MemoryBound("rlimits", f"rlimits per process, syscall filter, sized tmpfs (no cgroup: {where})")
    LOG.info("code sandbox memory bound: %s", bound.detail)
    return bound


def _probe(cgroup_parent: Path | None) -> str | None:
    """None if a trivial program runs in the sandbox (in a child cgroup of `cgroup_parent`, if given),
    else what went wrong."""
    try:
        raw = _run({}, [sandbox_python(), "-I", "-S", "-c", "print('ok')"], timeout_s=20, memory_mb=512, cpu_s=10,
                   max_file_mb=1, max_procs=8, max_output_bytes=4096, tmpfs_mb=1, cgroup_parent=cgroup_parent)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"{type(exc).__name__}: {exc}"
    if raw.returncode != 0 or raw.stdout.strip() != b"ok":
        return f"exit status {raw.returncode}: " + raw.stderr.decode("utf-8", "replace")[-500:]
    return None


_scratch_folder: list[str] = []


def _scratch_mountpoint() -> str:
    """An empty host folder that each run's scratch tmpfs is mounted over, in the run's own mount
    namespace (the host's view of it stays empty); one per process, removed at exit, made again if
    something (a /tmp cleaner) removed it, so a run never fails for want of it."""
    if _scratch_folder and os.path.isdir(_scratch_folder[0]):
        return _scratch_folder[0]
    folder = tempfile.mkdtemp(prefix="agentgym-sandbox-scratch-")
    os.chmod(folder, 0o755)  # reachable by SANDBOX_UID when the host is root
    atexit.register(_remove_folder, folder)
    _scratch_folder[:] = [folder]
    return folder


def _remove_folder(folder: str) -> None:
    try:
        os.rmdir(folder)
    except OSError:
        pass


def _memfd(name: str, data: bytes) -> int:
    fd = os.memfd_create(name, 0)
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def _command(file_fds: dict[str, int], argv: list[str], tmpfs_mb: int, filter_fd: int | None) -> list[str]:
    """The host command of one run: the scratch-tmpfs step (scratch_mount.py), which becomes bubblewrap."""
    scratch = _scratch_mountpoint()
    cmd = [sandbox_python(), "-I", "-S", "-c", (_HELPERS / "scratch_mount.py").read_text(), str(tmpfs_mb << 20),
           str(TMPFS_INODES), scratch,
           _bwrap(), "--unshare-user", "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts",
           "--unshare-cgroup-try", "--disable-userns", "--die-with-parent", "--new-session", "--cap-drop", "ALL",
           "--uid", "1000", "--gid", "1000", "--hostname", "sandbox",
           "--ro-bind", "/usr", "/usr", "--symlink", "usr/bin", "/bin", "--symlink", "usr/lib", "/lib",
           "--proc", "/proc", "--dev", "/dev", "--bind", f"{scratch}/tmp", "/tmp", "--bind", f"{scratch}/shm", "/dev/shm",
           "--remount-ro", "/dev", "--tmpfs", SANDBOX_DIR]
    if os.path.isdir("/usr/lib64"):
        cmd += ["--symlink", "usr/lib64", "/lib64"]
    if filter_fd is not None:
        cmd += ["--seccomp", str(filter_fd)]
    for name, fd in file_fds.items():
        cmd += ["--ro-bind-data", str(fd), f"{SANDBOX_DIR}/{name}"]
    cmd += ["--remount-ro", SANDBOX_DIR, "--remount-ro", "/", "--chdir", "/tmp", "--clearenv",
            "--setenv", "PATH", "/usr/bin:/bin", "--setenv", "LANG", "C.UTF-8", "--setenv", "HOME", "/tmp",
            "--setenv", "TMPDIR", "/tmp", "--setenv", "PYTHONHASHSEED", "0", "--"]
    return cmd + argv


def _host_limits(memory_mb: int, cpu_s: float, max_file_mb: int, run_cgroup: cgroup.RunCgroup | None):
    """preexec_fn for the run's first process: join the run's cgroup (if any), set the limits every process
    of the run inherits, then (as root) drop to SANDBOX_UID. Only write/setrlimit/setgroups/setres[ug]id:
    safe between fork and exec."""
    def apply() -> None:
        if run_cgroup is not None:
            run_cgroup.join()
        cpu = max(1, int(cpu_s + 0.999))
        _lower(resource.RLIMIT_AS, (memory_mb + 256) << 20)  # the interpreter's own mappings on top of the budget
        _lower(resource.RLIMIT_CPU, cpu, cpu + 1)
        _lower(resource.RLIMIT_FSIZE, max_file_mb << 20)
        _lower(resource.RLIMIT_CORE, 0)
        _lower(resource.RLIMIT_NOFILE, MAX_OPEN_FILES)
        _lower(resource.RLIMIT_MEMLOCK, 0)
        _lower(resource.RLIMIT_MSGQUEUE, 0)
        if os.geteuid() == 0:
            os.setgroups([])
            os.setresgid(SANDBOX_UID, SANDBOX_UID, SANDBOX_UID)
            os.setresuid(SANDBOX_UID, SANDBOX_UID, SANDBOX_UID)
    return apply


def _lower(which: int, soft: int, hard: int | None = None) -> None:
    """Set a limit, never above the one the host already has (raising it would need privileges)."""
    _, current = resource.getrlimit(which)
    hard = soft if hard is None else hard
    if current != resource.RLIM_INFINITY:
        soft, hard = min(soft, current), min(hard, current)
    resource.setrlimit(which, (soft, hard))


def _run(files: dict[str, bytes], argv: list[str], *, timeout_s: float, memory_mb: int, cpu_s: float,
         max_file_mb: int, max_procs: int, max_output_bytes: int, tmpfs_mb: int,
         cgroup_parent: Path | None = None, run_memory_mb: int | None = None,
         token: bytes | None = None, secret: bytes = b"") -> _Raw:
    """One bubblewrap run of `argv`, in a cgroup of its own when `cgroup_parent` is given, holding at most
    `run_memory_mb` in all (default: `memory_mb`, the scratch tmpfs and the harness's share); `memory_mb`
    is each process's address space. With `token`, three more arguments name
    the descriptors that carry the verdict out, and the token and `secret` in (read once by the first
    process, before any candidate code exists; bubblewrap's init closes its copies)."""
    run_cgroup = None
    if cgroup_parent is not None:
        run_memory_mb = run_memory_mb or _run_memory_mb(memory_mb, tmpfs_mb)
        run_cgroup = cgroup.RunCgroup(cgroup_parent, run_memory_mb << 20, max_tasks=max_procs + 1)  # + bubblewrap's outer process
    try:
        raw = _run_bwrap(files, argv, timeout_s=timeout_s, memory_mb=memory_mb, cpu_s=cpu_s, max_file_mb=max_file_mb,
                         max_output_bytes=max_output_bytes, tmpfs_mb=tmpfs_mb, run_cgroup=run_cgroup,
                         token=token, secret=secret)
        if run_cgroup is not None:
            raw.kernel = run_cgroup.outcome()
        return raw
    finally:
        if run_cgroup is not None:
            run_cgroup.close()


def _run_memory_mb(memory_mb: int, tmpfs_mb: int) -> int:
    """cgroup mode: what a whole run may hold (the candidate's budget, its scratch tmpfs, the harness)."""
    return memory_mb + tmpfs_mb + RUN_OVERHEAD_MB


def _over_memory_message(memory_mb: int, tmpfs_mb: int) -> str:
    return (f"the run went over its memory limit ({_run_memory_mb(memory_mb, tmpfs_mb)} MB for the whole run: "
            f"{memory_mb} MB for the program, {tmpfs_mb} MB of scratch files, {RUN_OVERHEAD_MB} MB for the harness) "
            "and the kernel stopped it")


def _run_bwrap(files: dict[str, bytes], argv: list[str], *, timeout_s: float, memory_mb: int, cpu_s: float,
               max_file_mb: int, max_output_bytes: int, tmpfs_mb: int, run_cgroup: cgroup.RunCgroup | None,
               token: bytes | None, secret: bytes) -> _Raw:
    file_fds = {name: _memfd(name, data) for name, data in files.items()}
    passed = list(file_fds.values())
    filter_fd = _memfd("seccomp", syscall_filter.build()) if syscall_filter.supported() else None
    if filter_fd is not None:
        passed.append(filter_fd)
    verdict_r = None
    argv = list(argv)
    if token is not None:
        verdict_r, verdict_w = os.pipe()
        token_r, token_w = os.pipe()
        os.write(token_w, token)
        os.close(token_w)
        secret_fd = _memfd("secret", secret)
        passed += [verdict_w, token_r, secret_fd]
        argv += [str(verdict_w), str(token_r), str(secret_fd)]
    start = time.monotonic()
    try:
        proc = subprocess.Popen(_command(file_fds, argv, tmpfs_mb, filter_fd), stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, pass_fds=tuple(passed),
                                start_new_session=True, preexec_fn=_host_limits(memory_mb, cpu_s, max_file_mb, run_cgroup))
    except BaseException:
        if verdict_r is not None:
            os.close(verdict_r)
        raise
    finally:
        for fd in passed:
            os.close(fd)
    readers = {proc.stdout.fileno(): _Tail(TAIL_BYTES), proc.stderr.fileno(): _Tail(TAIL_BYTES)}
    if verdict_r is not None:
        readers[verdict_r] = _Tail(VERDICT_LIMIT, keep_head=True)
    try:
        timed_out, exceeded = _pump(proc, readers, timeout_s, max_output_bytes, counted=(proc.stdout.fileno(), proc.stderr.fileno()))
    finally:
        _kill(proc)
        returncode = proc.wait()
        out, err = readers[proc.stdout.fileno()].data(), readers[proc.stderr.fileno()].data()
        verdict = readers[verdict_r].data() if verdict_r is not None else b""
        proc.stdout.close()
        proc.stderr.close()
        if verdict_r is not None:
            os.close(verdict_r)
    return _Raw(returncode, out, err, verdict, timed_out, exceeded, time.monotonic() - start)


class _Tail:
    """A bounded buffer: keeps the last (or first) `cap` bytes of a stream and counts the rest."""

    def __init__(self, cap: int, keep_head: bool = False):
        self.cap, self.keep_head = cap, keep_head
        self.buffer = bytearray()
        self.total = 0

    def add(self, chunk: bytes) -> None:
        self.total += len(chunk)
        if self.keep_head:
            room = self.cap - len(self.buffer)
            if room > 0:
                self.buffer += chunk[:room]
            return
        self.buffer += chunk
        if len(self.buffer) > self.cap:
            del self.buffer[:len(self.buffer) - self.cap]

    def data(self) -> bytes:
        return bytes(self.buffer)


def _pump(proc: subprocess.Popen, readers: dict[int, _Tail], timeout_s: float, max_output_bytes: int,
          counted: tuple[int, ...]) -> tuple[bool, bool]:
    """Read every stream until all close or the deadline passes; never holds more than the readers' caps.
    Returns (timed out, output over the limit)."""
    deadline = time.monotonic() + timeout_s
    selector = selectors.DefaultSelector()
    for fd in readers:
        os.set_blocking(fd, False)
        selector.register(fd, selectors.EVENT_READ)
    open_fds = set(readers)
    try:
        while open_fds:
            left = deadline - time.monotonic()
            if left <= 0:
                return True, False
            for key, _ in selector.select(min(left, 0.5)):
                try:
                    chunk = os.read(key.fd, 65536)
                except BlockingIOError:
                    continue
                if not chunk:
                    selector.unregister(key.fd)
                    open_fds.discard(key.fd)
                    continue
                readers[key.fd].add(chunk)
                if sum(readers[fd].total for fd in counted) > max_output_bytes:
                    return False, True
        # every stream closed: the processes holding them are gone; wait for bubblewrap itself
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            return True, False
        return False, False
    finally:
        selector.close()


def _kill(proc: subprocess.Popen) -> None:
    """SIGKILL bubblewrap's process group: --die-with-parent then ends the namespace's init, and the kernel
    kills every process left in the pid namespace."""
    if proc.poll() is not None:
        return  # already reaped: its pid may belong to another process by now
    for target in (lambda: os.killpg(proc.pid, signal.SIGKILL), proc.kill):
        try:
            target()
        except OSError:
            pass


def _text(data: bytes, limit: int = TAIL_CHARS) -> str:
    text = data.decode("utf-8", "replace")
    return text if len(text) <= limit else "[...]\n" + text[-limit:]


_FRAME = re.compile(r'File "([^"]+)", line (\d+)')


_HARNESS_FRAMES = tuple(f'"{SANDBOX_DIR}/{name}"' for name in ("launch.py", "supervisor.py", "worker.py", "wire.py")) + ("<frozen runpy>",)


def clean_traceback(stderr: str) -> str:
    """Drop the harness's own frames, so a model sees only its code's frames (as main.py)."""
    out, skip_source = [], False
    for line in stderr.splitlines():
        stripped = line.strip()
        if stripped.startswith('File "'):
            skip_source = any(name in stripped for name in _HARNESS_FRAMES)
            if skip_source:
                continue
        elif skip_source and line.startswith("    "):
            continue
        else:
            skip_source = False
        out.append(line.replace(f"{SANDBOX_DIR}/", ""))
    return "\n".join(out)


def failing_line(stderr: str, program: str, program_name: str = "main.py", first_test_line: int = 1) -> str | None:
    """The source line of the innermost traceback frame of `program_name` at or after `first_test_line`."""
    lines = program.splitlines()
    hit = None
    for path, lineno in _FRAME.findall(stderr):
        if os.path.basename(path) == program_name and int(lineno) >= first_test_line:
            hit = int(lineno)
    if hit is None or not 1 <= hit <= len(lines):
        return None
    return lines[hit - 1].strip()


def run_program(program: str, *, timeout_s: float = 10.0, memory_mb: int = 1024, max_file_mb: int = 16,
                max_procs: int = 4, max_output_bytes: int = 8 << 20, tmpfs_mb: int = 64,
                first_test_line: int = 1) -> SandboxResult:
    """Run `program` (Python source) as /sandbox/main.py in the sandbox and report how it ended.
    `max_procs` counts every process and thread of the run: bubblewrap's init and the program are two.

    The status comes from the exit status, which the program controls: use it for containment, never as a
    verdict (that is `run_checked`). Never raises for what the program does; raises SandboxUnavailable when
    the sandbox cannot run here."""
    bound = memory_bound()
    data = program.encode("utf-8", "surrogateescape")
    # RLIMIT_NPROC must be set inside the namespace (see the module docstring): a two-line launcher does it
    launcher = (f"import resource, runpy, sys\nhard = resource.getrlimit(resource.RLIMIT_NPROC)[1]\n"
                f"limit = {max_procs} if hard == resource.RLIM_INFINITY else min({max_procs}, hard)\n"
                "resource.setrlimit(resource.RLIMIT_NPROC, (limit, limit))\n"
                "sys.argv = ['main.py']\nrunpy.run_path('/sandbox/main.py', run_name='__main__')\n")
    raw = _run({"main.py": data, "launch.py": launcher.encode()}, [sandbox_python(), "-I", "-S", "-B", f"{SANDBOX_DIR}/launch.py"],
               timeout_s=timeout_s, memory_mb=memory_mb, cpu_s=timeout_s, max_file_mb=max_file_mb,
               max_procs=max_procs, max_output_bytes=max_output_bytes, tmpfs_mb=tmpfs_mb,
               cgroup_parent=bound.cgroup_parent)
    stderr = _text(clean_traceback(raw.stderr.decode("utf-8", "replace")).encode())
    code = raw.returncode
    # bubblewrap's init exits with 128 + N when the program died of signal N
    died_of = code - 128 if code is not None and code > 128 else None
    if raw.over_memory:
        status, stderr = "memory", stderr + "\n[" + _over_memory_message(memory_mb, tmpfs_mb) + "]"
    elif raw.timed_out or died_of == signal.SIGXCPU:
        status = "timeout"
    elif raw.output_exceeded:
        status, stderr = "failed", stderr + f"\n[the program printed more than {max_output_bytes} bytes and was stopped]"
    elif code == 0:
        status = "passed"
    elif "MemoryError" in stderr or died_of == signal.SIGKILL:
        status = "memory"
    elif died_of is not None:
        status = "crashed"
    else:
        status = "failed"
    failing = failing_line(stderr, program, "main.py", first_test_line) if status in ("failed", "memory") else None
    return SandboxResult(status, code, _text(raw.stdout), stderr, raw.duration_s, failing,
                         {"output_bytes_dropped": raw.output_exceeded, **bound.describe(), **raw.kernel})


def run_checked(spec: dict, candidate: str, *, timeout_s: float = 10.0, memory_mb: int = 1024,
                max_file_mb: int = 16, max_procs: int = CHECKED_MAX_PROCS, max_output_bytes: int = 8 << 20,
                tmpfs_mb: int = 64) -> SandboxResult:
    """Test `candidate` (module source) against `spec` (the benchmark's tests, see supervisor.py) and
    return a verdict the candidate cannot forge: "passed" only when the supervisor's verdict arrives on
    its own descriptor with this run's random token and says so.

    `max_procs` counts every process and thread of the run; the default leaves the candidate none beyond
    its own (under the rlimit bound every process may fill its own address space, so each one allowed is
    another `memory_mb`; every canonical solution of the four benchmarks passes without one)."""
    bound = memory_bound()
    token = secrets.token_hex(32).encode()
    spec = dict(spec, limits={"memory_mb": memory_mb, "cpu_s": timeout_s, "max_procs": max_procs})
    # the tests and the reference solution reach only the checker (a descriptor it reads and closes before
    # the candidate starts), never a file the candidate could read for the expected answers
    files = {"main.py": candidate.encode("utf-8", "surrogateescape"),
             "supervisor.py": (_HELPERS / "supervisor.py").read_bytes(), "worker.py": (_HELPERS / "worker.py").read_bytes(),
             "wire.py": (_HELPERS / "wire.py").read_bytes()}
    raw = _run(files, [sandbox_python(), "-I", "-S", "-B", f"{SANDBOX_DIR}/supervisor.py"], timeout_s=timeout_s,
               memory_mb=memory_mb * 2, cpu_s=timeout_s, max_file_mb=max_file_mb, max_procs=max_procs,
               max_output_bytes=max_output_bytes, tmpfs_mb=tmpfs_mb, cgroup_parent=bound.cgroup_parent,
               run_memory_mb=_run_memory_mb(memory_mb, tmpfs_mb), token=token, secret=json.dumps(spec).encode())
    verdict = parse_verdict(raw.verdict, token)
    found = {**bound.describe(), **raw.kernel}
    if raw.over_memory:
        return SandboxResult("memory", raw.returncode, _text(raw.stdout), _over_memory_message(memory_mb, tmpfs_mb),
                             raw.duration_s, details={"kind": "memory", **found})
    if raw.timed_out or verdict.get("signal") == signal.SIGXCPU:
        return SandboxResult("timeout", raw.returncode, _text(raw.stdout), _text(raw.stderr), raw.duration_s, details=found)
    if raw.output_exceeded:
        return SandboxResult("failed", raw.returncode, _text(raw.stdout), f"the program printed more than {max_output_bytes} bytes and was stopped",
                             raw.duration_s, details={"kind": "output", **found})
    if verdict.get("status") == "passed":
        return SandboxResult("passed", raw.returncode, _text(raw.stdout), _text(raw.stderr), raw.duration_s, details={**verdict, **found})
    kind = verdict.get("kind", "no verdict")
    status = "memory" if kind == "memory" else "failed"
    lines = [verdict.get("message") or ("the test harness gave no verdict (the run was cut short)" if not verdict else "")]
    if verdict.get("traceback"):
        lines.append(clean_traceback(verdict["traceback"]))
    stderr = _text("\n".join(line for line in lines if line).encode())
    return SandboxResult(status, raw.returncode, _text(raw.stdout), stderr, raw.duration_s, verdict.get("failing_test"), {**verdict, **found})


def parse_verdict(data: bytes, token: bytes) -> dict:
    """The supervisor's verdict if `data` is exactly this run's token, a newline and one JSON object; else {}."""
    head, sep, body = data.partition(b"\n")
    if not sep or not secrets.compare_digest(head, token):
        return {}
    try:
        verdict = json.loads(body.decode("utf-8"))
    except (ValueError, UnicodeDecodeError):
        return {}
    return verdict if isinstance(verdict, dict) and verdict.get("status") in ("passed", "failed") else {}
