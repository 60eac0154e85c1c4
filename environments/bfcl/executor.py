"""Run an agent's calls on BFCL's backend instances by method lookup, never by evaluating source.

WHY not BFCL's executor (`execute_multi_turn_func_call`): it renders each call as Python source and
`eval`s it, checking only the function name, so an argument *key* such as
`"x=__import__('os').system('...'),y"` runs code in the trainer's process. Here a call is run as
`method(**kwargs)` after validation:

* the name must be a public method of one of the episode's backend instances (BFCL's name-to-instance
  mapping: `inspect.getmembers`, private names skipped, a later class wins a clash);
* every keyword must be a Python identifier (not a keyword); anything else is refused before any call
  runs (`InvalidCall`). An identifier the method's signature lacks gives the error result Python's own
  call would give, without calling; missing required arguments are left to Python's binding, which
  fails before the method's body runs;
* every value must be plain data within the bounds of `values.py` (the parser already checked; checked
  again here because this is the last gate before a backend).

BFCL's multi-turn checker replays the episode's calls as source text (it `eval`s them on fresh
instances), so each executed call is also recorded as source, built only from validated parts: the
method name, identifier keys and `repr` of plain data. Such text is a literal call and nothing else.

Fidelity to BFCL's prompting loop (`default_decode_execute_prompting`): BFCL's decoder drops positional
arguments, so they are dropped here too (the env reports it as a `tool_error`); BFCL refuses a few
names (`kill`, `exit`, ...) with an error result, and so does this; results are turned into text as
BFCL does (str kept, dict as JSON, anything else `str`), exceptions as "Error during execution: ...".
"""

from __future__ import annotations

import copy
import inspect
import json
import keyword
from dataclasses import dataclass
from typing import Any

from environments.bfcl.calls import Call
from environments.bfcl.values import check_data, ValueProblem

EXECUTION_ERROR_PREFIX = "Error during execution:"
# The names BFCL's executor refuses to evaluate (multi_turn_utils.execute_multi_turn_func_call).
BLOCKED_NAMES = frozenset({"kill", "exit", "quit", "remove", "unlink", "popen", "Popen", "run"})


class InvalidCall(ValueError):
    """A call that cannot be expressed as a BFCL call at all; nothing of its message is run."""


@dataclass(frozen=True)
class ValidCall:
    """A call reduced to what BFCL's decoder keeps: method name and keyword arguments (validated)."""

    name: str
    kwargs: dict[str, Any]
    dropped_positional: int = 0

    def source(self) -> str:
        """The call as Python source, for BFCL's checker: literal parts only (see the module docstring)."""
        return f"{self.name}({', '.join(f'{k}={v!r}' for k, v in self.kwargs.items())})"


def validate(call: Call) -> ValidCall:
    """Check a parsed call's name, keys and values; raise `InvalidCall` naming the problem."""
    if not isinstance(call.name, str) or not call.name.isidentifier() or keyword.iskeyword(call.name):
        raise InvalidCall(f"{call.name!r:.120} is not a function name (a Python identifier).")
    for key in call.kwargs:
        if not isinstance(key, str) or not key.isidentifier() or keyword.iskeyword(key):
            raise InvalidCall(f"{call.name}: argument name {key!r:.120} is not a Python identifier; "
                              "argument names are the parameter names of the function's documentation.")
    try:
        check_data(dict(call.kwargs), f"the arguments of {call.name}")
    except ValueProblem as exc:
        raise InvalidCall(str(exc)) from None
    return ValidCall(call.name, dict(call.kwargs), len(call.args))


def method_table(instances: dict[str, Any]) -> dict[str, Any]:
    """Public bound methods of the backend instances by name, as BFCL maps them."""
    table: dict[str, Any] = {}
    for instance in instances.values():
        for name, method in inspect.getmembers(instance, predicate=inspect.ismethod):
            if not name.startswith("_"):
                table[name] = method
    return table


def _result_text(result: Any) -> str:
    if type(result) is str:
        return result
    if type(result) is dict:
        try:
            return json.dumps(result)
        except (TypeError, ValueError):
            return str(result)
    return str(result)


def _unexpected_keyword(method: Any, kwargs: dict[str, Any]) -> str | None:
    """The first keyword the method's signature lacks (None when it takes them all, or takes **kwargs)."""
    try:
        params = inspect.signature(method).parameters
    except (TypeError, ValueError):
        return None
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return None
    named = {n for n, p in params.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    return next((k for k in kwargs if k not in named), None)


def execute(call: ValidCall, table: dict[str, Any]) -> str:
    """Run one validated call; return its result as BFCL's executor would show it."""
    if call.name in BLOCKED_NAMES:
        return f"{EXECUTION_ERROR_PREFIX} Function call {call.name} is not allowed."
    method = table.get(call.name)
    if method is None:
        return f"{EXECUTION_ERROR_PREFIX} name '{call.name}' is not defined"
    unexpected = _unexpected_keyword(method, call.kwargs)
    if unexpected is not None:  # Python's own message for such a call; nothing runs
        return f"{EXECUTION_ERROR_PREFIX} {method.__qualname__}() got an unexpected keyword argument '{unexpected}'"
    try:
        return _result_text(method(**copy.deepcopy(call.kwargs)))  # fresh objects, as evaluating literals gives
    except Exception as exc:  # a backend's own failure is the call's result, as in BFCL
        return f"{EXECUTION_ERROR_PREFIX} {exc}"
