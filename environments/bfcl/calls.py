"""Parse an agent message into function calls: a JSON list or Python call syntax, literals only.

Two formats are accepted, because models are prompted with one or the other:

* JSON: `[{"name": "f", "arguments": {"a": 1}}, ...]` (a single object works too; `parameters` is accepted
  for `arguments`, and `arguments` may itself be a JSON string, as OpenAI-style tool calls write it);
* BFCL's Python call syntax: `[f(a=1), pkg.g(b="x")]` (brackets optional).

WHY not BFCL's own Python decoder (`model_handler.utils.ast_parse`): it `eval`s some sub-expressions of
the model output (binary operations, lambdas), so a model could run code in the trainer. This parser
takes argument values with `ast.literal_eval` only (strings, numbers, lists, tuples, dicts, sets,
True/False/None) and yields the same decoded form BFCL's checkers take (`[{name: {param: value}}]`).
Decoded values are plain data within the bounds of `values.py`; multi-turn calls run by method lookup
(`executor.py`), never as source.

A message that is not an attempt at calls at all (prose, no leading bracket/brace and no `name(`) is
returned as text: for a multi-turn task that ends the user turn, as in BFCL.
"""

from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass, field
from typing import Any

from agentgym_opd.bounded import PARSER_FAILURES, source_excerpt
from environments.bfcl.values import check_data, decode_json, ValueProblem

_FENCE_LANGUAGE = re.compile(r"[a-zA-Z0-9_-]*\s*")
_CALL_START = re.compile(r"^[A-Za-z_][\w.]*\s*\(")


@dataclass(frozen=True)
class Call:
    name: str
    kwargs: dict[str, Any] = field(default_factory=dict)
    args: tuple[Any, ...] = ()

    def to_bfcl(self) -> dict[str, dict[str, Any]]:
        """BFCL's decoded form of one call: {name: {param: value}}."""
        return {self.name: dict(self.kwargs)}

    def to_source(self) -> str:
        """Python source of the call, literals rendered with repr (safe to hand to BFCL's executor)."""
        parts = [repr(a) for a in self.args] + [f"{k}={v!r}" for k, v in self.kwargs.items()]
        return f"{self.name}({', '.join(parts)})"


@dataclass(frozen=True)
class Parsed:
    """Exactly one of: `calls` (possibly empty: `[]`), `text` (no call attempted), or `error`."""

    calls: list[Call] | None = None
    text: str | None = None
    error: str | None = None


def strip_fences(text: str) -> str:
    """The content of a message that is one fenced block (```lang ... ```), else the stripped message.

    Written with string operations, not one regex: the pattern `^```[a-z]*\\s*(.*?)```$` backtracks
    quadratically on a fence that is never closed (1.6 s for 16,000 characters of "```aaa...")."""
    text = text.strip()
    if len(text) < 6 or not (text.startswith("```") and text.endswith("```")):
        return text
    inner = text[3:-3]
    return inner[_FENCE_LANGUAGE.match(inner).end():].strip()


def looks_like_calls(text: str) -> bool:
    text = strip_fences(text)
    return text.startswith(("[", "{")) or bool(_CALL_START.match(text))


def parse_calls(text: str) -> Parsed:
    """Parse one agent message (see the module docstring for the formats)."""
    body = strip_fences(text)
    if not looks_like_calls(body):
        return Parsed(text=text.strip())
    json_error = None
    if body.startswith(("[", "{")):
        try:
            data = decode_json(body)
        except ValueProblem as exc:
            json_error = str(exc)
            if not json_error.startswith("invalid JSON:"):  # decoded, but beyond the bounds: no second try
                return Parsed(error=f"Could not parse the function calls: {json_error}.")
        else:
            return _from_json(data)
    try:
        tree = ast.parse(body, mode="eval")
    except SyntaxError as exc:
        if json_error and body.lstrip("[ \n").startswith("{"):
            return Parsed(error=f"Could not parse the function calls: {json_error}.")
        return Parsed(error=f"Could not parse the function calls: invalid Python call syntax: {exc.msg} "
                      f"(line {exc.lineno}, column {exc.offset}).")
    except PARSER_FAILURES:
        return Parsed(error="Could not parse the function calls: the text is nested too deeply or holds a number "
                      "too long to be a call.")
    return _from_python(tree.body, body)


