"""Model text -> environment action, or a `StepError` saying why there is no usable action.

Parsing lives outside the envs because the same env may be driven by models with different output
habits. A parser is a callable `(text, finish_reason) -> (action, None) | (None, StepError)`; the rollout
engine records the error as a turn instead of raising, so malformed output becomes a learning signal,
never a crash. Parsers are named in run configs: one of `PARSERS` or a `"module:function"` entry point.

Each parser follows one answer format a benchmark asks for:

| name | format | the action handed to the env |
|---|---|---|
| `text` | one command per turn (ALFWorld, ScienceWorld, TextWorld): `go to desk 1`, `Action: ...`, `> ...`, fenced | the command line |
| `json` | a function call as JSON or Python call syntax, bare, fenced or in `<tool_call>` tags | the first complete call |
| `code` | Python code in a ```python fence (HumanEval's format) or bare | the reply, minus a block cut at the token limit |
| `tags` | Search-R1: `<search> q </search>` or `<answer> a </answer>` | the reply up to the first closed tag |

A reply that reached the token limit (`finish_reason == "length"`) is parsed like any other: it fails
only when the cut removed the action (the only command line, the call's closing bracket, the code
block's closing fence), since a model that said its action and then kept talking still acted.
"""

from __future__ import annotations

import re
from typing import Callable, Optional

from agentgym_opd.types import StepError

# The system prompt of command envs (one action per turn; the first observation states the commands).
ONE_ACTION_PROMPT = "You are an agent in a text environment. Reply with exactly one action per turn."

ActionParser = Callable[[str, str], "tuple[Optional[str], Optional[StepError]]"]
Parsed = "tuple[str | None, StepError | None]"

_ACTION_PREFIX = re.compile(r"^\s*(?:\*\*)?action(?:\*\*)?\s*:\s*(?:\*\*)?\s*(.*)$", re.IGNORECASE)
_FENCE_LINE = re.compile(r"^\s*```[\w+-]*\s*$")
_CUT = "The answer was cut off at the token limit before {what} was complete. {fix}"


def _error(message: str) -> tuple[None, StepError]:
    return None, StepError("parse_error", message)


# ---------------------------------------------------------------------------------------------- text
def _clean_command(line: str) -> str:
    """`> go to desk 1`, `` `go to desk 1` ``, `"go to desk 1"` -> `go to desk 1` (the wrappers models add)."""
    line = line.strip()
    if line.startswith(">"):
        line = line[1:].strip()
    for quote in ("`", '"', "'"):
        if len(line) >= 2 and line[0] == quote and line[-1] == quote:
            line = line[1:-1].strip()
    return line


def parse_text_action(text: str, finish_reason: str = "stop") -> tuple[str | None, StepError | None]:
    """Command envs: the line after `Action:` if there is one, else the first non-empty line outside fences.

    At the token limit the last line is unfinished, so it counts only when an earlier line does not exist.
    """
    lines = text.splitlines()
    complete = lines if finish_reason != "length" or text.endswith("\n") else lines[:-1]
    candidates = [line for line in complete if line.strip() and not _FENCE_LINE.match(line)]
    for line in candidates:
        match = _ACTION_PREFIX.match(line)
        if match and _clean_command(match.group(1)):
            return _clean_command(match.group(1)), None
    for line in candidates:
        if _clean_command(line):
            return _clean_command(line), None
    if finish_reason == "length" and text.strip():
        return _error(_CUT.format(what="the first action line", fix="Reply with one short action line first, "
                                                                     "for example: go to countertop 1"))
    return _error("No action found in the answer. Reply with exactly one action, for example: go to countertop 1")


# ---------------------------------------------------------------------------------------------- json
_OPEN = {"{": "}", "[": "]", "(": ")"}


def _balanced_end(text: str, start: int) -> int | None:
    """Index just past the bracket that closes `text[start]`, skipping string literals; None if it never closes."""
    stack: list[str] = []
    quote: str | None = None
    i = start
    while i < len(text):
        ch = text[i]
        if quote:
            if ch == "\\":
                i += 2
                continue
            if ch == quote:
                quote = None
        elif ch in "\"'":
            quote = ch
        elif ch in _OPEN:
            stack.append(_OPEN[ch])
        elif ch in ")]}":
            if not stack or stack.pop() != ch:
                return None
            if not stack:
                return i + 1
        i += 1
    return None


