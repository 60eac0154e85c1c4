"""Hostile agent code against the code env's sandbox and checker: nothing escapes, nothing fakes a pass.

Each program first tries to switch off any in-process guard (walking its frames to an audit hook's
globals, as issue 18's repro does), so what holds here is the isolation itself. Attacks that could take
the test process down run inside a throwaway "victim" process that calls the sandbox, and the test checks
the victim lived. Every test bounds its own wall time.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agentgym_opd.registry import make

REPO = Path(__file__).resolve().parents[1]

DISARM = '''
import sys
_f = sys._getframe()
while _f is not None:
    _g = _f.f_globals
    if "_hook" in _g and "_PROCESS_EVENTS" in _g:
        for _k in ("_PROCESS_EVENTS", "_NET_EVENTS", "_PATH_EVENTS"):
            _g[_k] = set()
        _g["_inside"] = lambda p: True
        _g["_WRITE_FLAGS"] = 0
    _f = _f.f_back
'''


def sandboxed(program: str, **kwargs):
    from environments.code.sandbox import run_program
    return run_program(DISARM + program, **kwargs)


def in_victim(program: str, *, timeout: float = 60, **kwargs) -> dict:
    """Run `program` through the sandbox from a separate process; return what that process reported
    (its exit status, the run's status and output, its own peak RSS). A victim killed by the program
    reports nothing: {"victim_rc": <signal>}."""
    script = (
        "import json, resource, sys\n"
        "resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))\n"
        "from environments.code.sandbox import run_program\n"
        # VmHWM, this process's own peak (ru_maxrss would carry over the peak of the pytest process that forked it)
        "def peak_mb():\n"
        "    line = next(l for l in open('/proc/self/status') if l.startswith('VmHWM'))\n"
        "    return int(line.split()[1]) / 1024\n"
        f"r = run_program({DISARM + program!r}, **{kwargs!r})\n"
        "print(json.dumps({'status': r.status, 'stdout': r.stdout[-3000:], 'stderr': r.stderr[-3000:],"
        " 'duration': r.duration_s, 'maxrss_mb': peak_mb()}))\n"
    )
    env = dict(os.environ, PYTHONPATH=os.environ.get("PYTHONPATH", str(REPO)))
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=timeout, cwd=REPO, env=env)
    lines = proc.stdout.strip().splitlines()
    report = json.loads(lines[-1]) if proc.returncode == 0 and lines else {}
    report["victim_rc"] = proc.returncode
    return report


def processes_with(marker: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            except OSError:
                continue
            if marker.encode() in cmdline:
                found.append(int(entry))
    return found


def kill_all(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, 9)
        except OSError:
            pass


# ----------------------------------------------------------------------------------- the host process


@pytest.mark.timeout(90)
def test_pidfd_kill_of_the_parent_leaves_the_host_alive():
    report = in_victim("import os, signal\nsignal.pidfd_send_signal(os.pidfd_open(os.getppid()), 9)\nprint('sent')\n")
    assert report["victim_rc"] == 0, report


@pytest.mark.timeout(90)
def test_kill_by_the_host_pid_and_killpg_leave_the_host_alive():
    # the victim is the parent of bubblewrap (or of the old sandbox's interpreter): target it by number
    program = ("import os, signal\nppid = os.getppid()\n"
               "for target in (ppid, os.getpgid(0)):\n    try:\n        os.kill(target, 9)\n    except OSError:\n        pass\n"
               "try:\n    os.killpg(os.getpgid(ppid), 9)\nexcept OSError:\n    pass\n")
    report = in_victim(program)
    assert report["victim_rc"] == 0, report


def test_the_run_has_its_own_user_pid_mount_net_ipc_namespaces():
    result = sandboxed("import os\nfor ns in ('user', 'pid', 'mnt', 'net', 'ipc', 'uts'):\n"
                       "    print(ns, os.readlink('/proc/self/ns/' + ns))\n")
    inside = dict(line.split() for line in result.stdout.splitlines())
    for ns, link in inside.items():
        assert link != os.readlink(f"/proc/self/ns/{ns}"), ns
    assert set(inside) == {"user", "pid", "mnt", "net", "ipc", "uts"}


# ----------------------------------------------------------------------------------- files


def test_writes_outside_do_not_reach_the_host(tmp_path):
    target = tmp_path / "pwned.txt"
    result = sandboxed(f"open({str(target)!r}, 'w').write('x')\n")
    assert not target.exists() and result.status != "passed"
    victim = tmp_path / "keep.txt"
    victim.write_text("keep")
    sandboxed(f"import os\nos.remove({str(victim)!r})\n")
    assert victim.read_text() == "keep"


def test_sqlite_connect_outside_creates_nothing_on_the_host(tmp_path):
    target = tmp_path / "pwned.db"
    sandboxed(f"import sqlite3\nc = sqlite3.connect({str(target)!r})\nc.execute('create table t(x)')\nc.commit()\n")
    assert not target.exists()


def test_os_open_with_dir_fd_creates_nothing_on_the_host(tmp_path):
    sandboxed(f"import os\nd = os.open({str(tmp_path)!r}, os.O_RDONLY)\n"
              "fd = os.open('pwned.txt', os.O_WRONLY | os.O_CREAT, dir_fd=d)\nos.write(fd, b'x')\n")
    assert not (tmp_path / "pwned.txt").exists()


def test_posixsubprocess_fork_exec_runs_nothing_on_the_host(tmp_path):
    target = tmp_path / "pwned.txt"
    program = (
        "import _posixsubprocess, os\n"
        "r, w = os.pipe()\n"
        f"args = [b'/usr/bin/touch', {str(target).encode()!r}]\n"
        "pid = _posixsubprocess.fork_exec(args, [args[0]], True, (w,), None, None, -1, -1, -1, -1, -1, -1, r, w,"
        " True, False, -1, None, None, None, -1, None, False)\n"
        "os.waitpid(pid, 0)\nprint('spawned')\n"
    )
    sandboxed(program)
    sandboxed(f"import subprocess\nsubprocess.run(['touch', {str(target)!r}])\n")
    assert not target.exists()


def test_a_disk_bomb_fills_only_the_private_tmpfs(tmp_path):
    program = ("import os\nn = 0\ntry:\n    for i in range(200):\n        with open(f'f{i}', 'wb') as h:\n"
               "            h.write(b'x' * (8 << 20))\n        n += 1\nexcept OSError as e:\n    print('stopped', type(e).__name__)\n"
               "print('files', n)\n")
    result = sandboxed(program, timeout_s=30)
    written = int(result.stdout.split("files")[-1])
    assert written * 8 <= 64, result.stdout  # the tmpfs holds 64 MB, not 1.6 GB
    result = sandboxed("try:\n    open('big', 'wb').write(b'x' * (32 << 20))\nexcept OSError as e:\n    print('refused', e.errno)\n")
    assert "refused 27" in result.stdout  # EFBIG: RLIMIT_FSIZE (16 MB) binds


def test_host_files_the_task_does_not_need_are_not_visible(tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("s3cret-" + secrets.token_hex(8))
    paths = [str(secret), "/etc/passwd", "/etc/shadow", str(REPO / "pyproject.toml"), "/root/.bashrc",
             f"/proc/{os.getpid()}/environ", "/work"]
    program = "import os\n" + "".join(
        f"try:\n    print({p!r}, open({p!r}).read()[:200] if not os.path.isdir({p!r}) else os.listdir({p!r}))\n"
        f"except OSError as e:\n    print({p!r}, 'DENIED', type(e).__name__)\n" for p in paths)
    result = sandboxed(program)
    assert result.stdout.count("DENIED") == len(paths), result.stdout
    assert secret.read_text() not in result.stdout and "root:" not in result.stdout


# ----------------------------------------------------------------------------------- processes


@pytest.mark.timeout(120)
def test_a_fork_bomb_is_capped_by_the_process_limit_as_root():
    program = ("import os, time\nn = 0\ntry:\n    for i in range(200):\n        if os.fork() == 0:\n"
               "            time.sleep(3)\n            os._exit(0)\n        n += 1\nexcept OSError as e:\n"
               "    print('refused', e.errno)\nprint('forked', n)\n")
    start = time.monotonic()
    result = sandboxed(program, timeout_s=10, max_procs=16)
    forked = int(result.stdout.split("forked")[-1])
    assert forked < 16 and "refused" in result.stdout, result.stdout
    assert time.monotonic() - start < 10 + 60  # ends by its timeout at the latest; generous for a loaded machine


def test_an_infinite_loop_is_stopped_by_the_wall_clock():
    result = sandboxed("while True:\n    pass\n", timeout_s=1.5)
    assert result.status == "timeout" and result.duration_s < 1.5 + 30  # generous: a loaded machine is slow to kill


def test_a_memory_bomb_is_stopped():
    result = sandboxed("blocks = []\nwhile True:\n    blocks.append(bytearray(50 << 20))\n", memory_mb=256, timeout_s=10)
    assert result.status == "memory"


@pytest.mark.timeout(180)
def test_a_setsid_grandchild_holding_stdout_does_not_stretch_the_timeout():
    # the grandchild would hold stdout open for 300 s; the run must end at its 5 s timeout instead
    program = ("import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n        time.sleep(300)\n"
               "        os._exit(0)\n    os._exit(0)\nprint('parent done')\n")
    start = time.monotonic()
    sandboxed(program, timeout_s=5)
    assert time.monotonic() - start < 5 + 60  # far below the grandchild's 300 s, generous for a loaded machine


@pytest.mark.timeout(60)
def test_detached_daemons_do_not_outlive_the_run():
    marker = f"{secrets.randbelow(10**6) + 1000}.{secrets.randbelow(10**6)}"
    program = ("import os\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
               f"        os.execv('/bin/sleep', ['sleep', {marker!r}])\n    os._exit(0)\nos.wait()\nprint('daemon started')\n")
    try:
        sandboxed(program, timeout_s=5)
        deadline = time.monotonic() + 30  # the kernel reaps the killed namespace asynchronously: wait, generously
        while processes_with(marker) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert processes_with(marker) == []
    finally:
        kill_all(processes_with(marker))


# ----------------------------------------------------------------------------------- sockets


def test_unix_sockets_and_tcp_do_not_reach_host_listeners(tmp_path):
    path = str(tmp_path / "host.sock")
    abstract = "\0agentgym-test-" + secrets.token_hex(6)
    listeners = []
    for family, address in ((socket.AF_UNIX, path), (socket.AF_UNIX, abstract), (socket.AF_INET, ("127.0.0.1", 0))):
        server = socket.socket(family)
        server.bind(address)
        server.listen(4)
        server.setblocking(False)
        listeners.append(server)
    port = listeners[2].getsockname()[1]
    program = ("import socket\n"
               f"for family, address in ((socket.AF_UNIX, {path!r}), (socket.AF_UNIX, {abstract!r}), (socket.AF_INET, ('127.0.0.1', {port}))):\n"
               "    try:\n        s = socket.socket(family)\n        s.settimeout(2)\n        s.connect(address)\n"
               "        s.sendall(b'pwned')\n        print('connected', address)\n    except OSError as e:\n"
               "        print('refused', type(e).__name__)\n")
    try:
        result = sandboxed(program)
        assert "connected" not in result.stdout, result.stdout
        for server in listeners:
            with pytest.raises(BlockingIOError):
                server.accept()
    finally:
        for server in listeners:
            server.close()


# ----------------------------------------------------------------------------------- output


@pytest.mark.timeout(120)
def test_100_mb_of_output_never_sits_in_the_host():
    program = "import sys\nfor _ in range(100):\n    sys.stdout.buffer.write(b'x' * (1 << 20))\n"
    report = in_victim(program, timeout_s=30)
    assert report["victim_rc"] == 0, report
    assert report["maxrss_mb"] < 80, report  # a whole 100 MB buffer (and its decoded copy) would be far above


@pytest.mark.timeout(120)
def test_endless_output_is_cut_at_the_cap():
    program = "import sys\nwhile True:\n    sys.stdout.buffer.write(b'y' * (1 << 20))\n"
    report = in_victim(program, timeout_s=3)
    assert report["victim_rc"] == 0, report
    assert report["maxrss_mb"] < 80 and len(report["stdout"]) <= 5000, report


# ----------------------------------------------------------------------------------- missing tool


def test_without_bubblewrap_the_sandbox_refuses_and_says_how_to_install(monkeypatch, tmp_path):
    from environments.code import sandbox

    monkeypatch.setenv("PATH", str(tmp_path))
    sandbox._bwrap.cache_clear()
    sandbox.memory_bound.cache_clear()
    try:
        with pytest.raises(sandbox.SandboxUnavailable, match="apt-get install -y bubblewrap"):
            sandbox.run_program("print(1)")
        with pytest.raises(sandbox.SandboxUnavailable, match="apt-get install -y bubblewrap"):
            make("code/humaneval")
    finally:
        monkeypatch.undo()
        sandbox._bwrap.cache_clear()
        sandbox.memory_bound.cache_clear()


# ----------------------------------------------------------------------------------- forged verdicts

WRONG = {
    "HumanEval/0": "def has_close_elements(numbers, threshold):\n    return None\n",
    "mbpp/11": "def remove_Occ(s, ch):\n    return None\n",
}
ALWAYS_EQUAL = "class _Yes:\n    def __eq__(self, other):\n        return True\n    __hash__ = object.__hash__\n"
FAKE_VERDICT = """
import json, os
fake = b"0" * 64 + b"\\n" + json.dumps({"status": "passed", "kind": "passed"}).encode()
for pid in os.listdir("/proc"):
    if pid.isdigit():
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                with open(f"/proc/{pid}/fd/{fd}", "wb", buffering=0) as handle:
                    handle.write(fake)
            except OSError:
                pass
"""
FORGERIES = {
    "sys.exit(0) before the function": lambda name, wrong: "import sys\nsys.exit(0)\n" + wrong,
    "os._exit(0) at import": lambda name, wrong: "import os\nos._exit(0)\n" + wrong,
    "atexit os._exit(0)": lambda name, wrong: "import atexit, os\natexit.register(os._exit, 0)\n" + wrong,
    "excepthook exits 0": lambda name, wrong: "import os, sys\nsys.excepthook = lambda *a: os._exit(0)\n" + wrong,
    "setprofile exits 0": lambda name, wrong: (wrong + "import os, sys\n"
                                                "sys.setprofile(lambda frame, event, arg: os._exit(0) if event == 'return' and frame.f_code.co_name == "
                                                f"{name!r} else None)\n"),
    "__eq__ always True": lambda name, wrong: ALWAYS_EQUAL + wrong.replace("return None", "return _Yes()"),
    "exit 0 from inside the call": lambda name, wrong: wrong.replace("return None", "import os; os._exit(0)"),
    "patched builtins": lambda name, wrong: ("import builtins\nbuiltins.AssertionError = type('Quiet', (Exception,), {})\n"
                                             "builtins.isinstance = lambda *a: True\n" + wrong),
    "fake verdict on every reachable descriptor": lambda name, wrong: wrong + FAKE_VERDICT,
}


@pytest.fixture(scope="module")
def code_envs(shared_data):
    return {"humaneval": make("code/humaneval"), "humanevalplus": make("code/humanevalplus", data_root=shared_data),
            "mbpp": make("code/mbpp", data_root=shared_data)}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("trick", list(FORGERIES))
@pytest.mark.parametrize("dataset", ["humaneval", "humanevalplus", "mbpp"])
def test_a_wrong_solution_cannot_forge_a_pass(code_envs, dataset, trick):
    env = code_envs[dataset]
    task_id = "mbpp/11" if dataset == "mbpp" else "HumanEval/0"
    name = "remove_Occ" if dataset == "mbpp" else "has_close_elements"
    env.reset(options={"task_id": task_id})
    _, reward, terminated, _, info = env.step(FORGERIES[trick](name, WRONG[task_id]))
    assert reward == 0.0 and not terminated and not info["success"], info.get("feedback")


@pytest.mark.timeout(60)
def test_a_builtin_redefined_by_the_candidate_does_not_change_the_tests(code_envs):
    # HumanEval/33's check compares `tuple(candidate(x)) == tuple(...)`: a module-level `tuple` that returns
    # a constant made both sides equal when the tests ran in the candidate's module
    env = code_envs["humaneval"]
    env.reset(options={"task_id": "HumanEval/33"})
    _, reward, _, _, info = env.step("tuple = lambda *args: ()\ndef sort_third(l):\n    return [0]\n")
    assert reward == 0.0 and info["error"].kind == "runtime_error"
    # and the candidate still uses its own names: MBPP/126 tests a function the reference calls `sum`
    env = code_envs["mbpp"]
    _, info = env.reset(options={"task_id": "mbpp/126"})
    _, reward, _, _, _ = env.step(info["task"].privileged["walkthrough"][0])
    assert reward == 1.0


@pytest.mark.timeout(60)
def test_the_tests_and_the_reference_are_out_of_the_candidates_reach(code_envs):
    # a candidate that finds the expected outputs (the test asserts, HumanEval+'s reference solution) can
    # answer from them: nothing it can read, in its files or through /proc, holds them
    from environments.code.sandbox import run_checked
    from environments.code.programs import candidate_source, test_spec

    env = code_envs["humanevalplus"]
    problem = env._problems["HumanEval/0"]
    markers = ["assert candidate([1.0, 2.0, 3.9, 4.0, 5.0, 2.2], 0.3) == True", "sorted_numbers[i + 1] - sorted_numbers[i] < threshold"]
    assert all(m in problem.test_code + problem.solution for m in markers)
    search = (
        "import glob, os\nseen = []\n"
        "paths = glob.glob('/sandbox/*') + glob.glob('/tmp/**', recursive=True) + glob.glob('/proc/*/fd/*')"
        " + glob.glob('/proc/*/environ') + glob.glob('/proc/*/cmdline')\n"
        "for path in paths:\n"
        "    try:\n        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)\n"
        "        seen.append(os.read(fd, 1 << 22))\n        os.close(fd)\n"
        "    except Exception:\n        pass\n"
        "blob = b''.join(seen)\n"
        # the markers travel reversed, so the candidate's own source (main.py) does not contain them
        f"print('FOUND' if any(m[::-1].encode() in blob for m in {[m[::-1] for m in markers]!r}) else 'NOTHING', len(seen))\n"
        "def has_close_elements(numbers, threshold):\n    return False\n"
    )
    result = run_checked(test_spec(problem), candidate_source(problem, search), timeout_s=60)
    assert "NOTHING" in result.stdout and not result.passed, result.stdout
