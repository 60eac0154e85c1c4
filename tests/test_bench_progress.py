"""The bench's progress bar weighs each job by its forecast, so its percentage and time left follow the work."""

import pytest

from evaluation.bench.jobs import ReferenceJob, RunJob, _job_forecast
from evaluation.bench.settings import BenchSettings, estimate_seconds, job_costs


def test_jobs_weigh_what_the_bench_forecasts_for_them():
    settings = BenchSettings()
    costs = job_costs(settings, 3)
    run, reference = RunJob("opd", 0, True, False), ReferenceJob("warm_start", "unused", "warm_start")
    assert _job_forecast(run, settings, costs) == (costs.run_train, costs.run_eval)
    assert _job_forecast(reference, settings, costs) == (0.0, costs.reference)
    # the bug this replaces: a reference row counted one unit beside a run's 16 steps, while it evaluates
    # every seed's held-out tasks and costs more than a whole training run
    assert costs.reference > costs.run_train > 0


def test_the_first_line_forecast_is_the_sum_the_bar_counts():
    settings = BenchSettings()
    costs = job_costs(settings, 3)
    runs = 2 * len(settings.seeds)
    total = runs * (costs.run_train + costs.run_eval) + 2 * costs.reference  # warm start and warm start+context
    assert estimate_seconds(settings, ["opd", "sft"], 3, warm=True, teacher=False, workers=2) == total / 2


def test_a_track_forecasts_each_algorithm_at_its_own_training_cost():
    """A track's judge-calling method trains at twice OPD's cost: its job weighs that, and so does the forecast."""
    import dataclasses

    from evaluation.bench.tracks import SMOLLM2_ALFWORLD, TRACKS, register_track, track_settings

    track = register_track(dataclasses.replace(SMOLLM2_ALFWORLD, name="costs-test", rollout_seconds={"sage_opd": 40.0}))
    try:
        settings = track_settings(track.name)
        costs = job_costs(settings, 3)
        opd, sage = RunJob("opd", 0, True, False), RunJob("sage_opd", 0, True, False)
        assert _job_forecast(opd, settings, costs)[0] == settings.budget * track.episode_seconds[1]
        assert _job_forecast(sage, settings, costs)[0] == settings.budget * 40.0
        both = estimate_seconds(settings, ["opd", "sage_opd"], 3, warm=True, teacher=True, workers=1)
        alone = estimate_seconds(settings, ["opd"], 3, warm=True, teacher=True, workers=1)
        assert both - alone == pytest.approx(settings.budget * 40.0 + costs.run_eval)
    finally:
        TRACKS.pop(track.name)


def test_a_household_base_model_to_build_weighs_its_build_forecast(tmp_path, monkeypatch):
    """A base model that must be built counts what the first line forecasts for it (it was a 60 s literal)."""
    import dataclasses

    from evaluation.bench import base_models
    from evaluation.bench.jobs import BaseModelJob

    monkeypatch.setenv("AGENTGYM_OPD_CACHE", str(tmp_path))
    settings = BenchSettings()
    spec = dataclasses.replace(settings.base_specs()[0], steps=settings.base_specs()[0].steps + 1)  # never shipped
    assert base_models.cached_base_model(spec) is None
    followed, rest = _job_forecast(BaseModelJob("base_student", spec), settings, job_costs(settings, 3))
    assert (followed, rest) == (base_models.estimated_build_seconds(spec), 0.0)
    assert followed > 60.0


def test_bench_publish_skips_a_record_from_a_dirty_tree_and_publishes_the_rest(tmp_path, monkeypatch):
    from evaluation.bench.results import update_leaderboard
    from test_leaderboard import make_record

    monkeypatch.chdir(tmp_path)
    clean, dirty = make_record(seed=0), make_record(seed=1, code_revision="abc1234+dirty")
    lines: list[str] = []
    update_leaderboard([clean, dirty], tmp_path / "bench", publish=True, log=lines.append)
    published = [p.name for p in (tmp_path / "leaderboard" / "records").glob("*.json")]
    assert len(published) == 1
    assert any(line.startswith("publish: skipped opd household/valid_unseen seed 1: made from a tree with uncommitted")
               for line in lines), lines


