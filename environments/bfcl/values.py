"""Bounds on the data an agent's call may carry, and a decoder of JSON text that keeps to them.

WHY: a call's arguments come from model text, and the standard decoders fail on hostile text with
exceptions that are not "bad syntax": `json.loads` raises `ValueError` for an integer of more than 4300
digits and `RecursionError` for `"[" * 3000`; Python's parser raises `RecursionError` or `MemoryError` on
deep nesting. A function-calling env must turn all of these into a `parse_error` for that one step. And
data that decodes fine can still be unfit to pass to a tool (an infinite float, a set, 500 levels of
nesting that later code walks recursively), so every decoded value is checked against the same bounds
before anything uses it. The bounds are far above anything a real tool call needs.
"""

from __future__ import annotations

import json
import math
from typing import Any

MAX_NESTING = 32  # lists / dicts / tuples inside one another (BFCL's deepest answer nests 5)
MAX_INT_DIGITS = 100  # decimal digits of an integer argument


class ValueProblem(ValueError):
    """Text or data outside the bounds above; the message says what and how to fix it."""


def decode_json(text: str, *, finite: bool = True) -> Any:
    """`json.loads`, with every failure (syntax, digit limit, depth) raised as `ValueProblem`."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueProblem(f"invalid JSON: {exc}") from None
    except ValueError as exc:  # Python's limit on integer digits
        raise ValueProblem(f"invalid JSON value: {exc}; numbers must have at most {MAX_INT_DIGITS} digits") from None
    except (RecursionError, MemoryError):
        raise ValueProblem(f"the JSON is nested too deeply (at most {MAX_NESTING} levels)") from None
    check_data(data, finite=finite)
    return data


def check_data(value: Any, what: str = "the value", *, finite: bool = True) -> None:
    """Raise `ValueProblem` unless `value` is plain data within the bounds: None, bool, int, finite float,
    str, and lists / tuples / dicts of those (dict keys: str, int, float, bool or None), at most
    `MAX_NESTING` levels deep (`finite=False` lets infinities and NaN through, for a caller that reports
    them itself). Walks iteratively, so hostile depth cannot exhaust the stack here."""
    stack = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if depth > MAX_NESTING:
            raise ValueProblem(f"{what} is nested more than {MAX_NESTING} levels deep")
        if item is None or isinstance(item, (bool, str)):
            continue
        if isinstance(item, int):
            if item.bit_length() > MAX_INT_DIGITS * 3.33:  # about MAX_INT_DIGITS decimal digits
                raise ValueProblem(f"{what} holds an integer of more than {MAX_INT_DIGITS} digits")
            continue
        if isinstance(item, float):
            if finite and not math.isfinite(item):
                raise ValueProblem(f"{what} holds {item}; numbers must be finite")
            continue
        if isinstance(item, (list, tuple)):
            stack.extend((v, depth + 1) for v in item)
            continue
        if isinstance(item, dict):
            for key, v in item.items():
                if not (key is None or isinstance(key, (str, int, float, bool))):
                    raise ValueProblem(f"{what} has a dict key of type {type(key).__name__}; keys must be strings or numbers")
                stack.append((key, depth + 1))
                stack.append((v, depth + 1))
            continue
        raise ValueProblem(f"{what} holds a {type(item).__name__}; only strings, numbers, true/false, null, "
                           "lists and objects are allowed")
