"""Run an agent's calls on BFCL's backend instances by method lookup, never by evaluating source.

WHY not BFCL's executor (`execute_multi_turn_func_call`): it renders each call as Python source and
`eval`s it, checking only the function name, so an argument *key* such as
`"x=__import__('os').system('...'),y"` runs code in the trainer's process. Here a call is run as
`method(**kwargs)` after validation:

* the name must be a public method of one of the episode's backend instances (BFCL's name-to-instance
  mapping: `inspect.getmembers`, private names skipped, a later class wins a clash);
* the name and every keyword must be a *plain* identifier: a Python identifier, not a keyword, and equal
  to its NFKC normal form. WHY the last part: Python normalises identifiers in source (NFKC), so `ｌｓ(ａ=True)`
  written as source *is* `ls(a=True)`, while the same key in a kwargs dict is a different string. A key
  that changed under normalisation would mean one call when it runs and another when BFCL's checker
  replays its source: refused (`InvalidCall`) before any call runs;
* every value must be plain data within the bounds of `values.py` (the parser already checked; checked
  again here because this is the last gate before a backend);
* the arguments must bind to the method's signature (`inspect.Signature.bind`): an unknown keyword or a
  missing required argument gives the error result Python's own call would give, and the method is
  *not* run.

`execute` says whether the method actually ran. BFCL's multi-turn checker replays the episode's calls as
source text (it `eval`s them on fresh instances), so only calls that ran are recorded, each rebuilt from
the validated name and arguments that ran (`ValidCall.source`), and that text is parsed back and
compared with them before it is recorded: the replay is exactly what ran, and nothing else.

Every backend method runs inside `agentgym_opd.bounded.local_numeric_context` (its `decimal` / `mpmath`
precision changes are undone), in the bounded worker process that hosts the backends
(`backend_host.py`).

Fidelity to BFCL's prompting loop (`default_decode_execute_prompting`): BFCL's decoder drops positional
arguments, so they are dropped here too (the env reports it as a `tool_error`); BFCL refuses a few
names (`kill`, `exit`, ...) with an error result, and so does this; results are turned into text as
BFCL does (str kept, dict as JSON, anything else `str`), exceptions as "Error during execution: ...".
"""

from __future__ import annotations

import ast
import copy
import inspect
import json
import keyword
import unicodedata
from dataclasses import dataclass
from typing import Any

from agentgym_opd.bounded import local_numeric_context, parse_python, UnparsableText
from environments.bfcl.calls import Call
from environments.bfcl.values import check_data, ValueProblem

EXECUTION_ERROR_PREFIX = "Error during execution:"
# The names BFCL's executor refuses to evaluate (multi_turn_utils.execute_multi_turn_func_call).
BLOCKED_NAMES = frozenset({"kill", "exit", "quit", "remove", "unlink", "popen", "Popen", "run"})


class InvalidCall(ValueError):
    """A call that cannot be expressed as a BFCL call at all; nothing of its message is run."""


def plain_identifier(name: Any) -> bool:
    """A Python identifier, not a keyword, that Python's NFKC normalisation of source leaves unchanged (so
    its source text names exactly this string; see the module docstring)."""
    return (isinstance(name, str) and name.isidentifier() and not keyword.iskeyword(name)
            and unicodedata.normalize("NFKC", name) == name)


def _identifier_problem(name: Any) -> str:
    """Why `name` is not a plain identifier, in words for the model."""
    if isinstance(name, str) and name.isidentifier() and not keyword.iskeyword(name):
        return (f"is not a plain identifier: Python reads it as {ascii(unicodedata.normalize('NFKC', name))[:60]} "
                "(write plain ASCII letters, digits and underscores)")
    return "is not a Python identifier"


@dataclass(frozen=True)
class ValidCall:
    """A call reduced to what BFCL's decoder keeps: method name and keyword arguments (validated)."""

    name: str
    kwargs: dict[str, Any]
    dropped_positional: int = 0

    def source(self) -> str:
        """The call as Python source, for BFCL's checker: the validated name, its keys, and `repr` of plain
        data, checked by parsing it back: it must name this method with exactly these keys and values (same
        reprs, so `1`, `1.0` and `True` stay apart). Raises `InvalidCall` otherwise (nothing is recorded)."""
        text = f"{self.name}({', '.join(f'{k}={v!r}' for k, v in self.kwargs.items())})"
        if not _replays_as(text, self.name, self.kwargs):
            raise InvalidCall(f"{ascii(self.name)[:120]}: the call cannot be written as source that replays "
                              "exactly (argument names must be plain ASCII identifiers).")
        return text


