"""The test checker inside the sandbox: runs the benchmark's tests against the candidate, in another process.

Why two processes: a program that runs its own tests can fake their outcome (exit 0 before the tests, an
`atexit` hook, an `__eq__` that is always True, patched builtins). Here the benchmark's test code runs in
this process, which never executes a line of the candidate's code; the candidate runs in a separate
interpreter (`worker.py`) and only answers calls with plain data (`wire.py`), so every comparison is
between builtin values. The verdict leaves on a descriptor the worker never inherits, prefixed by a
per-run token read (from another descriptor) before the worker exists, and the tests themselves (with
the HumanEval+ reference solution) arrive the same way, so the candidate cannot read expected answers; this process marks itself
non-dumpable, so the worker (same uid, no capabilities) cannot read its memory or open its descriptors
through /proc. Whatever the worker does (exit early, kill this process, flood the output), the host sees
either this verdict with the right token or no verdict, which counts as a failure.

    python -I -S -B supervisor.py VERDICT_FD TOKEN_FD SPEC_FD   (the tests as JSON on SPEC_FD; files under /sandbox)
"""

import ast
import builtins
import copy
import ctypes
import importlib
import importlib.util
import json
import math
import os
import resource
import subprocess
import sys
import traceback

SANDBOX = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, SANDBOX)
import wire  # noqa: E402

MESSAGE_LIMIT = 64 << 20
PR_SET_DUMPABLE = 4


class CandidateGone(BaseException):
    """The candidate's process ended or broke the protocol: not an `Exception`, so no test's
    `except Exception` can swallow it."""


class CandidateRaised(Exception):
    """The candidate raised while called; carries its exception type, message and traceback."""

    def __init__(self, kind, message, tb):
        super().__init__("%s: %s" % (kind, message))
        self.kind, self.tb = kind, tb


class Worker:
    def __init__(self, limits):
        self.request_r, self.request_w = os.pipe()
        self.reply_r, self.reply_w = os.pipe()
        self.calls = 0
        self.broken = None
        self.proc = subprocess.Popen(
            [sys.executable, "-I", "-S", "-B", os.path.join(SANDBOX, "worker.py"), os.path.join(SANDBOX, "main.py"),
             str(self.request_r), str(self.reply_w)],
            stdin=subprocess.DEVNULL, pass_fds=(self.request_r, self.reply_w), close_fds=True,
            preexec_fn=lambda: _apply_limits(limits),
        )
        os.close(self.request_r)
        os.close(self.reply_w)

    def receive(self):
        try:
            reply = wire.receive(self.reply_r, MESSAGE_LIMIT)
        except wire.WireError as exc:
            self.broken = str(exc)
            raise CandidateGone(self.broken) from None
        if reply is None or not isinstance(reply, dict):
            self.broken = "the tested program exited" if reply is None else "the tested program sent garbage"
            raise CandidateGone(self.broken)
        return reply

    def call(self, target, args):
        if self.broken:
            raise CandidateGone(self.broken)
        try:
            wire.send(self.request_w, {"call": target, "args": [wire.encode(a) for a in args]})
        except (OSError, wire.WireError) as exc:
            self.broken = "the tested program exited" if isinstance(exc, OSError) else str(exc)
            raise CandidateGone(self.broken) from None
        reply = self.receive()
        if "error" in reply:
            raise CandidateRaised(str(reply.get("error"))[:100], str(reply.get("message"))[:2000], str(reply.get("traceback"))[-4000:])
        if "ok" not in reply:
            self.broken = "the tested program sent garbage"
            raise CandidateGone(self.broken)
        try:
            value = wire.decode(reply["ok"])
        except (wire.WireError, RecursionError, MemoryError) as exc:
            self.broken = "the tested program returned an unreadable value: %s" % exc
            raise CandidateGone(self.broken) from None
        self.calls += 1
        return value

    def setup(self, source):
        wire.send(self.request_w, {"setup": source})
        reply = self.receive()
        if "error" in reply:
            raise CandidateRaised(str(reply.get("error"))[:100], str(reply.get("message"))[:2000], str(reply.get("traceback"))[-4000:])

    def end(self):
        for fd in (self.request_w, self.reply_r):
            try:
                os.close(fd)
            except OSError:
                pass
        try:
            return self.proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()


