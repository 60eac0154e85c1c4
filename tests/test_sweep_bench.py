"""The hyper-parameter sweep: its grid and its choice read valid_seen only."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from agentgym_opd.registry import algorithm_registry

spec = importlib.util.spec_from_file_location("sweep_bench", Path(__file__).parents[1] / "scripts" / "sweep_bench.py")
sweep = importlib.util.module_from_spec(spec)
spec.loader.exec_module(sweep)


def test_every_registered_algorithm_has_a_grid_over_lr_temperature_and_its_knob():
    for algo in algorithm_registry.ids():
        points = sweep.grid(algo)
        assert {p["lr"] for p in points} == set(sweep.LEARNING_RATES)
        assert {p["temperature"] for p in points} == set(sweep.TEMPERATURES)
        assert any(k.startswith("algo.") for k in points[0]), algo
    assert sweep.SELECTION_SPLIT == "household/valid_seen"


def test_choice_reads_valid_seen_and_ignores_anything_else():
    points = [{"lr": 1e-4, "valid_seen": 0.2, "valid_unseen": 0.9}, {"lr": 3e-4, "valid_seen": 0.5, "valid_unseen": 0.1},
              {"lr": 1e-3, "valid_seen": None}]
    assert sweep.choose(points)["lr"] == 3e-4
    assert sweep.choose([{"lr": 1e-4, "valid_seen": None}]) is None
