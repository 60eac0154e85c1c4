"""Turn a submission into code, and code plus a problem's tests into one program for the sandbox.

Why programs are text: the sandbox runs a fresh interpreter, so everything the tests need (the
reference solution for HumanEval+'s generated inputs included) is written into the program itself.
Nothing here executes the submission; `ast.parse` only checks its syntax.
"""

from __future__ import annotations

import ast
import json
import re

from environments.code.datasets import CodeProblem

_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)(?:```|\Z)", re.DOTALL)


def extract_code(text: str) -> str:
    """The code of a reply: the last ```python block, else the last fenced block, else the bare text.

    The *last* block, because models that reason first put their final answer at the end. An unclosed
    fence (generation cut at the stop string) counts up to the end of the text.
    """
    blocks = _FENCE.findall(text)
    if not blocks:
        return text.strip("\n")
    python_blocks = [body for lang, body in blocks if lang.lower() in ("python", "py", "python3")]
    return (python_blocks or [body for _, body in blocks])[-1].strip("\n")


def _defines(code: str, name: str | None) -> bool:
    try:
        tree = ast.parse(code)
    except SyntaxError:
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
        ast.parse(source)
    except SyntaxError as exc:
        where = f"line {exc.lineno}" if exc.lineno else "somewhere"
        text = (exc.text or "").rstrip()
        return f"SyntaxError at {where}: {exc.msg}" + (f"\n    {text}" if text else "")
    except (ValueError, MemoryError, RecursionError) as exc:  # null bytes, absurd nesting
        return f"the code cannot be parsed: {exc}"
    return None


_PLUS_HARNESS = '''
import copy as _copy, json as _json, math as _math
_REFERENCE = {{}}
exec(compile({reference!r}, "<reference>", "exec"), _REFERENCE)
_INPUTS = _json.loads({inputs!r})
_EXPECTED = [_REFERENCE[{entry!r}](*_copy.deepcopy(_args)) for _args in _INPUTS]
_ATOL = {atol!r}
'''

_PLUS_CHECK = '''
def _same(got, expected, atol):
    if isinstance(expected, float) or isinstance(got, float):
        if isinstance(got, bool) or not isinstance(got, (int, float)):
            return False
        if _math.isnan(expected) and _math.isnan(got):
            return True
        return _math.isclose(got, expected, rel_tol=1e-7, abs_tol=atol or 1e-6)
    if isinstance(expected, (list, tuple)) and isinstance(got, (list, tuple)):
        return len(got) == len(expected) and all(_same(g, e, atol) for g, e in zip(got, expected))
    return got == expected

def _short(value):
    text = repr(value)
    return text if len(text) <= 300 else text[:300] + "..."

for _args, _expected in zip(_INPUTS, _EXPECTED):
    _got = {entry}(*_copy.deepcopy(_args))
    assert _same(_got, _expected, _ATOL), f"{entry}(*{{_short(_args)}}) returned {{_short(_got)}}, expected {{_short(_expected)}}"
'''


def test_program(problem: CodeProblem, code: str) -> str:
    """The program that exits 0 exactly when `code` passes all of the problem's tests."""
    return test_program_parts(problem, code)[0]


def test_program_parts(problem: CodeProblem, code: str) -> tuple[str, int]:
    """(program, first line of its test part): the sandbox reports the failing line from there on."""
    prefix, tests = _split_program(problem, code)
    return prefix + tests, prefix.count("\n") + 1


def _split_program(problem: CodeProblem, code: str) -> tuple[str, str]:
    candidate = candidate_source(problem, code)
    if problem.dataset == "humaneval":
        return f"{candidate}\n", f"\n{problem.test_code}\n\ncheck({problem.entry_point})\n"
    if problem.dataset == "humanevalplus":
        inputs = list(problem.extra["base_input"]) + list(problem.extra["plus_input"])
        harness = _PLUS_HARNESS.format(reference=problem.solution, inputs=json.dumps(inputs),
                                       entry=problem.entry_point, atol=problem.extra.get("atol", 0.0))
        # The reference runs before the candidate is defined, so the candidate cannot alter the expected outputs.
        return (f"{harness}\n{candidate}\n", f"\n{problem.test_code}\n\ncheck({problem.entry_point})\n"
                + _PLUS_CHECK.format(entry=problem.entry_point))
    return f"{candidate}\n{problem.setup_code}\n", "\n" + "\n".join(problem.tests) + "\n"
