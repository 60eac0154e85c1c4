"""The pieces of the code sandbox's memory bound on their own: the syscall filter (checked against the
kernel headers, run through a small BPF interpreter for every architecture it knows, and inside a real
sandbox), the cgroup v2 detection (on fake cgroup trees, so it is tested on hosts without one) and the
scratch tmpfs step. The attacks themselves are in test_sandbox_memory.py."""

from __future__ import annotations

import errno
import os
import re
import struct
from pathlib import Path

import pytest

from environments.code import sandbox
from environments.code.sandbox import run_program
from environments.code.sandboxed import cgroup, syscall_filter

ALLOW = 0x7FFF0000


def run_bpf(program: bytes, nr: int, arch: int, args=(0, 0, 0, 0, 0, 0)) -> int:
    """Run a classic-BPF seccomp program over one syscall the way the kernel would; return its verdict."""
    data = struct.pack("<iIQ6Q", nr, arch, 0, *args)
    insns = [struct.unpack_from("<HBBI", program, offset) for offset in range(0, len(program), 8)]
    pc = acc = 0
    for _ in range(len(insns)):  # classic BPF only jumps forward: one pass at most
        code, jt, jf, k = insns[pc]
        if code == 0x20:  # ld [k]
            acc, pc = struct.unpack_from("<I", data, k)[0], pc + 1
        elif code == 0x15:  # jeq k
            pc += 1 + (jt if acc == k else jf)
        elif code == 0x35:  # jge k
            pc += 1 + (jt if acc >= k else jf)
        elif code == 0x06:  # ret k
            return k
        else:
            raise AssertionError(f"unexpected BPF opcode {code:#x}")
    raise AssertionError("the program ran off its end")


@pytest.mark.parametrize("arch", sorted(syscall_filter.DENIED_SYSCALLS))
def test_the_filter_denies_exactly_the_listed_calls(arch):
    program = syscall_filter.build(arch)
    audit = syscall_filter.AUDIT_ARCH[arch]
    denied = syscall_filter.DENIED_SYSCALLS[arch]
    eperm = 0x00050000 | errno.EPERM
    for name, number in denied.items():
        assert run_bpf(program, number, audit) == eperm, name
    fcntl = syscall_filter.FCNTL[arch]
    assert run_bpf(program, fcntl, audit, (3, syscall_filter.F_SETPIPE_SZ, 1 << 20, 0, 0, 0)) == eperm
    assert run_bpf(program, fcntl, audit, (3, 1032, 0, 0, 0, 0)) == ALLOW  # F_GETPIPE_SZ
    allowed = [n for n in range(0, 460) if n not in denied.values()]
    assert all(run_bpf(program, n, audit, (3, 1, 0, 0, 0, 0)) == ALLOW for n in allowed)
    # another ABI's numbers mean other calls: refused outright
    assert run_bpf(program, 0, 0x40000003) == 0x00050000 | errno.ENOSYS  # i386
    if arch == "x86_64":
        assert run_bpf(program, 0x40000000 + 319, audit) == 0x00050000 | errno.ENOSYS  # x32 memfd_create


def _header_numbers(path: Path) -> dict[str, int]:
    text = path.read_text()
    numbers = {name: int(value) for name, value in re.findall(r"#define __NR3264_(\w+) (\d+)", text)}
    for name, value in re.findall(r"#define __NR_(\w+) (\w+)", text):
        if value.isdigit():
            numbers[name] = int(value)
        elif value.startswith("__NR3264_") and value[9:] in numbers:
            numbers[name] = numbers[value[9:]]
    return numbers


@pytest.mark.parametrize("arch, header", [("x86_64", "/usr/include/x86_64-linux-gnu/asm/unistd_64.h"),
                                          ("aarch64", "/usr/include/asm-generic/unistd.h")])
def test_the_syscall_numbers_match_the_kernel_headers(arch, header):
    if not Path(header).exists():
        pytest.skip(f"{header} is not installed (Debian: linux-libc-dev)")
    numbers = _header_numbers(Path(header))
    table = dict(syscall_filter.DENIED_SYSCALLS[arch], fcntl=syscall_filter.FCNTL[arch])
    assert {name: numbers.get(name) for name in table} == table


def test_an_unknown_architecture_gets_a_clear_error():
    with pytest.raises(ValueError, match="no syscall table for architecture 'mips'.*aarch64, x86_64"):
        syscall_filter.build("mips")


