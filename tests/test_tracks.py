"""`agentgym-opd bench --track NAME`: the smollm2-alfworld preset, the job store that makes a killed track resume,
the claims table's "judge not tested", and the whole track end to end on the tiny model (a toy-size preset)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import evaluation.bench.alfworld_pair as ap
import evaluation.bench.jobs as jobs_module
from evaluation.bench.claims import check_claims, format_claims
from evaluation.bench.command import add_arguments, settings_from_args
from evaluation.bench.job_store import JobStore
from evaluation.bench.jobs import BaseModelJob, JobContext, JobOutcome, ReferenceJob, RunJob
from evaluation.bench.settings import BenchError, BenchSettings, evaluation_envs, uses_base_models
from evaluation.bench.tracks import TRACKS, get_track, register_track, tiny_alfworld_track, track_settings

from conftest import SHARED_DATA as DATA_ROOT


@pytest.fixture(autouse=True)
def data_root(monkeypatch):
    monkeypatch.setenv("AGENTGYM_OPD_DATA", str(DATA_ROOT))


def parse(*argv: str):
    import argparse

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return settings_from_args(parser.parse_args(list(argv)))


def test_the_smollm2_alfworld_preset(monkeypatch, tmp_path):
    monkeypatch.setattr(ap, "cache_root", lambda: tmp_path)
    settings = parse("--track", "smollm2-alfworld")
    assert settings.track == "smollm2-alfworld" and uses_base_models(settings) and settings.resume
    assert settings.env == "alfworld/train" and settings.student == "smollm2"
    assert evaluation_envs(settings) == ["alfworld/train", "alfworld/valid_seen", "alfworld/valid_unseen"]
    assert settings.eval_episodes >= 140  # every game of both held-out splits
    assert settings.algos == ["sft", "opd", "sage_opd", "opsd", "grpo"]
    assert "model.autocast=bfloat16" in settings.overrides
    student, teacher = settings.base_specs()
    assert student is ap.STUDENT_SPEC and teacher is ap.TEACHER_SPEC
    assert settings.base_env_args() == {}  # no household status line on ALFWorld
    assert settings.resolved_env_args() == {"demonstrations": str(ap.games_path(student))}
    # flags override the preset; the preset's overrides stay
    settings = parse("--track", "smollm2-alfworld", "--algos", "opd,vpd", "--steps", "3", "--eval-env",
                     "alfworld/valid_unseen", "train.lr=1e-5")
    assert settings.algos == ["opd", "vpd"] and settings.steps == 3
    assert evaluation_envs(settings) == ["alfworld/train", "alfworld/valid_unseen"]
    assert settings.overrides[-1] == "train.lr=1e-5" and "model.autocast=bfloat16" in settings.overrides
    assert settings.eval_batch == 64 and parse("--track", "smollm2-alfworld", "--eval-batch", "140").eval_batch == 140


def test_an_unknown_track_is_a_setup_error_naming_the_tracks():
    with pytest.raises(BenchError, match="smollm2-alfworld"):
        get_track("smollm3-webshop")


def test_the_household_bench_is_unchanged_without_a_track():
    settings = parse("--quick")
    assert settings.track is None and not settings.resume
    assert settings.base_specs()[0].name == "student" and settings.base_env_args().get("status_line")


def _context(settings: BenchSettings) -> JobContext:
    return JobContext(settings, ["alfworld/train", "alfworld/valid_unseen"], {}, "/s", "/t", {"student": "s"})


def test_the_job_store_keeps_outcomes_by_what_they_depend_on(tmp_path):
    settings = BenchSettings(env="alfworld/train", seeds=[0])
    job = RunJob("opd", 0, True, False)
    outcome = JobOutcome("opd", 0, records=[{"algorithm": "opd"}],
                         outcomes={"alfworld/valid_unseen": {(0, "game/a"): 1.0, (0, "game/b"): 0.0}},
                         messages=["m"], wall_s=3.0)
    store = JobStore(tmp_path, _context(settings))
    assert store.load(job) is None
    store.save(job, outcome)
    assert store.load(job) == outcome
    # what only changes how the bench runs does not matter; what changes a result does
    assert JobStore(tmp_path, _context(BenchSettings(env="alfworld/train", seeds=[0], jobs=4, progress=False))).load(job) == outcome
    assert JobStore(tmp_path, _context(BenchSettings(env="alfworld/train", seeds=[0], steps=17))).load(job) is None
    assert store.load(RunJob("opd", 1, True, False)) is None
    # which other jobs the bench runs does not matter either: --algos adds a method to a finished folder
    more = BenchSettings(env="alfworld/train", seeds=[0], algos=["opd", "grpo"], references=False,
                         algo_overrides={"grpo": ["algo.kl_coef=0.1"]})
    assert JobStore(tmp_path, _context(more)).load(job) == outcome
    # but the job's own overrides and the teacher it trains with do
    assert JobStore(tmp_path, _context(BenchSettings(env="alfworld/train", seeds=[0],
                                                     algo_overrides={"opd": ["algo.top_k=8"]}))).load(job) is None
    other_teacher = JobContext(settings, ["alfworld/train", "alfworld/valid_unseen"], {}, "/s", "/t2", {"student": "s"})
    assert JobStore(tmp_path, other_teacher).load(job) is None
    grpo = RunJob("grpo", 5, False, True)  # trains without a teacher: its key ignores which one the bench has
    store.save(grpo, JobOutcome("grpo", 5, records=[{"algorithm": "grpo"}], wall_s=1.0))
    assert JobStore(tmp_path, other_teacher).load(grpo) is not None
    # a failed job is not kept: a rerun tries it again
    failed = RunJob("grpo", 0, False, True)
    store.save(failed, JobOutcome("grpo", 0, error="boom"))
    assert store.load(failed) is None
    # a half-written file (a kill mid-write) is never read as an outcome
    store.path(failed).write_text('{"key": "', encoding="utf-8")
    assert store.load(failed) is None
    assert store.path(ReferenceJob("warm_start+context", "/s", "s", context=True)).name == \
        "ReferenceJob-warm_start_plus_context.json"


def test_claims_say_the_judge_was_not_tested_when_its_verdicts_were_unreadable():
    summary = {"paired": [{"env_id": "e", "algorithm": "sage_opd", "baseline": "opd", "mean": 0.01, "low": -0.05,
                           "high": 0.2, "n": 134}]}
    unread = [{"algorithm": "sage_opd", "training": {"judge_defaulted_share": 0.95}}]
    rows = check_claims(summary, unread, env_id="e")
    row = next(r for r in rows if r["method"] == "sage_opd" and r["measure"] == "success")
    assert row["verdict"] == "inconclusive at this power; judge not tested" and "95%" in row["judge"]
    table = format_claims(rows)
    assert "| inconclusive at this power; judge not tested: 95% of the teacher's verdicts were unreadable" in table
    assert table.count("judge not tested") == sum(r["method"] == "sage_opd" or r["baseline"] == "sage_opd" for r in rows)
    read = [{"algorithm": "sage_opd", "training": {"judge_defaulted_share": 0.05}}]
    row = next(r for r in check_claims(summary, read, env_id="e") if r["method"] == "sage_opd")
    assert row["verdict"] == "inconclusive at this power" and "judge" not in row
    vpd = next(r for r in check_claims(summary, unread, env_id="e") if r["method"] == "vpd")
    assert "judge" not in vpd


@pytest.mark.slow
def test_the_tiny_track_runs_end_to_end_and_a_killed_track_resumes(monkeypatch, tmp_path):
    """A toy-size track on the tiny model: the pair builds, the reference rows and OPD run, records and claims come
    out; killed after two jobs, the same command resumes, reading back those two and running only the rest."""
    from evaluation.bench.pipeline import run_bench

    monkeypatch.setattr(ap, "cache_root", lambda: tmp_path / "cache")
    register_track(tiny_alfworld_track("tiny-alfworld-test"))
    monkeypatch.setitem(TRACKS, "tiny-alfworld-test", TRACKS["tiny-alfworld-test"])
    settings = track_settings("tiny-alfworld-test", output_dir=str(tmp_path / "out"), jobs=1, progress=False)
    assert settings.resume and settings.algos == ["opd"]

    real_run_job = jobs_module.run_job
    ran: list[str] = []

    class Killed(BaseException):
        """Stands for the process being killed (not an Exception: nothing may catch it)."""

    def killed_after_two(job, context):  # the pair's builds are cached by the pair itself, not counted
        if not isinstance(job, BaseModelJob):
            if len(ran) == 2:
                raise Killed()
            ran.append(job.name)
        return real_run_job(job, context)

    monkeypatch.setattr(jobs_module, "run_job", killed_after_two)
    with pytest.raises(Killed):
        run_bench(settings, log=lambda line: None)
    kept = sorted(p.name for p in (tmp_path / "out" / "jobs").glob("*.json"))
    assert len(kept) == 2
    from evaluation.bench.status import bench_status

    status = bench_status(settings)  # `bench --track NAME --status`: what the killed track has kept
    assert "2 of 4 jobs finished" in status and "teacher: not started" in status and "opd seed 0: not started" in status
    assert "warm_start+context  0" in status  # its row in the table, seed 0

    ran.clear()
    lines: list[str] = []

    def counted(job, context):
        if not isinstance(job, BaseModelJob):
            ran.append(job.name)
        return real_run_job(job, context)

    monkeypatch.setattr(jobs_module, "run_job", counted)
    summary = run_bench(settings, log=lines.append)
    assert ran == ["teacher", "opd"]  # warm_start and warm_start+context were read back, not rerun
    assert sum("finished in an earlier run" in line for line in lines) == 2
    assert not summary["failures"], summary["failures"]
    rows = {(r["algorithm"], r["env_id"]) for r in summary["rows"]}
    assert {("warm_start", "alfworld/valid_unseen"), ("teacher", "alfworld/valid_unseen"),
            ("opd", "alfworld/valid_unseen"), ("warm_start+context", "alfworld/valid_seen")} <= rows
    records = [json.loads(p.read_text()) for p in (tmp_path / "out" / "records").glob("*.json")]
    assert any(r["student"].startswith("tiny-alfworld-student") for r in records)
    assert all(r["algorithm_config"]["bench"]["track"] == "tiny-alfworld-test" for r in records
               if r["algorithm"] == "opd")
    assert (tmp_path / "out" / "claims.md").is_file()
    # the curve's two points are read off the rows' own evaluations of the unseen split (which plays the curve's
    # task), not played again: no evaluation ran during training
    from evaluation.bench.episodes import curve_task_ids
    from evaluation.bench.settings import curve_from_evaluations

    assert curve_from_evaluations(settings)
    (curve_task,) = curve_task_ids(settings)
    unseen = {r["algorithm"]: r for r in records if r["env_id"] == "alfworld/valid_unseen"}
    assert unseen["opd"]["curve"] == [{"rollouts": 0, "success_rate": unseen["warm_start"]["outcomes"][curve_task]},
                                      {"rollouts": 2, "success_rate": unseen["opd"]["outcomes"][curve_task]}]
    metrics = (tmp_path / "out" / "runs" / "opd" / "seed0" / "metrics.jsonl").read_text().splitlines()
    assert metrics and not any("eval/success" in json.loads(line) for line in metrics)
    # a third run redoes nothing but the (cheap) tables
    ran.clear()
    run_bench(settings, log=lambda line: None)
    assert ran == []
    status = bench_status(settings)
    assert "4 of 4 jobs finished" in status and "minus warm_start" in status

    # published: the track's records form their own table, named by the pair, and say how to rerun the track
    from evaluation.bench.publish import import_bench
    from evaluation.leaderboard import Leaderboard

    board = Leaderboard(tmp_path / "board")
    written = import_bench(tmp_path / "out", board, allow_dirty=True, episodes=1, log=lambda line: None)
    published = [json.loads(Path(p).read_text()) for p in written]
    assert {r["algorithm"] for r in published} == {"warm_start", "warm_start+context", "teacher", "opd"}
    assert {tuple(r["provenance"]["command"]) for r in published} == {
        ("agentgym-opd", "bench", "--track", "tiny-alfworld-test", "--output-dir", str(tmp_path / "out"))}
    opd = next(r for r in published if r["algorithm"] == "opd" and r["env_id"] == "alfworld/valid_unseen")
    assert opd["budget"]["rollout_episodes"] == 2 and opd["episodes"]
    board.build()
    md = (tmp_path / "board" / "LEADERBOARD.md").read_text()
    title = next(line for line in md.splitlines() if line.startswith("## alfworld: from tiny-alfworld-student"))
    assert "teacher tiny-alfworld-teacher" in title and title.endswith("the tiny-alfworld-test track's protocol")


def test_claims_say_the_judge_was_not_tested_when_it_gave_every_turn_one_label():
    """Readable but uniform verdicts (zero-shot SmolLM2 answered "Weak" to all 42 turns it read) separate no turns."""
    summary = {"paired": [{"env_id": "e", "algorithm": "sage_opd", "baseline": "opd", "mean": 0.01, "low": -0.05,
                           "high": 0.2, "n": 134}]}
    uniform = [{"algorithm": "sage_opd", "training": {"judge_defaulted_share": 0.1, "judge_modal_label_share": 1.0}}]
    row = next(r for r in check_claims(summary, uniform, env_id="e") if r["method"] == "sage_opd")
    assert row["verdict"].endswith("judge not tested") and "same label" in row["judge"]
    mixed = [{"algorithm": "sage_opd", "training": {"judge_defaulted_share": 0.1, "judge_modal_label_share": 0.6}}]
    assert "judge" not in next(r for r in check_claims(summary, mixed, env_id="e") if r["method"] == "sage_opd")


def test_the_judges_label_statistics_give_the_share_of_its_commonest_label():
    from algorithms.sage_judge import TurnVerdicts
    from evaluation.judge_diagnostics import training_diagnostics

    verdicts = TurnVerdicts(labels=[["strong", "weak", "weak"], ["weak", "skip"]],
                            sources=[["error", "judge", "judge"], ["judge", "default"]],
                            raw=[[None, "Weak", "Weak"], ["Weak", "???"]])
    counts = verdicts.counts()
    assert counts["judge_modal_label_share"] == 1.0  # the error-forced Strong and the default are not the judge's
    assert training_diagnostics([{**counts}])["judge_modal_label_share"] == 1.0


def test_a_track_records_command_is_the_track_and_the_flags_that_changed_its_preset(tmp_path):
    """import-bench stamps a track's records with `bench --track NAME` plus only what differs from the preset (the
    preset's own values, such as its 24-token turns, have no flag and must not refuse the import)."""
    from evaluation.bench.publish import bench_command
    from evaluation.records import RecordError

    def command(**changes):
        return bench_command(track_settings("smollm2-alfworld", output_dir="out", **changes).__dict__)

    assert command() == ["agentgym-opd", "bench", "--track", "smollm2-alfworld", "--output-dir", "out"]
    assert command(algos=["opd", "sdpo"], seeds=[0, 1]) == [
        "agentgym-opd", "bench", "--track", "smollm2-alfworld", "--seeds", "0,1", "--algos", "opd,sdpo",
        "--output-dir", "out"]
    assert command(eval_envs=["alfworld/valid_unseen"], overrides=["train.lr=1e-5"])[4:] == [
        "--eval-env", "alfworld/valid_unseen", "--output-dir", "out", "train.lr=1e-5"]
    quick = track_settings("smollm2-alfworld", quick=True, output_dir="out").__dict__
    assert bench_command(quick)[:5] == ["agentgym-opd", "bench", "--track", "smollm2-alfworld", "--quick"]
    with pytest.raises(RecordError, match="max_new_tokens"):
        command(max_new_tokens=32)