class Remote:
    """Stands for a name the candidate defines: calling it calls the candidate's object."""

    def __init__(self, worker, target):
        self._worker, self._target = worker, target

    def __call__(self, *args, **kwargs):
        if kwargs:
            raise TypeError("keyword arguments are not supported by the test harness")
        return self._worker.call(self._target, args)

    def __repr__(self):
        return "<tested %s>" % self._target


def _lower(which, soft, hard=None):
    """Set a limit, never above the inherited one (raising it would need privileges)."""
    current = resource.getrlimit(which)[1]
    hard = soft if hard is None else hard
    if current != resource.RLIM_INFINITY:
        soft, hard = min(soft, current), min(hard, current)
    resource.setrlimit(which, (soft, hard))


def _apply_limits(limits):
    _lower(resource.RLIMIT_AS, limits["memory_mb"] << 20)
    cpu = max(1, int(math.ceil(limits["cpu_s"])))
    _lower(resource.RLIMIT_CPU, cpu, cpu + 1)


def _bound_names(tree):
    bound = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
            bound.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
            bound.update(a.arg for a in ast.walk(node.args) if isinstance(a, ast.arg))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            bound.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            bound.add(node.name)
    return bound


def _loaded(tree):
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}


def _is_module(name):
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def plan_names(tests, setup, reference_names):
    """Which names the tests take from the candidate, which are standard modules the tests use without
    importing them (the candidate's import served them before), and whether the setup needs the candidate.

    A name is the candidate's when the benchmark's reference solution defines it (MBPP/126 tests a
    function called `sum`), or when nothing trusted defines it; a builtin the candidate redefines but the
    reference does not (say `len`) stays the real builtin, so tests like `len(f(x)) == 3` cannot be bent."""
    test_tree, setup_tree = ast.parse(tests), ast.parse(setup)
    reference = set(reference_names)
    builtin = set(dir(builtins))
    setup_needs_candidate = any(n in reference or (n not in builtin and not _is_module(n))
                                for n in _loaded(setup_tree) - _bound_names(setup_tree))
    trusted = _bound_names(test_tree) | (set() if setup_needs_candidate else _bound_names(setup_tree))
    candidate, modules = set(), set()
    for name in _loaded(test_tree):
        if name in reference:
            candidate.add(name)
        elif name in trusted or name in builtin:
            continue
        elif _is_module(name):
            modules.add(name)
        else:
            candidate.add(name)
    return sorted(candidate), sorted(modules), setup_needs_candidate


def _same(got, expected, atol):
    """EvalPlus's output comparison, on plain values only; a bool never equals a number."""
    if type(got) is type(expected) and type(got) in (list, tuple, str, int) and got == expected:
        return True  # plain values that are exactly equal (floats inside compare exactly): the common case, fast
    if isinstance(got, bool) != isinstance(expected, bool):
        return False
    if isinstance(expected, float) or isinstance(got, float):
        if isinstance(got, bool) or not isinstance(got, (int, float)) or not isinstance(expected, (int, float)):
            return False
        if math.isnan(expected) and math.isnan(got):
            return True
        return math.isclose(got, expected, rel_tol=1e-7, abs_tol=atol or 1e-6)
    if isinstance(expected, (list, tuple)) and isinstance(got, (list, tuple)):
        return len(got) == len(expected) and all(_same(g, e, atol) for g, e in zip(got, expected))
    return type(got) is type(expected) and got == expected


def _short(value):
    text = repr(value)
    return text if len(text) <= 300 else text[:300] + "..."


def _failing_line(exc, sources):
    """The source line of the innermost frame in the test code (file name '<tests>')."""
    line = None
    for frame, lineno in traceback.walk_tb(exc.__traceback__):
        name = frame.f_code.co_filename
        if name in sources:
            lines = sources[name].splitlines()
            if 1 <= lineno <= len(lines):
                line = lines[lineno - 1].strip()
    return line