_TOOL_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
_FENCED = re.compile(r"```[\w+-]*[^\n]*\n(.*?)```", re.DOTALL)


def parse_json_action(text: str, finish_reason: str = "stop") -> tuple[str | None, StepError | None]:
    """Function-call envs: the first complete call (in `<tool_call>` tags, in a fence, or a bare JSON /
    Python-call-list), cut out of any prose around it; plain text without any call passes through, since
    some benchmarks score a plain-text abstention."""
    stripped = text.strip()
    if not stripped:
        return _error("The answer is empty. Reply with one function call.")
    for pattern in (_TOOL_CALL, _FENCED):
        match = pattern.search(stripped)
        if match and match.group(1).strip():
            return match.group(1).strip(), None
    starts = [i for i in (stripped.find("{"), stripped.find("[")) if i >= 0]
    if starts:
        start = min(starts)
        end = _balanced_end(stripped, start)
        if end is not None:
            return stripped[start:end], None
    unclosed = (stripped.count("<tool_call>") > stripped.count("</tool_call>") or stripped.count("```") % 2 == 1
                or bool(starts))
    if finish_reason == "length" and unclosed:
        return _error(_CUT.format(what="the function call", fix="Reply with the call only, without explanations."))
    if stripped.count("<tool_call>") > stripped.count("</tool_call>"):
        return _error("Unterminated tool call: <tool_call> without </tool_call>.")
    if starts:
        return _error("Unterminated function call: an opening bracket ('{' or '[') is never closed.")
    return stripped, None


# ---------------------------------------------------------------------------------------------- code
def parse_code_action(text: str, finish_reason: str = "stop") -> tuple[str | None, StepError | None]:
    """Code envs: the reply as written (the env takes the last ```python block, else the bare code).

    At the token limit a code block whose closing fence was cut is dropped; the reply fails only if no
    complete block is left (the cut code cannot be the intended solution)."""
    if not text.strip():
        return _error("The answer is empty. Answer with your code in a ```python fenced block.")
    fences = [m.start() for m in re.finditer(r"^[ \t]*```", text, re.MULTILINE)]
    if finish_reason == "length" and len(fences) % 2 == 1:
        before = text[: fences[-1]]
        if len(fences) == 1 or not before.strip():
            return _error(_CUT.format(what="the code block", fix="Write shorter code and close the ``` fence."))
        return before.rstrip(), None
    return text, None


# ---------------------------------------------------------------------------------------------- tags
_CLOSED_TAG = re.compile(r"<(search|answer)>.*?</\1>", re.IGNORECASE | re.DOTALL)


def parse_tag_action(text: str, finish_reason: str = "stop") -> tuple[str | None, StepError | None]:
    """Search-R1's format: generation stops at the first `</search>` or `</answer>`, so the action is the
    reply up to that tag (reasoning before it included); a reply with no closed tag goes to the env whole,
    which accepts `answer: ...` lines too and says what it expects otherwise."""
    if not text.strip():
        return _error("The answer is empty. Write <search> query </search> or <answer> text </answer>.")
    match = _CLOSED_TAG.search(text)
    if match:
        return text[: match.end()].strip(), None
    if finish_reason == "length" and re.search(r"<(search|answer)>", text, re.IGNORECASE):
        return _error(_CUT.format(what="the <search> or <answer> tag", fix="Close the tag, e.g. <answer> Paris </answer>."))
    return text.strip(), None


PARSERS: dict[str, ActionParser] = {"text": parse_text_action, "json": parse_json_action, "code": parse_code_action,
                                    "tags": parse_tag_action}


def get_parser(kind: str | ActionParser) -> ActionParser:
    """A parser by short name (`PARSERS`), by `"module:function"` entry point, or a callable as is."""
    if callable(kind):
        return kind
    if isinstance(kind, str) and ":" in kind:
        from agentgym_opd.registry import load_entry_point

        try:
            parser = load_entry_point(kind)
        except (ImportError, ValueError) as err:
            raise ValueError(f"action parser {kind!r} cannot be loaded: {err}") from err
        if not callable(parser):
            raise ValueError(f"action parser {kind!r} is not callable")
        return parser
    if kind not in PARSERS:
        raise ValueError(f"unknown action parser {kind!r}; use one of {sorted(PARSERS)} or 'module:function' "
                         "naming a callable(text, finish_reason)")
    return PARSERS[kind]
