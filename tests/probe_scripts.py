"""The research probes are scripts in scripts/probes/, outside every installed package (issue 36): a probe runs
as ``python scripts/probes/NAME.py``, with its own folder first on ``sys.path``, which is how the probes import
one another. `import_probe` gives a test the same view: that folder on ``sys.path``, the probe imported by its
file name."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType

PROBES_DIR = Path(__file__).resolve().parents[1] / "scripts" / "probes"


def import_probe(name: str) -> ModuleType:
    """The probe ``scripts/probes/<name>.py`` as a module (its folder put on ``sys.path`` once)."""
    if not (PROBES_DIR / f"{name}.py").is_file():
        raise FileNotFoundError(f"no probe {name!r} in {PROBES_DIR}")
    if str(PROBES_DIR) not in sys.path:
        sys.path.insert(0, str(PROBES_DIR))
    return importlib.import_module(name)