@pytest.mark.skipif(not syscall_filter.supported(), reason="no syscall table for this architecture")
def test_inside_the_sandbox_each_listed_call_fails_with_eperm():
    numbers = syscall_filter.DENIED_SYSCALLS[syscall_filter.machine()]
    # harmless arguments: without the filter these calls fail otherwise (EFAULT, EINVAL, EAFNOSUPPORT) or succeed
    program = ("import ctypes, fcntl, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
               f"for name, number in {numbers!r}.items():\n"
               "    ctypes.set_errno(0)\n    result = libc.syscall(number, 0, 0, 0, 0, 0)\n"
               "    print(name, result, ctypes.get_errno())\n"
               "r, w = os.pipe()\nprint('pipe size', fcntl.fcntl(w, 1032))\n"
               "try:\n    fcntl.fcntl(w, 1031, 1 << 20)\n    print('grown')\nexcept OSError as exc:\n    print('grow refused', exc.errno)\n")
    result = run_program(program)
    lines = dict(line.rsplit(" ", 1) for line in result.stdout.splitlines())
    for name in numbers:
        assert lines.get(f"{name} -1") == str(errno.EPERM), result.stdout
    assert lines["pipe size"] == "65536" and lines["grow refused"] == str(errno.EPERM), result.stdout


# ------------------------------------------------------------------------------------ cgroup detection

MOUNTINFO = ("24 1 8:1 / / rw - ext4 /dev/vda rw\n"
             "35 24 0:30 / /sys/fs/cgroup rw,nosuid,nodev,noexec - cgroup2 cgroup2 rw,nsdelegate\n")
HYBRID = ("24 1 8:1 / / rw - ext4 /dev/vda rw\n"
          "40 24 0:33 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n"
          "41 24 0:34 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n")


def test_own_cgroup_is_read_from_mountinfo_and_proc_cgroup():
    mount = cgroup.cgroup2_mount(MOUNTINFO)
    assert mount == (Path("/sys/fs/cgroup"), "/")
    assert cgroup.own_cgroup("0::/user.slice/run.scope\n", mount) == Path("/sys/fs/cgroup/user.slice/run.scope")
    assert cgroup.own_cgroup("0::/\n", mount) == Path("/sys/fs/cgroup")
    assert cgroup.cgroup2_mount(HYBRID) == (Path("/sys/fs/cgroup/unified"), "/")
    # a mount that shows only part of the hierarchy (a container's): paths are relative to its root
    assert cgroup.own_cgroup("0::/docker/abc/job\n", (Path("/sys/fs/cgroup"), "/docker/abc")) == Path("/sys/fs/cgroup/job")
    assert cgroup.own_cgroup("0::/elsewhere\n", (Path("/sys/fs/cgroup"), "/docker/abc")) is None
    assert cgroup.cgroup2_mount("24 1 8:1 / / rw - ext4 /dev/vda rw\n") is None


def _fake_cgroup(folder: Path, controllers: str, subtree: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "cgroup.controllers").write_text(controllers + "\n")
    (folder / "cgroup.subtree_control").write_text(subtree + "\n")
    return folder


def test_a_cgroup_without_the_memory_and_pids_controllers_is_refused_with_the_reason(tmp_path):
    assert "is not a cgroup v2 directory" in cgroup.unusable(tmp_path)
    v1_only = _fake_cgroup(tmp_path / "v1", "hugetlb", "")
    assert "does not offer the memory and pids controller (cgroup.controllers: hugetlb)" in cgroup.unusable(v1_only)
    not_delegated = _fake_cgroup(tmp_path / "nd", "cpu memory pids", "cpu")
    assert "does not hand the memory and pids controller to its children" in cgroup.unusable(not_delegated)


def test_a_named_cgroup_that_cannot_be_used_falls_back_to_rlimits_and_says_why(tmp_path, monkeypatch):
    fake = _fake_cgroup(tmp_path / "job", "cpu io", "")
    monkeypatch.setenv(cgroup.CGROUP_ENV, str(fake))
    parent, why = cgroup.find_parent()
    assert parent is None and f"${cgroup.CGROUP_ENV}={fake} is unusable" in why and "memory and pids" in why
    sandbox.memory_bound.cache_clear()
    try:
        bound = sandbox.memory_bound()
        assert bound.kind == "rlimits" and why in bound.detail
        assert run_program("print(1)").details["memory_bound_detail"] == bound.detail
    finally:
        monkeypatch.undo()
        sandbox.memory_bound.cache_clear()


def test_a_real_run_cgroup_is_made_limited_and_removed():
    parent, why = cgroup.find_parent()
    if parent is None:
        pytest.skip(f"no delegated cgroup v2 on this host: {why}")
    run = cgroup.RunCgroup(parent, memory_bytes=200 << 20, max_tasks=7)
    try:
        assert (run.path / "memory.max").read_text().strip() == str(200 << 20)
        assert (run.path / "pids.max").read_text().strip() == "7"
    finally:
        run.close()
    assert not run.path.exists()