def _replays_as(text: str, name: str, kwargs: dict[str, Any]) -> bool:
    """Does `text`, read as Python, call `name` with exactly `kwargs` (as literals)?"""
    try:
        node = parse_python(text, mode="eval").body
    except UnparsableText:
        return False
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == name and not node.args):
        return False
    if [k.arg for k in node.keywords] != list(kwargs):
        return False
    try:
        return all(repr(ast.literal_eval(k.value)) == repr(kwargs[k.arg]) for k in node.keywords)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False


def validate(call: Call) -> ValidCall:
    """Check a parsed call's name, keys and values; raise `InvalidCall` naming the problem."""
    if not plain_identifier(call.name):
        raise InvalidCall(f"{call.name!r:.120} is not a function name ({_identifier_problem(call.name)}).")
    for key in call.kwargs:
        if not plain_identifier(key):
            raise InvalidCall(f"{call.name}: argument name {key!r:.120} {_identifier_problem(key)}; argument names "
                              "are the parameter names of the function's documentation.")
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


def result_text(result: Any) -> str:
    """A backend's return value as BFCL's executor shows it: str kept, dict as JSON, anything else `str`."""
    if type(result) is str:
        return result
    if type(result) is dict:
        try:
            return json.dumps(result)
        except (TypeError, ValueError):
            pass
    try:
        return str(result)
    except (ValueError, RecursionError) as exc:  # e.g. an integer beyond Python's 4300-digit str limit
        return f"{EXECUTION_ERROR_PREFIX} the result cannot be shown as text: {str(exc)[:200]}"


def _plural_list(names: list[str]) -> str:
    quoted = [f"'{n}'" for n in names]
    if len(quoted) <= 2:
        return " and ".join(quoted)
    return ", ".join(quoted[:-1]) + ", and " + quoted[-1]


def binding_error(method: Any, kwargs: dict[str, Any]) -> str | None:
    """Python's own message for calling `method(**kwargs)` when the arguments do not bind (an unknown
    keyword, a missing required argument), else None. Nothing is called."""
    try:
        signature = inspect.signature(method)
    except (TypeError, ValueError):
        return None
    params = signature.parameters
    qualname = getattr(method, "__qualname__", "the function")
    if not any(p.kind is p.VAR_KEYWORD for p in params.values()):
        named = {n for n, p in params.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
        unexpected = next((k for k in kwargs if k not in named), None)
        if unexpected is not None:
            return f"{qualname}() got an unexpected keyword argument '{unexpected}'"
    for kind, label in ((inspect.Parameter.POSITIONAL_OR_KEYWORD, "positional"),
                        (inspect.Parameter.KEYWORD_ONLY, "keyword-only")):
        missing = [n for n, p in params.items() if p.kind is kind and p.default is p.empty and n not in kwargs]
        if missing:
            noun = "argument" if len(missing) == 1 else "arguments"
            return f"{qualname}() missing {len(missing)} required {label} {noun}: {_plural_list(missing)}"
    return None


def execute(call: ValidCall, table: dict[str, Any]) -> tuple[bool, str]:
    """Run one validated call; return (whether the method ran, its result as BFCL's executor shows it).

    A `MemoryError` is not a result: it propagates, so the bounded worker reports the memory bound."""
    if call.name in BLOCKED_NAMES:
        return False, f"{EXECUTION_ERROR_PREFIX} Function call {call.name} is not allowed."
    method = table.get(call.name)
    if method is None:
        return False, f"{EXECUTION_ERROR_PREFIX} name '{call.name}' is not defined"
    problem = binding_error(method, call.kwargs)
    if problem is not None:  # Python's own message for such a call; nothing runs
        return False, f"{EXECUTION_ERROR_PREFIX} {problem}"
    try:
        with local_numeric_context():
            result = method(**copy.deepcopy(call.kwargs))  # fresh objects, as evaluating literals gives
    except MemoryError:
        raise
    except Exception as exc:  # a backend's own failure is the call's result, as in BFCL
        return True, f"{EXECUTION_ERROR_PREFIX} {exc}"
    return True, result_text(result)
