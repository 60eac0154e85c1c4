"""The step-time breakdown: nested phases add up, and every training step logs them."""

from __future__ import annotations

import json

import pytest
import torch

from agentgym_opd.profiling import PhaseMeter, metering, phase


class FakeClock:
    """Stands in for the meter's `time.perf_counter`: a phase lasts exactly what the test says, however
    loaded the machine (a real sleep of 50 ms can take several times that on a shared 2-core box)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def perf_counter(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_nested_phase_time_is_taken_out_of_its_parent_and_peaks_are_read(monkeypatch):
    import agentgym_opd.profiling as profiling

    clock = FakeClock()
    monkeypatch.setattr(profiling, "time", clock)  # only the meter's clock; nothing else sees it
    meter = PhaseMeter("cpu")
    with metering(meter):
        with meter.phase("update"):
            clock.sleep(0.05)
            with phase("teacher"):
                clock.sleep(0.1)
                held = torch.ones(64 * 2**20 // 4)  # 64 MiB touched inside the teacher phase
    record = meter.record()
    assert record["time/teacher_s"] == pytest.approx(0.1)
    assert record["time/update_s"] == pytest.approx(0.05)  # excludes the teacher's 0.1 s
    if "mem/teacher_peak_mb" in record:  # Linux: resident high-water marks
        assert record["mem/update_peak_mb"] >= record["mem/teacher_peak_mb"] > 64
    del held
    with phase("outside"):  # no meter active: a no-op
        pass
    assert "time/outside_s" not in meter.record()


@pytest.mark.slow
def test_every_opd_step_logs_rollout_teacher_and_update(tmp_path):
    from agentgym_opd.config import load_config
    from agentgym_opd.trainer import Trainer, algorithm_class

    overrides = {"algorithm": "opd", "env": "household/train", "output_dir": str(tmp_path), "model.student": "tiny",
                 "model.teacher": "tiny", "model.device": "cpu", "train.steps": 1, "train.checkpoint_every": 0,
                 "eval.every": 0, "rollout.tasks_per_step": 1, "rollout.max_turns": 2, "rollout.max_new_tokens": 6}
    config = load_config(None, [f"{k}={v}" for k, v in overrides.items()], algo_config_cls=algorithm_class("opd").Config)
    Trainer(config, env_overrides={"num_tasks": 4}, progress=False).train()
    record = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[0])
    for name in ("rollout", "teacher", "update"):
        assert record[f"time/{name}_s"] > 0
    assert record["time/teacher_s"] + record["time/update_s"] <= record["update_s"] + 1e-6
