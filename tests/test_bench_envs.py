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


def test_paired_rounds_reports_every_mode_against_the_baseline():
    def work(n):
        return lambda k: sum(range(n)) * 0 + 1

    timing = paired_rounds({"base": work(200), "more": work(2000)}, seconds=0.05, baseline="base", block_s=0.005)
    assert timing.rounds >= 3 and set(timing.rates) == {"base", "more"}
    assert len(timing.ratios["more"]) == timing.rounds and timing.ratios["more"] == sorted(timing.ratios["more"])
    median, q1, q3 = timing.overhead("more")
    assert q1 <= median <= q3 and median > 0  # ten times the work takes longer, however noisy the machine


def test_instruction_counts_come_from_valgrind():
    per_step = bench_envs_instructions.count("bench_tooluse", episodes=4)
    assert set(per_step) == {"wrapped", "raw", "floor"}
    # the wrapper does everything the raw loop does and more, so it can only cost more instructions
    assert per_step["wrapped"] > per_step["floor"] > per_step["raw"] > 1000
