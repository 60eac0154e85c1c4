"""The bubblewrap sandbox contains what generated code does, and the host survives all of it
(the escape attempts are in test_hostile_code.py)."""

from __future__ import annotations

import os
import socket
import threading

import pytest

from environments.code.sandbox import run_program


def test_passing_program_and_output_capture():
    result = run_program("print('hello')")
    assert result.status == "passed" and result.returncode == 0
    assert result.stdout.strip() == "hello"
    assert result.duration_s > 0


def test_failing_assert_reports_the_failing_line_and_a_clean_traceback():
    program = "def f(x):\n    return x + 1\n\nassert f(1) == 2\nassert f(2) == 4\n"
    result = run_program(program)
    assert result.status == "failed"
    assert result.failing_test == "assert f(2) == 4"
    assert "AssertionError" in result.stderr
    assert "/sandbox/launch.py" not in result.stderr and "runpy" not in result.stderr


def test_infinite_loop_times_out_and_is_killed():
    result = run_program("while True:\n    pass\n", timeout_s=1.5)
    assert result.status == "timeout"
    assert result.duration_s < 1.5 + 30  # generous: a loaded 2-core machine can be slow to start and to kill


def test_memory_bomb_is_stopped():
    result = run_program("blocks = []\nwhile True:\n    blocks.append(bytearray(50 * 1024 * 1024))\n", memory_mb=256, timeout_s=10)
    assert result.status == "memory"


def test_write_outside_the_temp_dir_fails_and_inside_works(tmp_path):
    # the host's folders are not in the sandbox's file system at all; its /tmp is a private tmpfs
    target = tmp_path / "escaped.txt"
    result = run_program(f"open({str(target)!r}, 'w').write('x')\n")
    assert result.status == "failed" and "FileNotFoundError" in result.stderr
    assert not target.exists()
    victim = tmp_path / "keep.txt"
    victim.write_text("keep")
    result = run_program(f"import os\nos.remove({str(victim)!r})\n")
    assert result.status == "failed" and victim.exists()
    result = run_program("open('/usr/evil', 'w')\n")
    assert result.status == "failed" and "Read-only file system" in result.stderr
    result = run_program("open('scratch.txt', 'w').write('ok')\nprint(open('scratch.txt').read())\n")
    assert result.status == "passed" and result.stdout.strip() == "ok"


def test_network_connection_fails():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]
    try:
        program = f"import socket\ns = socket.create_connection(('127.0.0.1', {port}), timeout=3)\nprint('connected')\n"
        result = run_program(program)
        assert result.status == "failed" and "connected" not in result.stdout
        # the run's own network namespace has only a loopback: no interface that reaches anything
        result = run_program("print(open('/proc/net/dev').read())")
        interfaces = [line.split(":")[0].strip() for line in result.stdout.splitlines() if ":" in line]
        assert interfaces == ["lo"]
    finally:
        server.close()


def test_fork_bomb_is_contained_and_host_survives():
    before = threading.active_count()
    result = run_program("import os\nwhile True:\n    os.fork()\n", timeout_s=5)
    assert result.status in ("failed", "timeout")
    # processes may start inside the sandbox (up to the process limit) and see only the sandbox
    result = run_program("import subprocess\nprint(subprocess.run(['ls', '/'], capture_output=True, text=True).stdout)\n")
    assert result.status == "passed" and set(result.stdout.split()) == {"bin", "dev", "lib", "lib64", "proc", "sandbox", "tmp", "usr"}
    # the host is alive and can still run programs
    assert run_program("print(2 + 2)").stdout.strip() == "4"
    assert threading.active_count() == before
    assert os.getpid() > 0


def test_exit_codes_and_crash_are_classified():
    assert run_program("import sys\nsys.exit(3)\n").status == "failed"
    assert run_program("import os, signal\nos.abort()\n").status == "crashed"


