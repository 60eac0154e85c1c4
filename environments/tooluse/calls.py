"""Parsing an agent's text into one function call, and validating it against the function's signature.

WHY strict but forgiving: models emit calls bare, inside a ```json fence, or inside
<tool_call>...</tool_call> tags (the Hermes/Qwen convention), so all three are accepted; but every
deviation from the signature (unknown name, missing/unexpected argument, a wrong JSON type) is refused
with a message naming the function, the argument, the expected type, what was received and how to fix
it, because that message is the learning signal. No silent coercion (a '3' for an int is an error), with
one exception JSON itself forces: an int where a float is expected is accepted.
"""

from __future__ import annotations

import inspect
import json
import math
import re
import types
import typing
from dataclasses import dataclass
from typing import Any, Callable

from environments.bfcl.values import check_data, decode_json, MAX_NESTING, ValueProblem
from environments.tooluse.tools import close_matches, quote

_TAG_OPEN, _TAG_CLOSE = "<tool_call>", "</tool_call>"
_FENCE_OPENING = re.compile(r"```(?:json)?\s*")  # no lazy body: linear in the text
_DECODER = json.JSONDecoder()
_JSON_NAMES = {int: "int", float: "float", str: "str", bool: "bool", list: "list", dict: "dict"}
FORMAT_HINT = ('Emit exactly one call as JSON: {"name": "<function>", "arguments": {"<arg>": <value>, ...}} '
               "(optionally inside a ```json fence or <tool_call>...</tool_call> tags).")


class CallError(Exception):
    """A call that cannot run; `kind` is the StepError kind (parse_error or tool_error)."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind
        self.message = message


@dataclass(frozen=True)
class Param:
    name: str
    types: tuple[type, ...]
    required: bool
    default: Any = None

    @property
    def type_name(self) -> str:
        return " | ".join(_JSON_NAMES.get(t, t.__name__) for t in self.types)


@dataclass(frozen=True)
class ToolSpec:
    """A tool's signature read once from its annotations (the first parameter, the world, is hidden)."""

    name: str
    func: Callable[..., Any]
    params: tuple[Param, ...]
    doc: str
    returns: str

    @classmethod
    def from_function(cls, func: Callable[..., Any]) -> "ToolSpec":
        hints = typing.get_type_hints(func)
        sig = inspect.signature(func)
        params = []
        for p in list(sig.parameters.values())[1:]:
            hint = hints[p.name]
            options = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
            required = p.default is inspect.Parameter.empty
            params.append(Param(p.name, tuple(options), required, None if required else p.default))
        ret = hints.get("return", object)
        returns = _JSON_NAMES.get(typing.get_origin(ret) or ret, str(ret))
        if typing.get_origin(ret) is list:
            returns = f"list[{_JSON_NAMES.get(typing.get_args(ret)[0], 'any')}]"
        return cls(func.__name__, func, tuple(params), inspect.getdoc(func) or "", returns)

    def signature_text(self) -> str:
        args = ", ".join(f"{p.name}: {p.type_name}" + ("" if p.required else f" = {p.default!r}") for p in self.params)
        return f"{self.name}({args}) -> {self.returns}"

    def schema(self) -> dict[str, Any]:
        """JSON-schema-like description (the OpenAI/BFCL `function` shape) for prompts and the CLI."""
        kinds = {int: "integer", float: "number", str: "string", bool: "boolean", list: "array", dict: "object"}
        props = {}
        for p in self.params:
            names = [kinds[t] for t in p.types]
            props[p.name] = {"type": names[0] if len(names) == 1 else names}
        return {"name": self.name, "description": self.doc,
                "parameters": {"type": "object", "properties": props,
                               "required": [p.name for p in self.params if p.required]}}

    def bind(self, arguments: dict[str, Any]) -> dict[str, Any]:
        """Check `arguments` against the signature; return them ready to pass, or raise CallError."""
        known = {p.name: p for p in self.params}
        unexpected = [a for a in arguments if a not in known]
        if unexpected:
            raise CallError("tool_error", f"unexpected argument {quote(unexpected[0])} for {self.signature_text()}; "
                            f"it takes only {', '.join(known) or 'no arguments'}. Remove it.")
        missing = [p.name for p in self.params if p.required and p.name not in arguments]
        if missing:
            raise CallError("tool_error", f"missing required argument {missing[0]!r} of {self.signature_text()}. "
                            f"Add \"{missing[0]}\": <{known[missing[0]].type_name}> to \"arguments\".")
        bound = {}
        for name, value in arguments.items():
            bound[name] = self._check_type(known[name], value)
        return bound

    def _check_type(self, param: Param, value: Any) -> Any:
        for t in param.types:
            if t is float and isinstance(value, (int, float)) and not isinstance(value, bool):
                if not math.isfinite(value):
                    raise CallError("tool_error", f"argument {param.name!r} of {self.name} must be a finite "
                                    f"number, got {value}.")
                return float(value)
            if t is int and isinstance(value, int) and not isinstance(value, bool):
                return value
            if t not in (int, float) and isinstance(value, t):
                return value
        got = "null" if value is None else _JSON_NAMES.get(type(value), type(value).__name__)
        shown = "" if value is None else " " + json.dumps(value)[:60]
        fix = ""
        if isinstance(value, str) and param.types[0] in (int, float):
            fix = " Pass the number without quotes."
        elif param.types[0] is str:
            fix = " Pass it as a quoted JSON string."
        raise CallError("tool_error", f"argument {param.name!r} of {self.name} must be {param.type_name}, "
                        f"got {got}{shown}.{fix}")


