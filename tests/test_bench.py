"""`agentgym-opd bench`: the whole pipeline, for real, on the tiny student and the embedded household env.

The first runs use the bench's own SFT warm start (``--base-models off``: fast to build); the last one
starts from a miniature household base pair (the default path, built once into a test cache).

One module-scoped bench run (sft and grpo, two seeds, tiny budgets: the pipeline, not the learning, is
under test; two worker processes) in a subprocess with cwd=tmp_path, as a user would run it; a second run
in the same output dir, all in one process (--jobs 1), reuses the cached warm start, reruns grpo seed 0
(it must reproduce the parallel run's numbers exactly) and makes sft fail through an out-of-range config
value (the bench must report it and go on).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from agentgym_opd.cli import main
from evaluation.records import validate_record

TINY = ["--quick", "--steps", "2", "--eval-episodes", "2", "--warm-steps", "5", "--max-turns", "4", "--env-arg", "num_tasks=2",
        "--no-progress", "--base-models", "off"]
SPLITS = ("household/train", "household/valid_seen", "household/valid_unseen")


def bench(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "agentgym_opd.cli", "bench", *TINY, "--output-dir", str(tmp_path / "out"), *args]
    return subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=600)


def records_of(out: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted((out / "records").glob("*.json"))]


@pytest.fixture(scope="module")
def first_run(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("bench")
    proc = bench(tmp_path, "--algos", "sft,grpo", "--seeds", "2", "--jobs", "2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "on 2 worker process(es)" in proc.stderr
    return tmp_path, proc, records_of(tmp_path / "out")


@pytest.mark.slow
def test_records_validate_one_per_algorithm_split_and_seed(first_run):
    _, _, records = first_run
    for r in records:
        validate_record(r)
    got = sorted((r["algorithm"], r["env_id"], r["seed"]) for r in records)
    # the warm start is evaluated once (greedy) on both seeds' tasks and recorded per seed
    want = sorted([(a, e, s) for a in ("warm_start", "sft", "grpo") for e in SPLITS for s in (0, 1)])
    assert got == want
    assert {r["student"] for r in records} == {"tiny+sft5"}
    assert all(r["teacher"] is None for r in records)  # neither sft nor grpo needs a teacher: none trained


@pytest.mark.slow
def test_every_algorithm_gets_the_same_rollout_budget_and_logs_a_training_curve(first_run):
    tmp_path, _, records = first_run
    trained = [r for r in records if r["algorithm"] != "warm_start"]
    assert {r["algorithm_config"]["bench"]["budget_episodes"] for r in trained} == {8}  # 2 steps x 4 episodes
    assert {r["algorithm_config"]["bench"]["seeds"] == [0, 1] for r in trained} == {True}
    grpo = (tmp_path / "out/runs/grpo/seed0/config.yaml").read_text()
    sft = (tmp_path / "out/runs/sft/seed0/config.yaml").read_text()
    assert "group_size: 2" in grpo and "tasks_per_step: 2" in grpo  # 2 tasks x G=2
    assert "group_size: 1" in sft and "tasks_per_step: 4" in sft
    for r in trained:
        if r["env_id"] == "household/train":
            assert [p["rollouts"] for p in r["curve"]] == [0, 4, 8]  # warm start, then eval every step
        else:
            assert "curve" not in r


@pytest.mark.slow
def test_leaderboard_has_a_row_per_algorithm_and_the_baseline_and_the_table_is_printed(first_run):
    tmp_path, proc, _ = first_run
    board = tmp_path / "out/leaderboard"
    md = (board / "LEADERBOARD.md").read_text()
    for algo in ("warm_start", "sft", "grpo"):
        for split in SPLITS:
            assert f"| {split} | {algo} | tiny+sft5 |" in md
    assert "| household/train | sft | tiny+sft5 | - | 0,1 | 4 |" in md  # 2 seeds x 2 tasks
    assert (board / "leaderboard.csv").read_text().count("\n") == 1 + 9
    html = (board / "index.html").read_text()
    assert "<svg" in html and "rollout episodes" in html  # the training curves (matplotlib SVG)
    assert not (tmp_path / "leaderboard").exists()  # never the repo's leaderboard without --publish
    lines = proc.stdout.splitlines()
    assert lines[0].split()[:2] == ["algorithm", "seeds"]
    assert [ln.split()[0] for ln in lines[2:5]] == ["warm_start", "sft", "grpo"]
    assert "wall time:" in proc.stdout
    summary = json.loads((tmp_path / "out/summary.json").read_text())
    row = next(r for r in summary["rows"] if r["algorithm"] == "grpo" and r["env_id"] == "household/train")
    assert row["seeds"] == [0, 1] and set(row["metrics"]["success_rate"]) == {"mean", "stderr"}


@pytest.mark.slow
def test_rerun_reuses_the_warm_start_reproduces_numbers_and_reports_a_failing_algorithm(first_run):
    tmp_path, _, before = first_run
    # --jobs 1 runs everything in this one process; the first run used a worker per core: same numbers
    proc = bench(tmp_path, "--algos", "sft,grpo", "--seeds", "1", "--jobs", "1", "--algo-set", "sft:algo.context_fraction=2")
    assert proc.returncode == 1, proc.stderr[-3000:]  # finished, with a failed run
    assert "reusing warm_start" in proc.stderr
    assert any(ln.startswith("sft") and "FAILED" in ln and "context_fraction" in ln for ln in proc.stdout.splitlines())
    after = {(r["algorithm"], r["env_id"], r["seed"]): r for r in records_of(tmp_path / "out")}
    assert not any(algo == "sft" for algo, _, _ in after)
    for r in before:
        if r["algorithm"] in ("grpo", "warm_start") and r["seed"] == 0:
            again = after[(r["algorithm"], r["env_id"], 0)]
            assert again["metrics"] == r["metrics"] and again.get("curve") == r.get("curve")
    assert (tmp_path / "out/runs/sft/seed0/error.txt").read_text().strip()


def test_bad_jobs_count_is_a_clear_error_exit_2(tmp_path, capsys):
    assert main(["bench", "--jobs", "0", "--output-dir", str(tmp_path / "out")]) == 2
    assert "--jobs needs at least 1 worker process, got 0" in capsys.readouterr().err


def test_publish_from_a_dirty_tree_is_refused_before_anything_runs(tmp_path, capsys, monkeypatch):
    import evaluation.runner

    monkeypatch.setattr(evaluation.runner, "code_revision", lambda: "abc1234+dirty")
    assert main(["bench", "--quick", "--publish", "--output-dir", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "--publish: this checkout has uncommitted changes (abc1234+dirty)" in err and "nothing was run" in err
    assert not (tmp_path / "out").exists()


def test_unknown_algorithm_is_a_clear_error_exit_2(tmp_path, capsys):
    assert main(["bench", "--algos", "sft,no_such_algo", "--output-dir", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "unknown algorithm(s) ['no_such_algo']" in err and "registered:" in err and "sft" in err
    assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------- the household base pair (--base-models auto)
BASE = ["--quick", "--steps", "2", "--eval-episodes", "3", "--max-turns", "6", "--no-progress", "--base-steps", "2",
        "--base-train-tasks", "12", "--base-models", "auto", "--algos", "opd", "--seeds", "0,1", "--jobs", "1"]


@pytest.fixture(scope="module")
def base_run(tmp_path_factory):
    import os

    tmp_path = tmp_path_factory.mktemp("bench_base")
    cmd = [sys.executable, "-m", "agentgym_opd.cli", "bench", *BASE, "--output-dir", str(tmp_path / "out")]
    env = {**os.environ, "AGENTGYM_OPD_CACHE": str(tmp_path / "cache")}
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=900, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return tmp_path, proc, records_of(tmp_path / "out")


@pytest.mark.slow
def test_base_pair_rows_context_row_intervals_and_paired_tables(base_run):
    tmp_path, proc, records = base_run
    got = sorted((r["algorithm"], r["env_id"], r["seed"]) for r in records)
    refs = ("warm_start", "warm_start+context", "teacher")
    assert got == sorted([(a, e, s) for a in (*refs, "opd") for e in SPLITS for s in (0, 1)])
    by = {(r["algorithm"], r["env_id"], r["seed"]): r for r in records}
    student = by[("warm_start", "household/valid_unseen", 0)]["student"]
    assert student.startswith("household-student-") and by[("teacher", "household/valid_unseen", 0)]["student"].startswith(
        "household-teacher-")
    assert by[("opd", "household/valid_unseen", 0)]["teacher"].startswith("household-teacher-")
    assert by[("warm_start+context", "household/valid_unseen", 0)]["algorithm_config"]["bench"]["context"] is True
    # each seed has its own 3 held-out tasks; the references are evaluated once on their union
    assert by[("warm_start", "household/valid_unseen", 0)]["n_episodes"] == 3
    assert by[("opd", "household/valid_unseen", 1)]["n_episodes"] == 3
    # the curve is held-out success (valid_unseen) against rollout episodes, point 0 = the warm start
    curve = by[("opd", "household/valid_unseen", 0)]["curve"]
    assert [p["rollouts"] for p in curve] == [0, 4, 8] and "curve" not in by[("opd", "household/train", 0)]
    summary = json.loads((tmp_path / "out/summary.json").read_text())
    cell = summary["intervals"]["opd"]["household/valid_unseen"]
    assert cell["n"] == 6 and summary["intervals"]["warm_start"]["household/valid_unseen"]["n"] == 6 and 0 <= cell["low"] <= cell["mean"] <= cell["high"] <= 1
    pairs = {(p["algorithm"], p["baseline"], p["env_id"]) for p in summary["paired"]}
    assert ("opd", "warm_start", "household/valid_unseen") in pairs and ("teacher", "opd", "household/valid_seen") in pairs
    assert next(p for p in summary["paired"] if p["algorithm"] == "opd" and p["baseline"] == "warm_start"
                and p["env_id"] == "household/valid_unseen")["n"] == 6  # (seed, task) pairs
    assert "minus opd" in proc.stdout and "minus warm_start" in proc.stdout
    assert "base models ready in" in proc.stderr and "building base model student" in proc.stderr
    # the papers' claims table is written beside the summary (its rows say "missing" for methods not run)
    assert {c["verdict"] for c in summary["claims"]} == {"missing"}
    assert (tmp_path / "out/claims.md").read_text().startswith("The papers' claims on household/valid_unseen")


def test_the_base_pair_path_plays_every_env_with_the_status_line_it_was_trained_with():
    from evaluation.bench.base_models import STUDENT_SPEC, base_env_args
    from evaluation.bench.episodes import eval_env_args
    from evaluation.bench.settings import BenchSettings

    assert base_env_args(STUDENT_SPEC) == {"status_line": True, "goal_in_view": True, "turn_counter": True}
    base = BenchSettings.full(base_models="auto")
    assert base.resolved_env_args() == {"status_line": True, "goal_in_view": True, "turn_counter": True}
    assert BenchSettings.full(base_models="auto", env_args={"num_tasks": 50}).resolved_env_args() == \
        {"status_line": True, "goal_in_view": True, "turn_counter": True, "num_tasks": 50}
    for split in ("valid_seen", "valid_unseen"):
        assert eval_env_args(f"household/{split}", base)["status_line"] is True
    old = BenchSettings.full(base_models="off")
    assert "status_line" not in old.resolved_env_args() and "status_line" not in eval_env_args("household/valid_unseen", old)


def test_seeds_reads_a_count_or_a_list_and_names_the_fix_for_seed_zero():
    from evaluation.bench.command import _seeds

    assert _seeds("3") == [0, 1, 2] and _seeds("0,3") == [0, 3] and _seeds("0,") == [0]
    with pytest.raises(ValueError, match="--seeds 1"):
        _seeds("0")


def test_a_teacher_that_learns_from_the_students_turns_learns_from_this_benchs_student(monkeypatch):
    """--base-steps and --base-train-tasks change the student; a teacher with `history_model` must then learn from
    that student's rollouts, not from the default student's (and so gets its own cache key)."""
    import dataclasses

    from evaluation.bench import base_models
    from evaluation.bench.settings import BenchSettings

    monkeypatch.setattr(base_models, "TEACHER_SPEC", dataclasses.replace(
        base_models.TEACHER_SPEC, history_share=0.5, history_model=base_models.STUDENT_SPEC))
    student, teacher = BenchSettings.full(base_models="auto", base_steps=7, base_train_tasks=12).base_specs()
    assert student.steps == 7 and student.train_tasks == 12 and teacher.history_model == student
    # the pair's shape is kept: the student stops as far through its schedule, the teacher trains as much longer
    assert student.schedule_steps / student.steps == base_models.STUDENT_SPEC.schedule_steps / base_models.STUDENT_SPEC.steps
    assert teacher.steps == round(7 * base_models.TEACHER_SPEC.steps / base_models.STUDENT_SPEC.steps)
    default_student, default_teacher = BenchSettings.full(base_models="auto").base_specs()
    assert default_teacher.history_model == default_student == base_models.STUDENT_SPEC
    assert teacher.key() != default_teacher.key()