def test_a_running_jobs_kept_splits_count_by_their_episodes(tmp_path):
    """A track's reference row evaluates for an hour: the bar counts each split it has kept (weighted by the
    split's episodes), so its time left is not a day's worth extrapolated from a still-zero job (22 h shown
    for a track with ~6 h left). Nothing kept: nothing counted until the job ends, as before."""
    from evaluation.bench.job_store import eval_progress_path, part_path
    from evaluation.bench.jobs import _progress, job_work_done

    envs = ["alfworld/train", "alfworld/valid_seen", "alfworld/valid_unseen"]
    weights = {"alfworld/train": 8, "alfworld/valid_seen": 140, "alfworld/valid_unseen": 140}
    reference, run = ReferenceJob("teacher", "unused", "teacher"), RunJob("opd", 0, True, False)
    assert _progress(reference, tmp_path, envs) == (0, {})
    assert job_work_done((0.0, 2880.0), 1, weights, _progress(reference, tmp_path, envs)) == 0.0
    for env in envs[:2]:
        path = part_path(tmp_path / "jobs", reference, env)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("{}")
    assert _progress(reference, tmp_path, envs) == (0, {envs[0]: 1.0, envs[1]: 1.0})
    assert job_work_done((0.0, 2880.0), 1, weights, _progress(reference, tmp_path, envs)) == 2880.0 * 148 / 288
    # the split it is playing counts by the games ended so far (written as each ends)
    eval_progress_path(tmp_path / "jobs", reference, envs[2]).write_text("35/140")
    assert _progress(reference, tmp_path, envs) == (0, {envs[0]: 1.0, envs[1]: 1.0, envs[2]: 0.25})
    assert job_work_done((0.0, 2880.0), 1, weights, _progress(reference, tmp_path, envs)) == 2880.0 * 183 / 288
    eval_progress_path(tmp_path / "jobs", reference, envs[2]).write_text("35/")  # caught mid-write: not counted
    assert _progress(reference, tmp_path, envs) == (0, {envs[0]: 1.0, envs[1]: 1.0})
    # a training run: its steps from metrics.jsonl, then its splits
    metrics = tmp_path / "runs" / "opd" / "seed0" / "metrics.jsonl"
    metrics.parent.mkdir(parents=True)
    metrics.write_text('{"step": 1}\n{"step": 2}\n')
    assert job_work_done((800.0, 2880.0), 8, weights, _progress(run, tmp_path, envs)) == 200.0
    assert job_work_done((800.0, 2880.0), 8, weights, None) == 3680.0


def test_a_resumed_bench_counts_only_what_it_will_continue_from(tmp_path):
    """At a resumed bench's start, a training run counts its steps up to its newest checkpoint only when its
    folder carries the job's key (a run that starts over counted its old metrics lines, then stepped the bar
    back when they were cleared: a negative time left), and splits count only when kept under the job's key."""
    from types import SimpleNamespace

    from evaluation.bench.job_store import JobStore, eval_progress_path
    from evaluation.bench.jobs import _kept_progress

    envs = ["alfworld/train", "alfworld/valid_seen"]
    context = SimpleNamespace(settings=BenchSettings(output_dir=str(tmp_path)), env_ids=envs, student_path="s",
                              teacher_path=None, labels={})
    store = JobStore(tmp_path / "jobs", context)
    run = RunJob("opd", 0, True, False)
    run_dir = tmp_path / "runs" / "opd" / "seed0"
    (run_dir / "checkpoints").mkdir(parents=True)
    (run_dir / "metrics.jsonl").write_text('{"step": 1}\n{"step": 2}\n{"step": 3}\n')
    assert _kept_progress(run, tmp_path, envs, store) == (0, {})  # an old run's folder: it starts over
    (run_dir / "bench_job_key").write_text(store.key(run))
    (run_dir / "checkpoints" / "latest").write_text("step_2")
    assert _kept_progress(run, tmp_path, envs, store) == (2, {})  # step 3 was logged, not checkpointed
    store.save_part(run, "alfworld/train", {"records": [], "outcomes": {}})
    stale = store.part_path(run, "alfworld/valid_seen")
    stale.write_text('{"key": "another bench", "value": {}}')
    eval_progress_path(tmp_path / "jobs", run, "alfworld/valid_seen").write_text("70/140")  # a split a killed run
    assert _kept_progress(run, tmp_path, envs, store) == (2, {"alfworld/train": 1.0})  # was playing starts over


def test_workers_take_the_longest_forecast_jobs_first_and_ties_in_job_order():
    """A pool takes jobs in this order: long ones first, so short ones fill the end instead of one long job
    running alone at the end while the other workers idle."""
    from evaluation.bench.settings import longest_first

    settings = BenchSettings()
    costs = job_costs(settings, 3)
    jobs = [ReferenceJob("warm_start", "unused", "warm_start"), RunJob("sft", 0, True, False),
            RunJob("opd", 0, True, False), ReferenceJob("teacher", "unused", "teacher")]
    forecast = {i: _job_forecast(job, settings, costs) for i, job in enumerate(jobs)}
    order = longest_first([0, 1, 2, 3], forecast)
    assert [sum(forecast[i]) for i in order] == sorted((sum(f) for f in forecast.values()), reverse=True)
    assert order.index(1) < order.index(2) and order.index(0) < order.index(3)  # equal forecasts keep their order
    assert longest_first([3, 0], {0: (1.0, 0.0), 3: (0.0, 5.0)}) == [3, 0]