# ------------------------------------------------------------------------------------ the scratch tmpfs step


def test_a_failing_scratch_mount_makes_the_sandbox_unavailable_with_the_reason(monkeypatch, tmp_path):
    monkeypatch.setattr(sandbox, "_scratch_mountpoint", lambda: str(tmp_path / "missing"))
    sandbox.memory_bound.cache_clear()
    try:
        with pytest.raises(sandbox.SandboxUnavailable, match="sandbox scratch tmpfs: .*mount tmpfs"):
            sandbox.check_sandbox()
    finally:
        monkeypatch.undo()
        sandbox.memory_bound.cache_clear()


def test_the_scratch_tmpfs_is_bounded_in_bytes_and_files_and_shared_by_tmp_and_dev_shm():
    result = run_program("import os\nfor where in ('/tmp', '/dev/shm'):\n    st = os.statvfs(where)\n"
                         "    print(where, st.f_blocks * st.f_frsize >> 20, st.f_files, st.f_fsid)\n"
                         "try:\n    open('/dev/x', 'w')\nexcept OSError as exc:\n    print('dev', exc.errno)\n", tmpfs_mb=32)
    rows = {line.split()[0]: line.split()[1:] for line in result.stdout.splitlines()}
    assert rows["/tmp"][:2] == ["32", str(sandbox.TMPFS_INODES)], result.stdout
    assert rows["/dev/shm"] == rows["/tmp"], result.stdout  # one tmpfs: one budget
    assert rows["dev"] == [str(errno.EROFS)], result.stdout  # /dev itself is read-only


def test_a_removed_scratch_folder_is_made_again():
    # a /tmp cleaner may remove the empty folder the scratch tmpfs is mounted over: the next run must not
    # fail for it (a host problem would otherwise read as the candidate's failure)
    assert run_program("print(1)").passed
    os.rmdir(sandbox._scratch_mountpoint())
    result = run_program("print(1)")
    assert result.passed, result


class FakeRunCgroup:
    """Stands in for a run's cgroup on hosts without one: records what the sandbox asks of it; `join`
    writes to a plain file as it would to cgroup.procs, and the kernel's record is whatever the test says."""

    made: list = []
    record: dict = {}

    def __init__(self, parent, memory_bytes, max_tasks):
        self.parent, self.memory_bytes, self.max_tasks, self.closed = parent, memory_bytes, max_tasks, False
        self.procs = parent / f"procs-{len(FakeRunCgroup.made)}"
        self.procs_fd = os.open(self.procs, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC)
        FakeRunCgroup.made.append(self)

    def join(self):
        os.write(self.procs_fd, b"0")

    def outcome(self):
        return dict(FakeRunCgroup.record)

    def close(self):
        os.close(self.procs_fd)
        self.closed = True


def test_in_cgroup_mode_each_run_joins_its_cgroup_and_an_oom_kill_is_a_memory_verdict(monkeypatch, tmp_path):
    monkeypatch.setattr(sandbox.cgroup, "RunCgroup", FakeRunCgroup)
    monkeypatch.setattr(sandbox, "memory_bound", lambda: sandbox.MemoryBound("cgroup", "fake", tmp_path))
    FakeRunCgroup.made, FakeRunCgroup.record = [], {"oom_kills": 0, "memory_peak_mb": 31.5}
    result = run_program("print('hi')", memory_mb=300, tmpfs_mb=32, max_procs=6)
    run = FakeRunCgroup.made[-1]
    assert result.passed and result.details["memory_bound"] == "cgroup" and result.details["memory_peak_mb"] == 31.5
    assert run.memory_bytes == (300 + 32 + sandbox.RUN_OVERHEAD_MB) << 20 and run.max_tasks == 7 and run.closed
    assert run.procs.read_bytes() == b"0"  # the run's first process moved itself in, before bubblewrap started
    # the kernel stopped the run at memory.max: whatever the program printed or returned, the verdict is "memory"
    FakeRunCgroup.record = {"oom_kills": 1, "memory_peak_mb": 364.0}
    result = run_program("print('hi')", memory_mb=300, tmpfs_mb=32)
    assert result.status == "memory" and "memory limit (588 MB for the whole run" in result.stderr, result
    spec = {"kind": "mbpp", "tests": ["assert add_one(1) == 2"], "setup": "", "reference_names": ["add_one"]}
    result = sandbox.run_checked(spec, "def add_one(x):\n    return x + 1\n", memory_mb=300, tmpfs_mb=32)
    assert result.status == "memory" and "memory limit" in result.stderr and result.details["memory_peak_mb"] == 364.0
    assert FakeRunCgroup.made[-1].memory_bytes == (300 + 32 + sandbox.RUN_OVERHEAD_MB) << 20  # not the checker's 2x