@pytest.mark.slow
def test_a_killed_training_job_continues_from_its_checkpoint_and_keeps_its_finished_splits(monkeypatch, tmp_path):
    """Inside a job too: killed after its first training step, a track's OPD run continues from that step's
    checkpoint; killed during its second split's evaluation, the rerun evaluates only the splits left. The
    final weights and records equal an uninterrupted run's."""
    import torch

    from agentgym_opd.trainer import Trainer
    from evaluation.bench.pipeline import run_bench

    monkeypatch.setattr(ap, "cache_root", lambda: tmp_path / "cache")
    register_track(tiny_alfworld_track("tiny-alfworld-parts", steps=2))
    monkeypatch.setitem(TRACKS, "tiny-alfworld-parts", TRACKS["tiny-alfworld-parts"])

    def settings(out: str):
        return track_settings("tiny-alfworld-parts", output_dir=str(tmp_path / out), jobs=1, progress=False,
                              references=False)

    class Killed(BaseException):
        """Stands for the process being killed (not an Exception: nothing may catch it)."""

    run_bench(settings("straight"), log=lambda line: None)

    real_save = Trainer.save_checkpoint

    def killed_after_step_one(self):
        path = real_save(self)
        if self.step == 1:
            raise Killed()
        return path

    monkeypatch.setattr(Trainer, "save_checkpoint", killed_after_step_one)
    with pytest.raises(Killed):
        run_bench(settings("out"), log=lambda line: None)
    monkeypatch.setattr(Trainer, "save_checkpoint", real_save)

    real_evaluate = jobs_module.evaluate_policy
    evaluated: list[str] = []

    def evaluate(policy, env_id, *args, kill_at=None, **kwargs):
        evaluated.append(env_id)
        if len(evaluated) == kill_at:
            raise Killed()
        return real_evaluate(policy, env_id, *args, **kwargs)

    monkeypatch.setattr(jobs_module, "evaluate_policy", lambda *a, **k: evaluate(*a, kill_at=2, **k))
    lines: list[str] = []
    with pytest.raises(Killed):
        run_bench(settings("out"), log=lines.append)
    assert evaluated == ["alfworld/train", "alfworld/valid_seen"]
    assert not any("resumed from" in line for line in lines)  # the messages of a killed job are not printed

    evaluated.clear()
    monkeypatch.setattr(jobs_module, "evaluate_policy", lambda *a, **k: evaluate(*a, **k))
    lines.clear()
    summary = run_bench(settings("out"), log=lines.append)
    assert not summary["failures"]
    assert evaluated == ["alfworld/valid_seen", "alfworld/valid_unseen"]  # alfworld/train was kept
    assert any("resumed from its step-2 checkpoint" in line for line in lines)
    assert any("alfworld/train evaluated in an earlier run" in line for line in lines)

    run = tmp_path / "out" / "runs" / "opd" / "seed0"
    steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2]
    assert sorted(p.name for p in (run / "checkpoints").glob("step_*")) == ["step_2"]  # one kept
    state = lambda out: torch.load(tmp_path / out / "runs" / "opd" / "seed0" / "checkpoints" / "step_2" /  # noqa: E731
                                   "trainer_state.pt", weights_only=False)["trainable"]
    straight, resumed = state("straight"), state("out")
    assert straight.keys() == resumed.keys() and all(torch.equal(straight[k], resumed[k]) for k in straight)

    def metrics(out: str) -> dict:
        records = [json.loads(p.read_text()) for p in (tmp_path / out / "records").glob("*.json")]
        return {(r["algorithm"], r["env_id"]): r["metrics"] for r in records}

    assert metrics("out") == metrics("straight") and len(metrics("out")) == 3
    # the sitting that finished the training kept its time; the one that resumed after it reads that back
    kept = float((run / "train_wall_s").read_text())
    train_seconds = {json.loads(p.read_text())["algorithm_config"]["bench"]["train_wall_time_s"]
                     for p in (tmp_path / "out" / "records").glob("*.json")}
    assert train_seconds == {round(kept, 3)}


