"""Host side, between the host and bubblewrap: give the run a scratch tmpfs bounded in bytes AND in files.

Why: bubblewrap's `--size` bounds a tmpfs's bytes only. Empty files, directories and links take no
bytes but each costs the kernel an inode and a dentry (about 1 KB): a program creating empty files for 8 s
of CPU held 1 GB of kernel memory in a 64 MB tmpfs (measured, 1,039,000 files). The tmpfs option
`nr_inodes` bounds that, and bubblewrap cannot pass it; so this step mounts the tmpfs itself, in a user
and mount namespace of its own (no privileges needed, nothing changes in the host's mount table), with
`size=` and `nr_inodes=`, makes the folders `tmp` and `shm` on it, and then becomes bubblewrap, which
binds them as the sandbox's /tmp and /dev/shm: one budget for both.

    python3 -I -S -c SOURCE SIZE_BYTES INODES MOUNTPOINT BWRAP [BWRAP_ARGS...]

Runs with the run's rlimits already set (and as the unprivileged sandbox uid when the host is root).
Stdlib only, no site packages: it runs under the sandbox's /usr/bin/python3.
"""

import ctypes
import os
import sys

CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000
MS_NOSUID, MS_NODEV, MS_REC, MS_PRIVATE = 0x2, 0x4, 0x4000, 0x40000


def _check(result, what):
    if result != 0:
        code = ctypes.get_errno()
        raise OSError(code, "%s: %s" % (what, os.strerror(code)))


def main():
    size, inodes, mountpoint, command = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4:]
    libc = ctypes.CDLL(None, use_errno=True)
    uid, gid = os.getuid(), os.getgid()
    _check(libc.unshare(CLONE_NEWUSER | CLONE_NEWNS), "unshare(user, mount namespaces)")
    for name, text in (("setgroups", "deny"), ("uid_map", "0 %d 1" % uid), ("gid_map", "0 %d 1" % gid)):
        with open("/proc/self/" + name, "w") as handle:
            handle.write(text)
    # nothing mounted here may propagate back to the host's namespace
    _check(libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None), "make / private")
    options = "size=%d,nr_inodes=%d,mode=0755" % (size, inodes)
    _check(libc.mount(b"tmpfs", mountpoint.encode(), b"tmpfs", MS_NOSUID | MS_NODEV, options.encode()),
           "mount tmpfs (%s) on %s" % (options, mountpoint))
    for folder in ("tmp", "shm"):
        os.mkdir(os.path.join(mountpoint, folder), 0o755)
    os.execv(command[0], command)


try:
    main()
except OSError as exc:
    sys.stderr.write("sandbox scratch tmpfs: %s\n" % exc)
    sys.exit(125)
