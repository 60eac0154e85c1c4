"""Where benchmark data lives: one configurable root, then each benchmark's own tooling.

Resolution order for a dataset folder `relpath` (e.g. "alfworld/json_2.1.1"):
1. an explicit `data_root=` (a keyword of `make`),
2. the environment variable `AGENTGYM_OPD_DATA`,
3. the benchmark's own location (`fallback`, e.g. `$ALFWORLD_DATA` or `alfworld-download`'s cache).
A folder laid out like the project's `shared/data` works as a root. A missing dataset raises
`DataNotFoundError` saying where it looked and how to get the data.
"""

from __future__ import annotations

import os
from pathlib import Path

DATA_ENV_VAR = "AGENTGYM_OPD_DATA"


class DataNotFoundError(FileNotFoundError):
    pass


def resolve_data_path(
    relpath: str,
    *,
    data_root: str | os.PathLike | None = None,
    fallback: str | os.PathLike | None = None,
    how_to_get: str = "",
) -> Path:
    tried: list[str] = []
    roots = []
    if data_root is not None:
        roots.append(("data_root=", Path(data_root)))
    if os.environ.get(DATA_ENV_VAR):
        roots.append((f"${DATA_ENV_VAR}", Path(os.environ[DATA_ENV_VAR])))
    for label, root in roots:
        candidate = root.expanduser() / relpath
        if candidate.exists():
            return candidate
        tried.append(f"{candidate} (from {label})")
    if fallback is not None:
        candidate = Path(fallback).expanduser()
        if candidate.exists():
            return candidate
        tried.append(f"{candidate} (the benchmark's default location)")
    where = "; ".join(tried) if tried else f"nowhere: neither data_root= nor ${DATA_ENV_VAR} is set"
    raise DataNotFoundError(
        f"dataset {relpath!r} not found. Looked in: {where}. "
        f"Set ${DATA_ENV_VAR} (or pass data_root=) to a folder holding {relpath}/"
        + (f", or {how_to_get}" if how_to_get else "")
        + "."
    )
