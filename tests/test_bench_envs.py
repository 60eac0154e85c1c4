"""The env benchmarks compare like with like: every mode plays the same actions, and the tools measure."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import bench_envs_instructions  # noqa: E402
import bench_household  # noqa: E402
import bench_tooluse  # noqa: E402
from _timing import paired_rounds  # noqa: E402

from environments.household.env import HouseholdEnv  # noqa: E402
from environments.tooluse.env import ToolUseEnv  # noqa: E402


@pytest.mark.parametrize("module, env_class", [(bench_household, HouseholdEnv), (bench_tooluse, ToolUseEnv)])
def test_every_mode_plays_the_same_actions(module, env_class, monkeypatch):
    played: list[str] = []
    act = env_class._act
    monkeypatch.setattr(env_class, "_act", lambda self, action: (played.append(action), act(self, action))[1])
    modes, _ = module.episode_modes()
    assert set(modes) == {"wrapped", "raw", "floor"}
    trajectories = {}
    for name, episode in modes.items():
        played.clear()
        steps = [episode(k) for k in range(6)]
        trajectories[name] = (steps, list(played))
    assert trajectories["wrapped"] == trajectories["raw"] == trajectories["floor"]
    assert sum(trajectories["raw"][0]) == len(trajectories["raw"][1]) > 6  # every step reached the world


def test_new_text_modes_play_the_same_actions(monkeypatch):
    played: list[str] = []
    act = HouseholdEnv._act
    monkeypatch.setattr(HouseholdEnv, "_act", lambda self, action: (played.append(action), act(self, action))[1])
    trajectories = {}
    for name, episode in bench_household.new_text_modes().items():
        played.clear()
        trajectories[name] = ([episode(k) for k in range(4)], list(played))
    assert len({repr(t) for t in trajectories.values()}) == 1 and len(played) > 4


def test_paired_rounds_reports_every_mode_against_the_baseline():
    def work(n):
        return lambda k: sum(range(n)) * 0 + 1

    timing = paired_rounds({"base": work(200), "more": work(2000)}, seconds=0.05, baseline="base", block_s=0.005)
    assert timing.rounds >= 3 and set(timing.rates) == {"base", "more"}
    assert len(timing.ratios["more"]) == timing.rounds and timing.ratios["more"] == sorted(timing.ratios["more"])
    median, q1, q3 = timing.overhead("more")
    assert q1 <= median <= q3 and median > 0  # ten times the work takes longer, however noisy the machine


@pytest.mark.slow
def test_instruction_counts_come_from_valgrind():
    per_step = bench_envs_instructions.count("bench_tooluse", episodes=4)
    assert set(per_step) == {"wrapped", "raw", "floor"}
    for measure in ("instructions", "cycles"):
        wrapped, floor, raw = (per_step[mode][measure] for mode in ("wrapped", "floor", "raw"))
        # the wrapper does everything the raw loop does and more, so it can only cost more
        assert wrapped > floor > raw > 1000, measure
    # cache misses and mispredictions only add to the instructions
    assert per_step["raw"]["cycles"] > per_step["raw"]["instructions"]


def test_cycle_estimate_is_kcachegrinds_formula():
    events = {"Ir": 1000, "I1mr": 1, "D1mr": 2, "D1mw": 3, "ILmr": 1, "DLmr": 0, "DLmw": 1, "Bcm": 4, "Bim": 5}
    assert bench_envs_instructions.estimated_cycles(events) == 1000 + 10 * (6 + 9) + 100 * 2