def test_a_turns_claim_with_one_seed_per_method_says_it_needs_seeds_not_that_it_was_not_run():
    metrics = lambda turns: {"mean_turns": {"mean": turns, "stderr": 0.5}}  # noqa: E731
    summary = {"rows": [{"algorithm": a, "env_id": "e", "seeds": [0], "metrics": metrics(t)}
                        for a, t in (("sage_opd", 14.0), ("opd", 15.0))]}
    row = next(r for r in check_claims(summary, [], env_id="e") if r["measure"] == "turns")
    assert row["verdict"] == "needs 2+ seeds"
    assert "| one seed per method: no interval | needs 2+ seeds |" in format_claims([row])
    summary["rows"] = summary["rows"][:1]  # OPD did not run
    assert next(r for r in check_claims(summary, [], env_id="e") if r["measure"] == "turns")["verdict"] == "missing"


def test_a_pair_with_other_weights_than_the_published_rows_is_named_on_the_first_lines(tmp_path):
    """A pair rebuilt at another code revision can end at other weights under the same cache key: the bench says
    so for each model whose weight files do not hash as the published rows' starting model did."""
    import dataclasses

    from agentgym_opd.run_provenance import weights_files_sha256
    from evaluation.bench.tracks import SMOLLM2_ALFWORLD, pair_differences

    same, other = tmp_path / "same", tmp_path / "other"
    for folder, body in ((same, b"published"), (other, b"rebuilt")):
        folder.mkdir()
        (folder / "model.safetensors").write_bytes(body)
    track = dataclasses.replace(SMOLLM2_ALFWORLD, published_weights={
        "warm_start": weights_files_sha256(same), "teacher": weights_files_sha256(same)})
    assert pair_differences(track, {"warm_start": same, "teacher": same}) == []
    lines = pair_differences(track, {"warm_start": same, "teacher": other})
    assert len(lines) == 1 and "teacher" in lines[0] and str(other) in lines[0]
    assert pair_differences(dataclasses.replace(track, published_weights={}), {"teacher": other}) == []
