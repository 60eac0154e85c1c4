"""One data variable: `AGENTGYM_OPD_DATA` names the benchmark data for the tests as for the runtime;
`AGENTGYM_OPD_TEST_DATA` is a deprecated alias that still works."""

from __future__ import annotations

from pathlib import Path

from conftest import DEFAULT_DATA, benchmark_data_root

from agentgym_opd.data import DATA_ENV_VAR, resolve_data_path


def test_the_runtime_variable_names_the_tests_data_too(tmp_path, monkeypatch):
    (tmp_path / "household").mkdir()
    root, note = benchmark_data_root({DATA_ENV_VAR: str(tmp_path)})
    assert root == tmp_path and note is None
    monkeypatch.setenv(DATA_ENV_VAR, str(tmp_path))  # and the runtime finds its datasets under the same root
    assert resolve_data_path("household") == tmp_path / "household"


def test_the_old_test_variable_still_works_with_a_deprecation_note(tmp_path):
    root, note = benchmark_data_root({"AGENTGYM_OPD_TEST_DATA": str(tmp_path)})
    assert root == tmp_path and "deprecated" in note and DATA_ENV_VAR in note
    root, note = benchmark_data_root({"AGENTGYM_OPD_TEST_DATA": str(tmp_path), DATA_ENV_VAR: "/elsewhere"})
    assert root == Path("/elsewhere") and note is None  # the one variable wins


def test_unset_means_shared_data_beside_the_repository():
    assert benchmark_data_root({}) == (DEFAULT_DATA, None)
    assert DEFAULT_DATA.name == "data" and DEFAULT_DATA.parent.name == "shared"
