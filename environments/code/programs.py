"""Turn a submission into the candidate module, and a problem's tests into the checker's data.

The candidate and the tests never share a process (see `environments.code.sandbox.run_checked`), so
the tests travel as data, not as code appended to the submission. Nothing here executes the
submission; `agentgym_opd.bounded.parse_python` only checks its syntax, and turns every way Python's parser
fails on hostile text (`MemoryError` on a long run of unary operators, `RecursionError` on a long chain
of `+`, null bytes) into the same clear `parse_error`. Everything here is linear in the submission, whose
length the env caps (`max_action_chars`).
"""

from __future__ import annotations

import ast
import re

from agentgym_opd.bounded import parse_python, UnparsableText
from environments.code.datasets import CodeProblem
from environments.code.sandboxed import wire

_LANGUAGE = re.compile(r"[A-Za-z0-9_+-]*")


def fenced_blocks(text: str) -> list[tuple[str, str]]:
    """(language tag, body) of each fenced block: "```" + an info line, then the body up to the next "```"
    or the end of the text (a fence cut at the stop string), in order.

    WHY string operations and not one regex: `r"```[ \\t]*([tag]*)[^\\n]*\\n(.*?)(?:```|\\Z)"` backtracks
    quadratically on a long info line with no newline ("```" + 16,000 spaces). Here every character is
    looked at a bounded number of times; an opening with no newline after it ends the search (no later
    opening has one either)."""
    blocks, pos = [], 0
    while (start := text.find("```", pos)) >= 0:
        newline = text.find("\n", start + 3)
        if newline < 0:
            break
        language = _LANGUAGE.match(text[start + 3:newline].lstrip(" \t")).group(0)
        end = text.find("```", newline + 1)
        blocks.append((language, text[newline + 1:] if end < 0 else text[newline + 1:end]))
        if end < 0:
            break
        pos = end + 3
    return blocks


def extract_code(text: str) -> str:
    """The code of a reply: the last ```python block, else the last fenced block, else the bare text.

    The *last* block, because models that reason first put their final answer at the end. An unclosed
    fence (generation cut at the stop string) counts up to the end of the text.
    """
    blocks = fenced_blocks(text)
    if not blocks:
        return text.strip("\n")
    python_blocks = [body for lang, body in blocks if lang.lower() in ("python", "py", "python3")]
    return (python_blocks or [body for _, body in blocks])[-1].strip("\n")


def _defines(code: str, name: str | None) -> bool:
    try:
        tree = parse_python(code)
    except UnparsableText:
        return False
    return any(isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name for node in tree.body)


def _prompt_imports(prompt: str) -> str:
    """Top-level import lines of a HumanEval prompt (e.g. `from typing import List`) that a full function needs."""
    return "\n".join(line for line in prompt.splitlines() if line.startswith(("import ", "from ")))


def candidate_source(problem: CodeProblem, code: str) -> str:
    """The complete candidate module. HumanEval accepts a full function or, in the original completion
    format, only the body that continues the prompt (detected by the entry point not being defined)."""
    if problem.dataset in ("humaneval", "humanevalplus") and not _defines(code, problem.entry_point):
        # A body continuing the prompt. The env strips the action, so the first line may have lost its
        # indentation: restore it where that makes the completion parse.
        for body in (code, "    " + code):
            if body.startswith((" ", "\t")) and _defines(problem.prompt + body, problem.entry_point):
                return problem.prompt + body + "\n"
        return _prompt_imports(problem.prompt) + "\n" + code + "\n"
    if problem.dataset in ("humaneval", "humanevalplus"):
        return _prompt_imports(problem.prompt) + "\n" + code + "\n"
    return code + "\n"


def syntax_error(source: str) -> str | None:
    """A model-readable description of the first syntax error, or None when the code parses."""
    try:
        parse_python(source)
    except UnparsableText as exc:
        return exc.message
    return None


def test_spec(problem: CodeProblem) -> dict:
    """The problem's tests as data for the sandbox's checker (`environments/code/sandboxed/supervisor.py`).

    The checker runs this benchmark code in its own process and calls the candidate in another one, so
    the candidate can neither skip the tests nor answer for them. HumanEval: the prompt (for helpers such
    as `poly`) and `check`; HumanEval+ adds every base + plus input, compared with the reference solution's
    output computed in the checker (floats within EvalPlus's tolerance); MBPP: the setup code and the asserts.
    """
    if problem.dataset in ("humaneval", "humanevalplus"):
        spec = {"kind": problem.dataset, "prompt": problem.prompt, "test_code": problem.test_code,
                "entry_point": problem.entry_point}
        if problem.dataset == "humanevalplus":
            inputs = list(problem.extra["base_input"]) + list(problem.extra["plus_input"])
            spec.update(reference=problem.solution, inputs=wire.encode([list(args) for args in inputs]),
                        atol=problem.extra.get("atol", 0.0))
        return spec
    return {"kind": "asserts", "setup": problem.setup_code, "tests": list(problem.tests), "entry_point": problem.entry_point,
            "reference_names": reference_names(problem.solution)}


def reference_names(solution: str) -> list[str]:
    """The top-level functions, classes and variables of the reference solution: the names the tests
    expect the candidate to provide (see `plan_names` in the checker)."""
    try:
        tree = parse_python(solution)
    except UnparsableText:
        return []
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(t.id for t in targets if isinstance(t, ast.Name))
    return sorted(names)
