"""Host side: one cgroup v2 per sandbox run, where the host delegates a cgroup with the memory and pids
controllers.

Why: rlimits bound each process on its own (address space, file size, open files); a cgroup bounds the
run as a whole, whatever holds the memory: anonymous pages of any number of processes, tmpfs and memfd
pages, pipe and socket buffers, and the kernel's own objects for the run (cgroup v2 charges them all to
the cgroup of the process that allocated them). So where one is available each run gets its own child
cgroup with `memory.max` (the whole run), `memory.swap.max` 0 (no escape to swap), `memory.oom.group` 1
(over the limit the whole run ends, so the verdict cannot come from a half-killed run) and `pids.max`;
`memory.peak` then reports what the run actually held.

Where the cgroup comes from, checked at run time:
  1. `$AGENTGYM_SANDBOX_CGROUP`: a cgroup v2 directory this user may create children in (a systemd
     unit with `Delegate=yes`, or a folder an administrator made and chowned), or
  2. this process's own cgroup, when it already hands memory and pids to its children
     (`cgroup.subtree_control`), as a process in the root cgroup of a machine or VM sees.
Neither (cgroup v1 only, a container without a delegated cgroup, no write permission): `find_parent`
returns None and the reason, and the sandbox bounds memory with rlimits alone (see sandbox.py).
cgroup v1 is not used: it does not charge kernel memory reliably and is deprecated upstream.
"""

from __future__ import annotations

import logging
import os
import secrets
import time
from pathlib import Path

CGROUP_ENV = "AGENTGYM_SANDBOX_CGROUP"
CONTROLLERS = ("memory", "pids")
LOG = logging.getLogger(__name__)


def _read(path: Path) -> str:
    return path.read_text().strip()


def cgroup2_mount(mountinfo: str | None = None) -> tuple[Path, str] | None:
    """(mount point, root inside the hierarchy) of the first cgroup2 mount in /proc/self/mountinfo."""
    if mountinfo is None:
        try:
            mountinfo = Path("/proc/self/mountinfo").read_text()
        except OSError:
            return None
    for line in mountinfo.splitlines():
        fields, _, rest = line.partition(" - ")
        parts = fields.split()
        if rest.split()[:1] == ["cgroup2"] and len(parts) >= 5:
            return Path(parts[4]), parts[3]
    return None


def own_cgroup(proc_cgroup: str | None = None, mount: tuple[Path, str] | None = None) -> Path | None:
    """This process's cgroup v2 directory (the `0::` line of /proc/self/cgroup under the cgroup2 mount)."""
    mount = mount if mount is not None else cgroup2_mount()
    if mount is None:
        return None
    if proc_cgroup is None:
        try:
            proc_cgroup = Path("/proc/self/cgroup").read_text()
        except OSError:
            return None
    point, root = mount
    for line in proc_cgroup.splitlines():
        if line.startswith("0::"):
            path = line[3:].strip()
            relative = os.path.relpath(path, root) if root != "/" else path.lstrip("/")
            if relative.startswith(".."):
                return None  # our cgroup lies outside what this mount shows
            return point / relative if relative not in ("", ".") else point
    return None


def unusable(parent: Path, may_enable: bool = False) -> str | None:
    """Why runs cannot get child cgroups of `parent` with memory.max and pids.max, or None if they can.
    With `may_enable` (a cgroup the user named for this), enables the two controllers in `parent`'s
    subtree_control where they are off (the kernel refuses that where `parent` holds processes itself)."""
    if not (parent / "cgroup.controllers").is_file():
        return f"{parent} is not a cgroup v2 directory"
    try:
        enabled = set(_read(parent / "cgroup.subtree_control").split())
        missing = [c for c in CONTROLLERS if c not in enabled]
        if missing:
            available = set(_read(parent / "cgroup.controllers").split())
            if any(c not in available for c in missing):
                return f"{parent} does not offer the {' and '.join(missing)} controller (cgroup.controllers: {' '.join(sorted(available)) or 'none'})"
            if not may_enable:
                return f"{parent} does not hand the {' and '.join(missing)} controller to its children (cgroup.subtree_control)"
            (parent / "cgroup.subtree_control").write_text(" ".join("+" + c for c in missing))
        probe = RunCgroup(parent, memory_bytes=64 << 20, max_tasks=8)
        probe.close()
    except OSError as exc:
        return f"cannot set up a child cgroup of {parent}: {exc.strerror or exc}"
    return None


def find_parent() -> tuple[Path | None, str]:
    """The delegated cgroup to make run cgroups in, and a sentence saying which one or why there is none."""
    explicit = os.environ.get(CGROUP_ENV)
    if explicit:
        why = unusable(Path(explicit), may_enable=True)
        return (None, f"${CGROUP_ENV}={explicit} is unusable: {why}") if why else (Path(explicit), f"${CGROUP_ENV} ({explicit})")
    own = own_cgroup()
    if own is None:
        return None, "no cgroup v2 hierarchy holds this process (cgroup v1 only, or none mounted)"
    why = unusable(own)
    if why:
        return None, f"this process's cgroup is not delegated for children: {why}; set ${CGROUP_ENV} to a delegated cgroup v2 directory"
    return own, f"this process's cgroup ({own})"


class RunCgroup:
    """One run's cgroup under `parent`: made by the constructor, joined by the run's first process
    (`join`, from bubblewrap's preexec_fn), emptied and removed by `close`."""

    def __init__(self, parent: Path, memory_bytes: int, max_tasks: int):
        self.path = parent / f"agentgym-sandbox-{os.getpid()}-{secrets.token_hex(6)}"
        self.path.mkdir()
        self.procs_fd = -1
        try:
            (self.path / "memory.max").write_text(str(memory_bytes))
            (self.path / "pids.max").write_text(str(max_tasks))
            for name, value in (("memory.swap.max", "0"), ("memory.oom.group", "1")):
                if (self.path / name).exists():  # absent without swap accounting / before Linux 4.19
                    (self.path / name).write_text(value)
            self.procs_fd = os.open(self.path / "cgroup.procs", os.O_WRONLY | os.O_CLOEXEC)
        except BaseException:
            self.close()
            raise

    def join(self) -> None:
        """Move the calling process into this cgroup. Safe between fork and exec: one write(2)."""
        os.write(self.procs_fd, b"0")

    def outcome(self) -> dict:
        """What the kernel recorded: the run's memory peak (MB, Linux 5.19+), OOM kills, refused forks."""
        report: dict = {}
        try:
            report["memory_peak_mb"] = round(int(_read(self.path / "memory.peak")) / (1 << 20), 1)
        except (OSError, ValueError):
            pass
        report["oom_kills"] = _event(self.path / "memory.events", "oom_kill") + _event(self.path / "memory.events", "oom_group_kill")
        report["forks_refused"] = _event(self.path / "pids.events", "max")
        return report

    def close(self, wait_s: float = 10.0) -> None:
        """Kill what is left in the cgroup and remove it (a cgroup with processes cannot be removed)."""
        if self.procs_fd >= 0:
            os.close(self.procs_fd)
            self.procs_fd = -1
        try:
            if (self.path / "cgroup.kill").exists():
                (self.path / "cgroup.kill").write_text("1")
        except OSError:
            pass
        deadline = time.monotonic() + wait_s
        while True:
            try:
                self.path.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError as exc:
                if time.monotonic() > deadline:
                    LOG.warning("could not remove the sandbox cgroup %s: %s", self.path, exc)
                    return
                time.sleep(0.05)


def _event(path: Path, key: str) -> int:
    try:
        for line in path.read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == key:
                return int(value)
    except (OSError, ValueError):
        pass
    return 0
