"""`bench --status`: a resumable bench's kept outcomes, parts and checkpoints read back as tables, running nothing."""

from __future__ import annotations

import pytest

from evaluation.bench.job_store import JobStore, eval_progress_path
from evaluation.bench.jobs import JobContext, JobOutcome, ReferenceJob, RunJob
from evaluation.bench.pipeline import plan_jobs
from evaluation.bench.settings import BenchSettings, algorithm_flags
from evaluation.bench.status import bench_status
from test_leaderboard import make_record

UNSEEN = "household/valid_unseen"
TASKS = [f"t{i}" for i in range(20)]


def outcome(algorithm: str, wins: int, *, seed: int | None = None) -> JobOutcome:
    """A job's outcome on the unseen split: the first ``wins`` of 20 tasks solved."""
    record = make_record(algorithm, seed or 0, wins / 20, env_id=UNSEEN, n_episodes=20)
    return JobOutcome(algorithm, seed, records=[record], wall_s=60.0,
                      outcomes={UNSEEN: {(seed or 0, t): float(i < wins) for i, t in enumerate(TASKS)}})


@pytest.fixture
def settings(tmp_path) -> BenchSettings:
    return BenchSettings(algos=["sft", "opd"], seeds=[0], steps=4, eval_envs=[UNSEEN], output_dir=str(tmp_path))


def test_the_status_of_a_bench_that_never_ran_lists_every_job_as_not_started(settings):
    text = bench_status(settings)
    assert "0 of 5 jobs finished" in text and text.count(": not started") == 5
    assert "no evaluation is kept yet" in text
    flags = {name: algorithm_flags(name) for name in settings.algos}
    planned = [job.name for job in plan_jobs(settings, flags)]
    assert planned == ["warm_start", "warm_start+context", "teacher", "sft", "opd"]
    # no method needs a teacher and none is given: no teacher row (the bench trains none)
    assert [job.name for job in plan_jobs(settings, {"grpo": algorithm_flags("grpo")})] == [
        "warm_start", "warm_start+context", "grpo"]


def test_the_status_shows_finished_rows_paired_differences_and_the_parts_of_a_running_job(settings, tmp_path):
    store = JobStore(tmp_path / "jobs", JobContext(settings, ["household/train", UNSEEN], {}, "/s", "/t", {}))
    store.save(ReferenceJob("warm_start", "", ""), outcome("warm_start", 5))
    store.save(RunJob("opd", 0, True, False), outcome("opd", 12, seed=0))
    # sft was killed after 3 of its 4 steps with its unseen split already evaluated
    sft = RunJob("sft", 0, False, False)
    part = outcome("sft", 9, seed=0)
    store.save_part(sft, UNSEEN, {"records": part.records, "outcomes": part.outcomes[UNSEEN]})
    checkpoints = tmp_path / "runs" / "sft" / "seed0" / "checkpoints"
    checkpoints.mkdir(parents=True)
    (checkpoints / "latest").write_text("step_3\n")

    text = bench_status(settings)
    assert "2 of 5 jobs finished" in text
    assert "warm_start: finished (60 s)" in text and "opd seed 0: finished (60 s)" in text
    assert f"sft seed 0: trained 3 of 4 steps; evaluated on {UNSEEN}" in text
    assert "teacher: not started" in text
    # the teacher's row is playing its first split: the games ended so far (the split starts over on a rerun)
    progress = eval_progress_path(tmp_path / "jobs", ReferenceJob("teacher", "", ""), "household/train")
    progress.write_text("7/32")
    playing = "teacher: playing household/train: 7/32 games ended (a rerun starts this split over)"
    assert playing in bench_status(settings)
    table = text.split("\n\n")[1]
    assert [line.split()[0] for line in table.splitlines()[2:]] == ["warm_start", "sft", "opd"]
    assert "0.600" in table and "0.250" in table  # opd 12/20, warm start 5/20
    # paired on the same 20 tasks: opd solves 7 more than the warm start, 3 more than sft
    assert "minus warm_start" in text and "+0.350" in text and "minus sft" in text and "+0.150" in text


def test_a_corrupt_outcome_file_reads_as_not_finished(settings, tmp_path):
    (tmp_path / "jobs").mkdir()
    (tmp_path / "jobs" / "RunJob-opd-seed0.json").write_text('{"key": "')  # a kill mid-write
    assert "opd seed 0: not started" in bench_status(settings)
    # once its run folder carries the job's key, it is training (its first step not yet kept)
    run_dir = tmp_path / "runs" / "opd" / "seed0"
    run_dir.mkdir(parents=True)
    (run_dir / "bench_job_key").write_text("k")
    assert "opd seed 0: training, no step kept yet" in bench_status(settings)
