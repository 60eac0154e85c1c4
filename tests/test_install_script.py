"""scripts/install.sh: which Debian packages it adds, Java 17+ included for ScienceWorld and TextWorldExpress.

The script only defines its functions when sourced, so these run them against fake commands on PATH."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "install.sh"


def _fake(bin_dir: Path, name: str, body: str) -> None:
    path = bin_dir / name
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)


def missing_packages(tmp_path: Path, java_version: str | None, extras: str = "dev,scienceworld",
                     archive_has_17: bool = True) -> list[str]:
    """`missing_system_packages` with chromium, valgrind and bwrap present, and `java -version` printing
    ``java_version`` (no java at all when None)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for tool in ("sed", "awk"):
        (bin_dir / tool).unlink(missing_ok=True)
        (bin_dir / tool).symlink_to(shutil.which(tool))
    for present in ("chromium", "valgrind", "bwrap"):
        _fake(bin_dir, present, "exit 0")
    (bin_dir / "java").unlink(missing_ok=True)
    if java_version is not None:
        _fake(bin_dir, "java", f"echo '{java_version}' >&2")
    _fake(bin_dir, "apt-cache", "exit 0" if archive_has_17 else "exit 100")
    out = subprocess.run([shutil.which("bash"), "-c", f"source {SCRIPT} && missing_system_packages"],
                         env={"PATH": str(bin_dir), "EXTRAS": extras}, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return sorted(out.stdout.split())


@pytest.mark.parametrize("version, needed", [
    (None, True),
    ('java version "1.8.0_292"', True),
    ('openjdk version "11.0.2" 2019-01-15', True),
    ('openjdk version "17.0.15" 2025-04-15', False),
    ('openjdk version "21" 2023-09-19', False),
])
def test_java_17_is_installed_when_missing_or_older(tmp_path, version, needed):
    python3 = [] if Path("/usr/bin/python3").exists() else ["python3"]
    assert missing_packages(tmp_path, version) == sorted((["openjdk-17-jre-headless"] if needed else []) + python3)


def test_java_only_for_the_extras_that_run_jars_and_a_newer_runtime_where_17_is_gone(tmp_path):
    python3 = [] if Path("/usr/bin/python3").exists() else ["python3"]
    assert missing_packages(tmp_path, None, extras="dev,bank") == python3
    assert missing_packages(tmp_path, None, extras="dev,textworld-express") == sorted(["openjdk-17-jre-headless", *python3])
    assert missing_packages(tmp_path, None, archive_has_17=False) == sorted(["default-jre-headless", *python3])
