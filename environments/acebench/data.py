"""ACEBench English `normal` data: one JSON-lines question file and one possible-answer file per category.

Where the files are (see `agentgym_opd.data`): `data_root=` / `$AGENTGYM_OPD_DATA` holding
`acebench/data_all/data_en/`, else the benchmark's own checkout (`$ACEBENCH_HOME/data_all/data_en`, the
layout of the ACEBench repository). Rows: `id`, `question` (the dialogue so far, "user: ...\\nsystem: ..."),
`function` (docs; some use `arguments` for `parameters`), `time` or `profile` (context). Possible answers:
`ground_truth` is `{name: {param: value}}` (a repeated call of one function is keyed `name_1`, `name_2`)
or a list of such dicts, each one accepted answer.
"""

from __future__ import annotations

import json
import os
from functools import lru_cache
from pathlib import Path
from typing import Any

from agentgym_opd.data import resolve_data_path

RELPATH = "acebench/data_all/data_en"
NORMAL_CATEGORIES = (
    "normal_atom_bool",
    "normal_atom_enum",
    "normal_atom_list",
    "normal_atom_number",
    "normal_atom_object_deep",
    "normal_atom_object_short",
    "normal_multi_turn_user_adjust",
    "normal_multi_turn_user_switch",
    "normal_preference",
    "normal_similar_api",
    "normal_single_turn_parallel_function",
    "normal_single_turn_single_function",
)
HOW_TO_GET = (
    "clone https://github.com/ACEBench/ACEBench and set $ACEBENCH_HOME to it (its data_all/data_en/ is used), "
    "or copy data_all/data_en to <root>/acebench/data_all/data_en"
)


def data_dir(data_root: str | os.PathLike | None = None) -> Path:
    home = os.environ.get("ACEBENCH_HOME")
    fallback = Path(home) / "data_all" / "data_en" if home else None
    return resolve_data_path(RELPATH, data_root=data_root, fallback=fallback, how_to_get=HOW_TO_GET)


def _read_jsonl(path: Path) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


@lru_cache(maxsize=None)
def _load(folder: str, category: str) -> tuple[tuple[dict, ...], dict[str, Any]]:
    if category not in NORMAL_CATEGORIES:
        raise ValueError(f"unknown ACEBench category {category!r}; known: {', '.join(NORMAL_CATEGORIES)}")
    root = Path(folder)
    rows = _read_jsonl(root / f"data_{category}.json")
    answers = {row["id"]: row["ground_truth"] for row in _read_jsonl(root / "possible_answer" / f"data_{category}.json")}
    missing = [row["id"] for row in rows if row["id"] not in answers]
    if missing:
        raise ValueError(f"ACEBench {category}: {len(missing)} questions have no possible answer (first: {missing[0]})")
    return tuple(rows), answers


def load_category(category: str, data_root: str | os.PathLike | None = None) -> tuple[tuple[dict, ...], dict[str, Any]]:
    """(rows in file order, possible answers by id) of one category."""
    return _load(str(data_dir(data_root)), category)
