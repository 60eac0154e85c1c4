"""Kill a training run mid-way, resume it, and get the uninterrupted run's weights and metrics back.

Both runs go through the real CLI in subprocesses (cwd outside the repo so the installed entry points
are the ones found). SFT checks that weights and optimiser state survive; GRPO at temperature 1 checks
the sampling RNG (its advantages are 0 on the untrained tiny model, so it checks rollouts, not updates).
Run A trains straight through; run B is SIGKILLed as soon as its first checkpoint
lands, then continued with ``--resume``. Everything that is not a wall-clock timing must match.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

STEPS = 8
TIMING_FIELDS = {"rollout_s", "update_s", "rollout_tokens_per_s", "train_tokens_per_s"}


def train_command(algo: str, out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "agentgym_opd.cli", "train", "--algo", algo, "--env", "household/train",
            "--student", "tiny", "--output-dir", str(out), "--no-progress", "--env-arg", "num_tasks=4",
            "model.device=cpu", f"train.steps={STEPS}", "train.checkpoint_every=2", "train.lr=1e-3",
            "rollout.tasks_per_step=2", "rollout.max_turns=3", "rollout.max_new_tokens=8",
            "eval.every=4", "eval.episodes=2", *extra]


def run_to_end(cmd: list[str], cwd: Path) -> None:
    result = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]


def kill_after_first_checkpoint(cmd: list[str], cwd: Path, out: Path) -> str:
    """Start ``cmd``, SIGKILL it once ``checkpoints/latest`` names a step; return that step's folder name."""
    latest = out / "checkpoints" / "latest"
    proc = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 240
    while not latest.is_file() or not latest.read_text().strip():
        if proc.poll() is not None:
            raise AssertionError(f"run ended (rc {proc.returncode}) before its first checkpoint: {proc.stderr.read()[-2000:]}")
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError("no checkpoint within 240 s")
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL, "the run finished before it could be killed: the test needs more steps"
    return latest.read_text().strip()


def metrics(out: Path) -> list[dict]:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return [{k: v for k, v in row.items() if k not in TIMING_FIELDS and not k.startswith(("time/", "mem/"))}
            for row in rows]  # wall-clock seconds and resident memory are measurements, not results


def final_weights(out: Path) -> dict[str, torch.Tensor]:
    return torch.load(out / "checkpoints" / f"step_{STEPS}" / "trainer_state.pt", weights_only=False)["trainable"]


@pytest.mark.parametrize("algo,extra", [("sft", ()), ("grpo", ("rollout.group_size=2", "rollout.temperature=1.0"))])
@pytest.mark.slow
def test_killed_and_resumed_run_equals_the_uninterrupted_run(tmp_path, algo, extra):
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    run_to_end(train_command(algo, straight, *extra), tmp_path)

    killed_at = kill_after_first_checkpoint(train_command(algo, killed, *extra), tmp_path, killed)
    killed_step = int(killed_at.removeprefix("step_"))
    assert 0 < killed_step < STEPS
    run_to_end(train_command(algo, killed, *extra, "--resume", str(killed)), tmp_path)

    a, b = metrics(straight), metrics(killed)
    assert [r["step"] for r in b] == list(range(1, STEPS + 1)), "resume must drop rows past the checkpoint, keep the rest"
    for row_a, row_b in zip(a, b):
        assert row_a.keys() == row_b.keys()
        for key in row_a:
            assert row_b[key] == pytest.approx(row_a[key], rel=1e-5, abs=1e-6), (algo, row_a["step"], key)
    assert any(k.startswith("eval/") for k in a[3]), "eval rows must be part of what is compared"

    wa, wb = final_weights(straight), final_weights(killed)
    assert wa.keys() == wb.keys() and wa
    for name in wa:
        torch.testing.assert_close(wb[name], wa[name], rtol=1e-5, atol=1e-6, msg=lambda m, n=name: f"{n}: {m}")
    if algo == "sft":  # the optimiser state must survive the kill: the weights keep moving after it
        initial = torch.load(straight / "checkpoints" / "step_2" / "trainer_state.pt", weights_only=False)["trainable"]
        assert any(not torch.equal(initial[n], wa[n]) for n in wa), "training must move the weights after step 2"
    else:  # the untrained tiny model never succeeds, so GRPO's advantages are 0; what resume must restore
        # here is the sampling RNG: the sampled rollouts differ from step to step and still match run A's
        # (every untrained reply fills max_new_tokens, so count the whole sequences: the env's answers echo
        # the sampled text, and their length varies with it)
        assert len({r["tokens"] for r in a}) > 1, "rollouts at temperature 1 should vary across steps"


@pytest.mark.slow
def test_resume_from_a_folder_without_a_checkpoint_is_a_clear_error(tmp_path):
    empty = tmp_path / "empty_run"
    empty.mkdir()
    result = subprocess.run(train_command("sft", tmp_path / "out", "--resume", str(empty)), cwd=tmp_path,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 2, result.stderr[-2000:]
    assert "no checkpoint" in result.stderr and str(empty) in result.stderr
    assert "Traceback" not in result.stderr


def test_keep_checkpoints_leaves_the_newest_and_resume_still_finds_it(tmp_path):
    """``train.keep_checkpoints=1`` with a checkpoint every step: one checkpoint on disk, the newest, which
    `latest` names and a resume loads (a SmolLM2 checkpoint is ~2 GB; a resumable bench run keeps one)."""
    from agentgym_opd.config import load_config
    from agentgym_opd.trainer import Trainer, algorithm_class

    def trainer(steps: int) -> Trainer:
        overrides = {"algorithm": "sft", "env": "household/train", "output_dir": str(tmp_path / "run"),
                     "model.student": "tiny", "model.device": "cpu", "train.steps": steps, "train.checkpoint_every": 1,
                     "train.keep_checkpoints": 1, "train.lr": 1e-3, "rollout.tasks_per_step": 1, "rollout.max_turns": 2,
                     "rollout.max_new_tokens": 4, "eval.every": 0}
        config = load_config(None, [f"{k}={v}" for k, v in overrides.items()], algo_config_cls=algorithm_class("sft").Config)
        return Trainer(config, progress=False)

    trainer(3).train()
    checkpoints = tmp_path / "run" / "checkpoints"
    assert sorted(p.name for p in checkpoints.glob("step_*")) == ["step_3"]
    assert (checkpoints / "latest").read_text() == "step_3"
    resumed = trainer(4)
    resumed.resume(tmp_path / "run")
    assert resumed.step == 3
    resumed.train()
    assert sorted(p.name for p in checkpoints.glob("step_*")) == ["step_4"]