def run_checks(spec, worker):
    kind, entry = spec["kind"], spec.get("entry_point")
    sources = {}
    namespace = {"__name__": "__tests__"}

    def run(source, name):
        sources[name] = source
        exec(compile(source, name, "exec"), namespace)

    if kind in ("humaneval", "humanevalplus"):
        run(spec["prompt"], "<prompt>")  # the benchmark's helpers (e.g. `poly`), never the candidate's
        candidate = Remote(worker, entry)
        namespace[entry] = candidate  # some checks call the function by name (HumanEval/33): that is the candidate's
        run(spec["test_code"], "<tests>")
        sources["<tests-call>"] = "check(candidate)"
        exec(compile("check(candidate)", "<tests-call>", "exec"), dict(namespace, candidate=candidate))
        if kind == "humanevalplus":
            reference = {"__name__": "__reference__"}
            exec(compile(spec["reference"], "<reference>", "exec"), reference)
            inputs = wire.decode(spec["inputs"])
            expected = [reference[entry](*copy.deepcopy(args)) for args in inputs]
            for args, want in zip(inputs, expected):
                got = candidate(*args)
                if not _same(got, want, spec.get("atol") or 0.0):
                    raise AssertionError("%s(*%s) returned %s, expected %s" % (entry, _short(args), _short(got), _short(want)))
        return
    setup = spec.get("setup") or ""
    tests = "\n".join(spec["tests"])
    candidate, modules, setup_in_candidate = plan_names(tests, setup, spec.get("reference_names") or [])
    for name in modules:
        namespace[name] = importlib.import_module(name)
    for name in candidate:
        namespace[name] = Remote(worker, name)
    if setup_in_candidate:
        worker.setup(setup)
        for name in sorted(_bound_names(ast.parse(setup))):
            namespace[name] = wire.Named(name)
    else:
        run(setup, "<setup>")
    run(tests, "<tests>")


def main():
    verdict_fd, token_fd, spec_fd = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    ctypes.CDLL(None).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    token = os.read(token_fd, 256)
    os.close(token_fd)
    with os.fdopen(spec_fd, "rb") as handle:  # the tests and the reference: never where the candidate can read
        spec = json.loads(handle.read().decode("utf-8"))
    limits = spec["limits"]
    _lower(resource.RLIMIT_NPROC, limits["max_procs"])  # inside the namespace: counts this run only
    worker = Worker(limits)
    verdict = {"status": "failed", "kind": "error", "failing_test": None, "message": "", "traceback": ""}
    try:
        first = worker.receive()
        if "error" in first:
            raise CandidateRaised(str(first.get("error"))[:100], str(first.get("message"))[:2000], str(first.get("traceback"))[-4000:])
        run_checks(spec, worker)
        if worker.broken or worker.calls == 0:
            raise CandidateGone(worker.broken or "the tests never called the tested code")
        verdict.update(status="passed", kind="passed")
    except CandidateGone as exc:
        verdict.update(kind="exited", message=str(exc), failing_test=_failing_line(exc, {"<tests>": spec.get("test_code", "")}))
    except CandidateRaised as exc:
        verdict.update(kind="memory" if exc.kind == "MemoryError" else "raised", message=str(exc), traceback=exc.tb,
                       failing_test=_failing_line(exc, {"<tests>": _tests_source(spec)}))
    except BaseException as exc:  # an assertion of the tests, or anything the tests raised on the values
        verdict.update(kind="assertion" if isinstance(exc, AssertionError) else "error",
                       message="%s: %s" % (type(exc).__name__, str(exc)[:2000]),
                       failing_test=_failing_line(exc, {"<tests>": _tests_source(spec)}))
    code = worker.end()
    if verdict["status"] != "passed" and code is not None and code < 0:
        verdict["signal"] = -code
    os.write(verdict_fd, token + b"\n" + json.dumps(verdict).encode("utf-8"))


def _tests_source(spec):
    return spec["test_code"] if spec["kind"] in ("humaneval", "humanevalplus") else "\n".join(spec["tests"])


main()
