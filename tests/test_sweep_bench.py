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


def test_default_knobs_sweeps_lr_and_temperature_only():
    args = sweep.parse_args(["--default-knobs", "--lrs", "3e-5,3e-4", "--temperatures", "1.0"])
    points = sweep.grid("vpd", args.lrs, args.temperatures, args.knob_values)
    assert points == [{"lr": 3e-5, "temperature": 1.0}, {"lr": 3e-4, "temperature": 1.0}]


def test_choice_reads_valid_seen_and_ignores_anything_else():
    points = [{"lr": 1e-4, "valid_seen": 0.2, "valid_unseen": 0.9}, {"lr": 3e-4, "valid_seen": 0.5, "valid_unseen": 0.1},
              {"lr": 1e-3, "valid_seen": None}]
    assert sweep.choose(points)["lr"] == 3e-4
    assert sweep.choose([{"lr": 1e-4, "valid_seen": None}]) is None


def test_a_point_trains_one_algorithm_from_the_base_pair_and_never_evaluates_valid_unseen(tmp_path):
    from evaluation.bench.settings import evaluation_envs, resolved_curve_env

    args = sweep.parse_args(["--algos", "opd", "--lrs", "5e-5,1e-4", "--temperatures", "1.0",
                             "--knob", "algo.divergence=reverse_kl", "--episodes-per-step", "8"])
    points = sweep.grid("opd", args.lrs, args.temperatures, args.knob_values)
    assert points == [{"lr": 5e-5, "temperature": 1.0, "algo.divergence": "reverse_kl"},
                      {"lr": 1e-4, "temperature": 1.0, "algo.divergence": "reverse_kl"}]
    settings = sweep.point_settings("opd", points[0], args, tmp_path)
    assert settings.base_models == "auto" and not settings.references and settings.episodes_per_step == 8
    assert settings.algo_overrides == {"opd": ["algo.divergence=reverse_kl", "train.lr=5e-05", "rollout.temperature=1.0"]}
    # a point's lr beats the bench's tuned per-algorithm lr, which the run's overrides apply before it
    from evaluation.bench.training import run_overrides

    sft = sweep.point_settings("sft", {"lr": 1e-3, "temperature": 1.0}, args, tmp_path)
    config = run_overrides(sft, "sft", seed=0, run_dir=tmp_path, student="s", teacher=None, needs_teacher=False,
                           needs_groups=False)
    assert [o for o in config if o.startswith("train.lr=")][-1] == "train.lr=0.001"
    envs = evaluation_envs(settings) + [resolved_curve_env(settings)]
    assert "household/valid_seen" in envs and not any("unseen" in e for e in envs)


def test_the_bench_defaults_hold_a_swept_lr_for_every_registered_algorithm():
    from evaluation.bench.settings import TUNED_OVERRIDES, BenchSettings
    from evaluation.bench.training import run_overrides

    assert set(TUNED_OVERRIDES) == set(algorithm_registry.ids())
    base, off = BenchSettings.full(), BenchSettings.full(base_models="off")
    for algo, tuned in TUNED_OVERRIDES.items():
        every = run_overrides(base, algo, seed=0, run_dir=Path("r"), student="s", teacher="t", needs_teacher=True,
                              needs_groups=False)
        lrs = [o for o in every if o.startswith("train.lr=")]
        assert lrs[-1] == tuned[0]
        assert all(knob in every for knob in tuned[1:])  # a swept knob (e.g. OPD's divergence) reaches the run
        lrs = [o for o in run_overrides(off, algo, seed=0, run_dir=Path("r"), student="s", teacher="t",
                                        needs_teacher=True, needs_groups=False) if o.startswith("train.lr=")]
        assert lrs == [f"train.lr={off.lr}"]  # the older path keeps its shared lr