def _from_json(data: Any) -> Parsed:
    items = data if isinstance(data, list) else [data]
    calls = []
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            return Parsed(error=f"Call {i} is {type(item).__name__}, expected an object "
                          '{"name": ..., "arguments": {...}}.')
        name = item.get("name", item.get("function"))
        if isinstance(name, dict):  # {"function": {"name": ..., "arguments": ...}} (OpenAI tool_calls)
            item, name = name, name.get("name")
        args = item.get("arguments", item.get("parameters", {}))
        if not isinstance(name, str) or not name:
            return Parsed(error=f'Call {i} has no "name" string: {json.dumps(item)[:200]}')
        if isinstance(args, str):
            try:
                args = decode_json(args) if args.strip() else {}
            except ValueProblem as exc:
                return Parsed(error=f'Call {i} ({name[:100]}): "arguments" is a string that is not valid JSON '
                              f"within the bounds: {exc}.")
        if not isinstance(args, dict):
            return Parsed(error=f'Call {i} ({name}): "arguments" must be an object, got {type(args).__name__}.')
        calls.append(Call(name, args))
    return Parsed(calls=calls)


def _dotted_name(node: ast.AST) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(node.id)
    return ".".join(reversed(parts))


def _from_python(body: ast.AST, source: str) -> Parsed:
    """Calls from the parsed tree of `source`. Error messages quote the agent's own text by position
    (`source_excerpt`), never by `ast.unparse`, which recurses once per nesting level."""
    nodes = body.elts if isinstance(body, (ast.List, ast.Tuple)) else [body]
    calls = []
    for node in nodes:
        if not isinstance(node, ast.Call):
            return Parsed(error=f"Expected a function call like f(a=1), got `{source_excerpt(source, node)}`.")
        name = _dotted_name(node.func)
        if name is None:
            return Parsed(error=f"`{source_excerpt(source, node.func)}` is not a function name.")
        try:
            args = tuple(_literal(a, name, f"positional argument {i}", source) for i, a in enumerate(node.args))
            kwargs = {}
            for kw in node.keywords:
                if kw.arg is None:
                    raise ValueError(f"{name}: `**` unpacking is not allowed; write each argument as name=value.")
                kwargs[kw.arg] = _literal(kw.value, name, f"argument {kw.arg!r}", source)
        except ValueError as exc:
            return Parsed(error=str(exc))
        calls.append(Call(name, kwargs, args))
    return Parsed(calls=calls)


def _literal(node: ast.AST, func: str, what: str, source: str) -> Any:
    if isinstance(node, ast.Starred):
        raise ValueError(f"{func}: `*` unpacking is not allowed; write each argument out.")
    try:
        value = ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        raise ValueError(
            f"{func}: {what} is `{source_excerpt(source, node)}`; only literal values (strings, numbers, lists, "
            "dicts, True/False/None) are allowed."
        ) from None
    try:
        check_data(value, f"{what}")
    except ValueProblem as exc:
        raise ValueError(f"{func}: {exc}.") from None
    return value


def is_answer_object(text: str) -> bool:
    """BFCL's agentic answer format, `{'answer': ..., 'context': ...}` (a dict literal or JSON object with an
    "answer" key and no call "name"): a final text answer, not a malformed call."""
    body = strip_fences(text)
    if not body.startswith("{"):
        return False
    try:
        data = decode_json(body)
    except ValueProblem:
        try:
            data = ast.literal_eval(body)
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            return False
    return isinstance(data, dict) and "answer" in data and not ({"name", "function"} & set(data))


def render_calls(calls: list[Call]) -> str:
    """Python call syntax of a list of calls, as BFCL prompts models to answer."""
    return "[" + ", ".join(c.to_source() for c in calls) + "]"
