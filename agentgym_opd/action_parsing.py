"""Model text -> environment action, or a `StepError` saying why there is no usable action.

Parsing lives outside the envs because the same env may be driven by models with different output
habits (a bare command, "Action: ...", a JSON call). A parser returns `(action, None)` or
`(None, StepError)`; the rollout engine records the error as a turn instead of raising, so malformed
output becomes a learning signal, never a crash.
"""

from __future__ import annotations

import re
from typing import Callable, Literal, Optional

from agentgym_opd.types import StepError

ActionParser = Callable[[str, str], "tuple[Optional[str], Optional[StepError]]"]
_ACTION_PREFIX = re.compile(r"^\s*action\s*:\s*(.*)$", re.IGNORECASE | re.MULTILINE)


def _over_long(finish_reason: str) -> StepError | None:
    if finish_reason == "length":
        return StepError("parse_error", "The answer was cut off at the token limit before it ended. "
                                        "Answer with one short action and stop.")
    return None


def parse_text_action(text: str, finish_reason: str = "stop") -> tuple[str | None, StepError | None]:
    """Command envs: the text after an "Action:" prefix if there is one, else the first non-empty line."""
    if (err := _over_long(finish_reason)) is not None:
        return None, err
    match = _ACTION_PREFIX.search(text)
    if match:
        action = match.group(1).strip()
    else:
        action = next((line.strip() for line in text.splitlines() if line.strip()), "")
    if not action:
        return None, StepError("parse_error", "No action found in the answer. Reply with exactly one action, "
                                              "for example: go to countertop 1")
    return action, None


def parse_json_action(text: str, finish_reason: str = "stop") -> tuple[str | None, StepError | None]:
    """JSON tool-call envs: pass the text through (the env parses it) unless the call is visibly unfinished."""
    if (err := _over_long(finish_reason)) is not None:
        return None, err
    stripped = text.strip()
    if not stripped:
        return None, StepError("parse_error", "The answer is empty. Reply with one JSON tool call.")
    if stripped.count("<tool_call>") > stripped.count("</tool_call>"):
        return None, StepError("parse_error", "Unterminated tool call: <tool_call> without </tool_call>.")
    if stripped.count("{") > stripped.count("}"):
        return None, StepError("parse_error", "Unterminated tool call: the JSON object is not closed ('{' without '}').")
    return stripped, None


def get_parser(kind: Literal["text", "json"] | ActionParser) -> ActionParser:
    if callable(kind):
        return kind
    parsers = {"text": parse_text_action, "json": parse_json_action}
    if kind not in parsers:
        raise ValueError(f"unknown action parser {kind!r}; use 'text', 'json' or a callable(text, finish_reason)")
    return parsers[kind]
