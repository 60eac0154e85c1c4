"""Host side: the seccomp filter bubblewrap installs in the sandbox (`bwrap --seccomp FD`).

Why a filter: rlimits bound a process's address space and each file's size, but several kernel objects
hold memory that no rlimit counts and that outlives every mapping: a memfd's pages (RLIMIT_FSIZE caps one
memfd, not how many a process keeps), SysV shared memory, message queues and semaphore sets (they live in
the IPC namespace, not in any process), socket buffers (a listener's queue of never-accepted connections
holds data with no descriptor in the sandbox), io_uring rings, BPF maps, perf buffers, inotify watches,
and pipes grown with F_SETPIPE_SZ. Nor may one process of the run make another one hold memory for it:
ptrace, process_vm_readv/writev and pidfd_getfd are refused too (measured: the candidate could attach to
bubblewrap's init, whose address space limit is the checker's). The candidate needs none of these, so they
fail with EPERM; what is left (anonymous memory, files in the sized tmpfs, 64 KB pipes) is bounded by
rlimits and the tmpfs. Where a cgroup bounds the run the filter stays: a program behaves the same on every host.

The program is classic BPF, built here (no libseccomp needed): check the architecture, deny the listed
syscall numbers, deny F_SETPIPE_SZ, allow the rest. Syscalls of another ABI (x32, i386 compat) are denied
outright, so numbers from another table cannot slip past the list.
"""

from __future__ import annotations

import errno
import platform
import struct

# syscall numbers per architecture (Linux uapi: arch/x86/entry/syscalls/syscall_64.tbl, asm-generic/unistd.h)
DENIED_SYSCALLS = {
    "x86_64": {"memfd_create": 319, "memfd_secret": 447, "shmget": 29, "msgget": 68, "semget": 64, "socket": 41,
               "socketpair": 53, "io_uring_setup": 425, "bpf": 321, "perf_event_open": 298, "inotify_init": 253,
               "inotify_init1": 294, "ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311,
               "pidfd_getfd": 438},
    "aarch64": {"memfd_create": 279, "memfd_secret": 447, "shmget": 194, "msgget": 186, "semget": 190, "socket": 198,
                "socketpair": 199, "io_uring_setup": 425, "bpf": 280, "perf_event_open": 241, "inotify_init1": 26,
                "ptrace": 117, "process_vm_readv": 270, "process_vm_writev": 271, "pidfd_getfd": 438},
}
FCNTL = {"x86_64": 72, "aarch64": 25}
AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
X32_SYSCALL_BIT = 0x40000000  # x86_64: syscalls of the x32 ABI carry this bit
F_SETPIPE_SZ = 1031

# classic BPF opcodes and seccomp return values (linux/filter.h, linux/seccomp.h)
_LD_W_ABS = 0x20
_JEQ_K = 0x15
_JGE_K = 0x35
_RET_K = 0x06
_RET_ALLOW = 0x7FFF0000
_RET_ERRNO = 0x00050000
# offsets in struct seccomp_data: int nr; u32 arch; u64 instruction_pointer; u64 args[6] (little-endian)
_NR, _ARCH, _ARG1_LOW = 0, 4, 16 + 8


def machine() -> str:
    """This host's architecture name as the tables above spell it."""
    name = platform.machine().lower()
    return {"amd64": "x86_64", "arm64": "aarch64"}.get(name, name)


def supported(arch: str | None = None) -> bool:
    return (arch or machine()) in DENIED_SYSCALLS


def _insn(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("<HBBI", code, jt, jf, k)


def build(arch: str | None = None) -> bytes:
    """The filter for `arch` (default: this host) as bytes for `bwrap --seccomp`; ValueError if unknown."""
    arch = arch or machine()
    if arch not in DENIED_SYSCALLS:
        raise ValueError(f"no syscall table for architecture {arch!r} (known: {', '.join(sorted(DENIED_SYSCALLS))})")
    deny = _RET_ERRNO | errno.EPERM
    program = [_insn(_LD_W_ABS, _ARCH),
               _insn(_JEQ_K, AUDIT_ARCH[arch], jt=1),  # our ABI: go on; another ABI: the next instruction
               _insn(_RET_K, _RET_ERRNO | errno.ENOSYS),
               _insn(_LD_W_ABS, _NR)]
    if arch == "x86_64":
        program += [_insn(_JGE_K, X32_SYSCALL_BIT, jf=1), _insn(_RET_K, _RET_ERRNO | errno.ENOSYS)]
    for number in sorted(DENIED_SYSCALLS[arch].values()):
        program += [_insn(_JEQ_K, number, jf=1), _insn(_RET_K, deny)]
    program += [_insn(_JEQ_K, FCNTL[arch], jf=3),  # fcntl: only F_SETPIPE_SZ is refused
                _insn(_LD_W_ABS, _ARG1_LOW),
                _insn(_JEQ_K, F_SETPIPE_SZ, jf=1),
                _insn(_RET_K, deny),
                _insn(_RET_K, _RET_ALLOW)]
    return b"".join(program)
