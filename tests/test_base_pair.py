"""The shipped household base pair: found before the cache, named by short names, rebuilt and checked."""

from __future__ import annotations

import argparse
import dataclasses
import shutil
import subprocess
import sys

import pytest

from evaluation.bench import base_models
from evaluation.bench.base_models import (STUDENT_SPEC, TEACHER_SPEC, BaseModelSpec, base_label, build_base_model,
                                          ensure_base_model, shipped_model_dir)

MINI = BaseModelSpec("mini", hidden=16, layers=1, heads=2, steps=2, batch_size=2, warmup_steps=1, train_tasks=6,
                     context_share=0.5, max_turns=40)


def test_the_default_pair_ships_with_the_repository():
    for spec in (STUDENT_SPEC, TEACHER_SPEC):
        model = shipped_model_dir(spec)
        assert (model / "model.safetensors").is_file() and (model / "tokenizer.json").is_file(), (
            f"{model} missing: ship the pair (agentgym-opd base-pair build, then copy the cached folder there)")
        assert base_models.cached_base_model(spec) == model  # used before any cache


def test_short_names_resolve_to_the_shipped_pair_and_records_name_it_as_the_bench_does():
    from agentgym_opd.policy.loading import model_name, model_path, resolve_policy

    assert model_path("household-student") == str(shipped_model_dir(STUDENT_SPEC))
    assert model_path("household-teacher") == str(shipped_model_dir(TEACHER_SPEC))
    assert resolve_policy("household-student").student == base_label(STUDENT_SPEC)
    assert model_name("household-teacher") == base_label(TEACHER_SPEC)


@pytest.mark.slow
def test_a_shipped_model_is_used_and_nothing_is_built(tmp_path, monkeypatch):
    monkeypatch.setenv("AGENTGYM_OPD_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(base_models, "SHIPPED_PAIR_DIR", tmp_path / "shipped")
    built = build_base_model(MINI, tmp_path / "shipped" / f"mini-{MINI.key()}" / "model", progress=False)
    monkeypatch.setattr(base_models, "build_base_model", lambda *a, **k: pytest.fail("rebuilt a shipped model"))
    lines: list[str] = []
    assert ensure_base_model(MINI, progress=False, log=lines.append) == built and not lines
    assert not (tmp_path / "cache").exists()


@pytest.mark.slow
def test_a_rebuild_ignores_the_shipped_model_and_reports_progress(tmp_path, monkeypatch):
    monkeypatch.setenv("AGENTGYM_OPD_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(base_models, "SHIPPED_PAIR_DIR", tmp_path / "shipped")
    shipped = build_base_model(MINI, tmp_path / "shipped" / f"mini-{MINI.key()}" / "model", progress=False)
    progress = tmp_path / "mini.progress"
    rebuilt = ensure_base_model(MINI, progress=False, log=lambda line: None, shipped=False, progress_file=progress)
    assert rebuilt != shipped and rebuilt == base_models.base_model_dir(MINI) / "model"
    assert progress.read_text().strip() == str(MINI.steps)


def _check_args(**changes):
    return argparse.Namespace(**{"action": "check", "only": "student", "jobs": 1, "episodes": 4,
                                 "no_progress": True, **changes})


@pytest.mark.slow
def test_check_says_identical_for_a_bit_identical_rebuild_and_compares_by_evaluation_otherwise(tmp_path, monkeypatch, capsys):
    import torch
    from safetensors.torch import load_file, save_file

    from evaluation.bench import base_pair_command

    monkeypatch.setenv("AGENTGYM_OPD_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(base_models, "SHIPPED_PAIR_DIR", tmp_path / "shipped")
    mini_student = dataclasses.replace(MINI, name="student")
    monkeypatch.setattr(base_models, "STUDENT_SPEC", mini_student)
    assert base_pair_command.run(_check_args()) == 2  # nothing rebuilt yet: a clear error
    assert "base-pair build" in capsys.readouterr().err
    shipped = build_base_model(mini_student, shipped_model_dir(mini_student), progress=False)
    rebuilt = base_models.base_model_dir(mini_student) / "model"
    shutil.copytree(shipped, rebuilt)
    assert base_pair_command.run(_check_args()) == 0
    assert "identical to the shipped weights" in capsys.readouterr().out

    weights = load_file(str(rebuilt / "model.safetensors"))
    name = next(iter(weights))
    weights[name] = weights[name] + 1e-3 * torch.ones_like(weights[name])
    save_file(weights, str(rebuilt / "model.safetensors"), metadata={"format": "pt"})
    code = base_pair_command.run(_check_args())
    out = capsys.readouterr()
    assert "weights differ (largest difference 0.001" in out.err
    assert "rebuilt - shipped" in out.out and "exact paired 95% interval" in out.out
    assert code == (0 if "agrees" in out.out else 1)


def test_the_bench_forecasts_the_build_only_for_a_pair_it_must_build(tmp_path, monkeypatch):
    from evaluation.bench.jobs import BaseModelJob, _steps_done
    from evaluation.bench.settings import BenchSettings, base_build_estimate

    settings = BenchSettings.full()
    assert base_build_estimate(settings, teacher=True, workers=2) == 0.0  # the shipped pair
    monkeypatch.setenv("AGENTGYM_OPD_CACHE", str(tmp_path / "cache"))
    other = BenchSettings.full(base_steps=500)  # other settings: not shipped, not cached
    student, teacher = other.base_specs()
    forecast = base_build_estimate(other, teacher=True, workers=2)
    assert forecast == max(base_models.estimated_build_seconds(student), base_models.estimated_build_seconds(teacher))
    assert base_build_estimate(other, teacher=True, workers=1) > forecast  # one after the other on one worker
    job = BaseModelJob("teacher", teacher)
    (tmp_path / "base_builds").mkdir()
    (tmp_path / "base_builds" / "teacher.progress").write_text("120\n")
    assert _steps_done(job, tmp_path) == 120


def test_base_pair_show_lists_both_models_from_the_cli():
    out = subprocess.run([sys.executable, "-m", "agentgym_opd.cli", "base-pair", "show"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert "household-student: household-student-64x2-1000steps" in out.stdout
    assert "(shipped)" in out.stdout and "household-teacher" in out.stdout
