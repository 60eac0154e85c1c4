"""The layout shows the architecture (issue 36): evaluation apart from the bench, research instruments outside
the installed packages, and no module in ``evaluation/`` so long that its jobs blur together."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_EVALUATION_LINES = 500


def installed_packages() -> list[str]:
    """The top-level folders pyproject installs (its ``packages.find`` include patterns, less the wildcard)."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    return [p.rstrip("*") for p in config["tool"]["setuptools"]["packages"]["find"]["include"]]


def test_no_module_under_evaluation_is_over_the_line_cap():
    files = sorted((ROOT / "evaluation").rglob("*.py"))
    assert len(files) > 10
    long = {str(f.relative_to(ROOT)): n for f in files
            if (n := len(f.read_text(encoding="utf-8").splitlines())) > MAX_EVALUATION_LINES}
    assert not long, f"split these by job (at most {MAX_EVALUATION_LINES} lines each): {long}"


def test_no_research_probe_is_inside_an_installed_package():
    """Probes answer a research question once (scripts/probes/); the installed packages hold the product."""
    packages = installed_packages()
    assert {"agentgym_opd", "evaluation", "algorithms", "environments", "experience_bank"} <= set(packages)
    probes = [str(f.relative_to(ROOT)) for package in packages for f in (ROOT / package).rglob("*.py")
              if f.stem.endswith("_probe") or f.stem.startswith("sweep")]
    assert not probes, f"move these to scripts/probes/: {probes}"
    assert {f.stem for f in (ROOT / "scripts" / "probes").glob("*_probe.py")} >= {
        "base_model_probe", "distill_probe", "label_probe", "mistake_probe", "oracle_probe"}


def test_the_bench_is_a_subpackage_apart_from_evaluation_and_keeps_its_public_names():
    from evaluation import bench
    from evaluation.bench.pipeline import run_bench
    from evaluation.bench.settings import BenchSettings

    assert bench.run_bench is run_bench and bench.BenchSettings is BenchSettings
    assert all(hasattr(bench, name) for name in bench.__all__)
    # the shipped base pair sits beside the code that uses it (package-data of evaluation.bench)
    assert list((ROOT / "evaluation" / "bench" / "base_pair").glob("student-*/model/model.safetensors"))
    assert not (ROOT / "evaluation" / "base_pair").exists(), "the shipped pair lives in evaluation/bench/base_pair/"
