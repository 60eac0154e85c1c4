"""BFCL's own protocol for prompt-mode models: its default system prompt and a decoder of replies.

`SYSTEM_PROMPT` is BFCL's default prompt (`DEFAULT_SYSTEM_PROMPT_FORMAT`: Python call syntax, no tool-call
tag, plain text, the "classic" style), assembled from the templates the `bfcl-eval` wheel ships, so it
follows the installed BFCL version. One part differs: BFCL appends the function docs to the system
prompt, while this env shows them in the first observation (a run has one system prompt for every
task), so the prompt's last section points there.

`parse_reply(text, finish_reason)` is an `ActionParser` (`agentgym_opd.action_parsing`). BFCL's decoder
(`default_decode_ast_prompting`) strips backticks, newlines and spaces around the reply, adds the list
brackets when missing and parses Python call syntax; output it cannot decode ends a multi-turn user
turn and is an abstention on the relevance categories. This parser keeps those rules and passes the
reply on as the action (the env parses the calls with its literal-only parser), accepting also what
models write around calls in practice:

* a fenced block (```python / ```json / bare ```), alone or after a sentence: its content is the action;
* multi-line calls or JSON (kept whole; only the first line is never taken alone);
* a reply cut at the token limit (`finish_reason == "length"`): its leading complete call list (or the
  whole reply, or a closed fenced block) when one parses (for Java / JavaScript answers: a closed
  `[name(...)]` list, left to the env's decoder for that language); a cut reply that starts a call but holds no
  complete one is a `parse_error`; a cut reply of prose is prose (it ends the turn, as in BFCL);
* a leading `<think>...</think>` block of a reasoning model is dropped.

An empty reply is a `parse_error`. The parser never raises on model text: every step is bounded by the
reply's length, and the call parser turns hostile text into errors.
"""

from __future__ import annotations

import re

from agentgym_opd.types import StepError
from environments.bfcl._bfcl import INSTALL_HINT
from environments.bfcl.calls import is_answer_object, parse_calls

try:
    from bfcl_eval.constants import default_prompts as _bfcl_prompts
except ImportError as exc:  # pragma: no cover - the bfcl extra is a dependency of these envs
    raise ImportError(INSTALL_HINT) from exc

FUNCTIONS_SHOWN_IN_OBSERVATION = "The functions you can invoke are listed in JSON format in the user's message."


def _default_system_prompt() -> str:
    """BFCL's default system prompt with the function list replaced by a pointer to the observation."""
    style = _bfcl_prompts.PROMPT_STYLE_TEMPLATES["classic"]
    tool_call_format = style["tool_call_no_tag"].format(
        output_format=_bfcl_prompts.OUTPUT_FORMAT_MAPPING["python"],
        param_types=_bfcl_prompts.PARAM_TYPE_MAPPING["python"])
    return _bfcl_prompts.PROMPT_TEMPLATE_MAPPING["plaintext"].format(
        persona=style["persona"], task=style["task"], tool_call_format=tool_call_format,
        multiturn_behavior=style["multiturn_behavior"], available_tools=FUNCTIONS_SHOWN_IN_OBSERVATION).strip()


SYSTEM_PROMPT: str = _default_system_prompt()

_THINK = re.compile(r"^\s*<think>.*?</think>", re.DOTALL)
_OPEN_FENCE = re.compile(r"```[A-Za-z0-9_+-]*[ \t]*\n?")  # no lazy body: linear in the text
_STARTS_A_CALL = re.compile(r"^(\[|\{|[A-Za-z_][\w.]*\()")  # `Sorry (none apply)` is prose, `f(` a call


def _strip_like_bfcl(text: str) -> str:
    """BFCL's first decoding step: drop backticks, newlines and spaces at both ends."""
    return text.strip("`\n ")


_CALL_LIST = re.compile(r"^\[\s*[A-Za-z_$][\w$.]*\s*\(")  # `[name(`: a call list in any language's syntax


def _parses(candidate: str, *, closed: bool = False) -> bool:
    """A complete answer: calls (possibly `[]`) that the env's Python-syntax parser reads, BFCL's agentic
    answer, or (`closed`: a bracket expression known to be closed) a call list in another language's
    syntax (Java, JavaScript), which the env decodes with BFCL's decoder for that language."""
    parsed = parse_calls(candidate)
    if (parsed.error is None and parsed.calls is not None) or is_answer_object(candidate):
        return True
    return closed and bool(_CALL_LIST.match(candidate))


def _leading_balanced(text: str) -> str | None:
    """The bracketed expression the text starts with (`[...]` or `{...}`), matched outside string
    literals, or None when it is not closed. One pass over the text."""
    if not text or text[0] not in "[{":
        return None
    depth, quote, escaped = 0, "", False
    for i, ch in enumerate(text):
        if quote:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == quote:
                quote = ""
        elif ch in "\"'":
            quote = ch
        elif ch in "[{(":
            depth += 1
        elif ch in "]})":
            depth -= 1
            if depth == 0:
                return text[: i + 1]
    return None


def _after_open_fence(text: str) -> str:
    """The text after the first opening fence (a fence the cut may have left unclosed), else the text."""
    opening = _OPEN_FENCE.search(text)
    return text[opening.end():] if opening else text


def _first_fenced_block(text: str) -> str | None:
    """The content of the first closed fenced block (what `re.search(r"```[tag]*[ \\t]*\\n?(.*?)```")` finds),
    or None. WHY not that regex: on a fence that never closes it backtracks quadratically (6 s for a
    16,000-character reply cut at the token limit); here each opening is tried once and `str.find` looks
    for its closing. Once an opening has no closing after it, no later opening can have one."""
    opening = _OPEN_FENCE.search(text)
    if opening is None:
        return None
    closing = text.find("```", opening.end())
    return text[opening.end():closing] if closing >= 0 else None


def _body(text: str) -> str:
    """The part of a reply that holds the answer: a closed fenced block's content, else what follows an
    unclosed opening fence, else the reply."""
    fenced = _first_fenced_block(text)
    if fenced is not None:
        return fenced.strip()
    return _after_open_fence(text).strip()


def parse_reply(text: str, finish_reason: str = "stop") -> tuple[str | None, StepError | None]:
    """A model reply -> the action for `BfclEnv`, or a `StepError` (see the module docstring)."""
    if not isinstance(text, str) or not text.strip():
        return None, StepError("parse_error", "The answer is empty. Reply with the function calls, e.g. "
                                              "[func_name(param=value)], or in plain text if none applies.")
    text = _THINK.sub("", text, count=1)
    body = _strip_like_bfcl(_body(text)) or text.strip()
    if finish_reason != "length":
        return body, None
    # Cut at the token limit: use the reply only where a complete answer is there.
    start = _strip_like_bfcl(_after_open_fence(text))
    if _parses(body):
        return body, None
    leading = _leading_balanced(start)
    if leading and _parses(leading, closed=True):
        return leading, None
    if "```" not in text and not _STARTS_A_CALL.match(start):
        return body, None  # prose that ran long is still prose (it ends the turn, or abstains)
    return None, StepError("parse_error", "The reply was cut off at the token limit before its function calls "
                                          "were complete. Write only the calls, e.g. [func_name(param=value)].")