def _extract_json_text(text: str) -> str:
    """The part of `text` that should hold the call: inside tags, inside a fence, or the text itself."""
    if _TAG_OPEN in text:
        start = text.index(_TAG_OPEN) + len(_TAG_OPEN)
        end = text.find(_TAG_CLOSE, start)
        if end < 0:
            raise CallError("parse_error", f"unterminated {_TAG_OPEN} tag: close it with {_TAG_CLOSE}. {FORMAT_HINT}")
        return text[start:end]
    if "```" in text:
        fenced = _fenced_block(text)
        if fenced is None:
            raise CallError("parse_error", f"unterminated ``` code fence: close it with ```. {FORMAT_HINT}")
        return fenced
    return text


def _fenced_block(text: str) -> str | None:
    """The content of the first closed ```json fence, or None. WHY not one regex with a lazy body: on a
    fence that never closes, it backtracks quadratically (2 s for 16,000 characters of "```json\\n\\n...");
    here the opening is matched once and `str.find` looks for its closing (an opening without a closing
    after it means no later opening has one either: a fence's tag and spaces hold no backticks)."""
    opening = _FENCE_OPENING.search(text)
    if opening is None:
        return None
    closing = text.find("```", opening.end())
    return text[opening.end():closing] if closing >= 0 else None


def parse_call(text: str) -> tuple[str, dict[str, Any]]:
    """(name, arguments) of the one JSON call in `text`, or raise CallError("parse_error", ...)."""
    body = _extract_json_text(text)
    brace = body.find("{")
    if brace < 0:
        raise CallError("parse_error", f"no function call found (no JSON object in the reply). {FORMAT_HINT}")
    try:
        obj, _ = _DECODER.raw_decode(body, brace)
    except json.JSONDecodeError as exc:
        raise CallError("parse_error", f"invalid JSON: {exc.msg} at character {exc.pos - brace + 1} of the call. "
                        f"Use double quotes for keys and strings. {FORMAT_HINT}") from None
    except ValueError as exc:  # e.g. an integer literal beyond Python's digit limit
        raise CallError("parse_error", f"invalid JSON value: {exc}. {FORMAT_HINT}") from None
    except (RecursionError, MemoryError):
        raise CallError("parse_error", f"the JSON is nested too deeply to be a call (at most {MAX_NESTING} "
                        f"levels). {FORMAT_HINT}") from None
    try:
        check_data(obj, "the call", finite=False)  # a non-finite number is the tool's type error (bind)
    except ValueProblem as exc:
        raise CallError("parse_error", f"{exc}. {FORMAT_HINT}") from None
    if not isinstance(obj.get("name"), str):
        raise CallError("parse_error", f'the JSON object has no string "name" field. {FORMAT_HINT}')
    arguments = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(arguments, str):  # OpenAI-style: arguments as a JSON-encoded string
        try:
            arguments = decode_json(arguments, finite=False) if arguments.strip() else {}
        except ValueProblem as exc:
            raise CallError("parse_error", f'"arguments" is a string that is not valid JSON within the bounds '
                            f"({exc}). {FORMAT_HINT}") from None
    if not isinstance(arguments, dict):
        raise CallError("parse_error", f'"arguments" must be a JSON object mapping argument names to values, '
                        f"got {type(arguments).__name__}. {FORMAT_HINT}")
    return obj["name"], arguments


def resolve(specs: dict[str, ToolSpec], name: str) -> ToolSpec:
    """The spec called `name`, or a tool_error listing close matches."""
    spec = specs.get(name)
    if spec is None:
        close = close_matches(name, tuple(specs), 0.4)
        hint = f" Did you mean {', '.join(close)}?" if close else ""
        raise CallError("tool_error", f"unknown function {quote(name)}.{hint} Available: {', '.join(specs)}.")
    return spec


def format_call(name: str, arguments: dict[str, Any]) -> str:
    """Canonical one-line JSON call, as the walkthrough stores it."""
    return json.dumps({"name": name, "arguments": arguments})
