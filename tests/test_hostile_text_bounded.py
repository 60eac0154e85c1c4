"""`agentgym_opd.bounded`: the bounded worker process and the helpers every env uses on agent text (issue 35).

The worker's service here is `EchoService` below (the child imports this module by name).
"""

from __future__ import annotations

import ast
import decimal
import os
import time

import mpmath
import pytest

from agentgym_opd.bounded import (BoundedWorker, BoundExceeded, RemoteError, UnparsableText, local_numeric_context,
                                  parse_python, source_excerpt)


class EchoService:
    """What the tests ask the worker to do; each method is one way a request can end."""

    def __init__(self):
        self.count = 0

    def echo(self, value):
        self.count += 1
        return value, self.count

    def huge_power(self):
        return 10 ** 100_000_000  # the call: one C loop, minutes long

    def allocate(self, megabytes):
        return len(bytearray(megabytes * 1024 * 1024))

    def fail(self):
        raise KeyError("no such thing")

    def die(self):
        os._exit(3)

    def an_object(self):
        return EchoService()

    def set_precision(self):
        decimal.getcontext().prec = 3
        return decimal.getcontext().prec


@pytest.fixture
def worker():
    w = BoundedWorker(f"{__name__}:EchoService", memory_headroom_mb=256, name="test worker")
    yield w
    w.close()


@pytest.mark.timeout(300)
def test_the_worker_keeps_state_between_calls_and_answers_with_plain_data(worker):
    assert worker.call("echo", {"a": (1, 2.5, None, [b"x"])}, timeout_s=60) == ({"a": (1, 2.5, None, [b"x"])}, 1)
    assert worker.call("echo", "again", timeout_s=60) == ("again", 2)
    with pytest.raises(RemoteError, match="KeyError"):
        worker.call("fail", timeout_s=60)
    with pytest.raises(RemoteError, match="no public method"):
        worker.call("_private", timeout_s=60)
    assert worker.call("echo", 0, timeout_s=60) == (0, 3)  # a service error is an answer: the worker lives on
    assert worker.generation == 1


@pytest.mark.timeout(300)
def test_a_request_past_its_deadline_kills_the_worker_and_the_next_call_gets_a_fresh_one(worker):
    worker.call("echo", 1, timeout_s=60)
    start = time.monotonic()
    with pytest.raises(BoundExceeded) as exc:
        worker.call("huge_power", timeout_s=1.0)
    assert exc.value.kind == "timeout" and time.monotonic() - start < 30  # not the minutes the power takes
    assert not worker.alive
    assert worker.call("echo", 1, timeout_s=60) == (1, 1) and worker.generation == 2  # a new worker, new state


@pytest.mark.timeout(300)
def test_memory_past_the_headroom_is_a_memory_bound(worker):
    assert worker.call("allocate", 64, timeout_s=60) == 64 * 1024 * 1024
    with pytest.raises(BoundExceeded) as exc:
        worker.call("allocate", 4096, timeout_s=60)
    assert exc.value.kind == "memory"
    assert worker.call("echo", 1, timeout_s=60) == (1, 1)


@pytest.mark.timeout(300)
def test_a_dead_worker_or_an_answer_that_is_not_plain_data_is_a_crash(worker):
    with pytest.raises(BoundExceeded) as exc:
        worker.call("die", timeout_s=60)
    assert exc.value.kind == "crash" and "exit status 3" in exc.value.message
    with pytest.raises(BoundExceeded) as exc:
        worker.call("an_object", timeout_s=60)  # the parent never builds an object the worker names
    assert exc.value.kind == "crash"
    assert worker.call("echo", 1, timeout_s=60) == (1, 1)


def test_local_numeric_context_restores_decimal_and_mpmath_precision():
    before = decimal.getcontext().prec, mpmath.mp.prec
    with local_numeric_context():
        decimal.getcontext().prec = 2
        mpmath.mp.dps = 3
        assert str(decimal.Decimal(2).sqrt()) == "1.4"
    assert (decimal.getcontext().prec, mpmath.mp.prec) == before
    with pytest.raises(ZeroDivisionError):
        with local_numeric_context():
            mpmath.mp.dps = 3
            raise ZeroDivisionError
    assert mpmath.mp.prec == before[1]


@pytest.mark.parametrize("source, needle", [
    ("x = " + "-" * 7000 + "1", "nested too deeply"),
    ("x = " + "+".join(["1"] * 6000), "nested too deeply"),
    ("x = (", "SyntaxError at line 1"),
    ("x = 1\x00", "null bytes"),
])
def test_parse_python_refuses_with_a_message(source, needle):
    with pytest.raises(UnparsableText, match=needle):
        parse_python(source)


def test_source_excerpt_quotes_without_recursion():
    source = "f(" + "-" * 600 + "x)"  # parses; ast.unparse of it recursed past the limit
    node = ast.parse(source, mode="eval").body.args[0]
    assert source_excerpt(source, node) == "-" * 120 + "..."
    assert source_excerpt("f(a  +\n   b)", ast.parse("f(a  +\n   b)", mode="eval").body.args[0]) == "a + b"
