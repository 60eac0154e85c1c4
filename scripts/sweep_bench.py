"""Tune the bench's hyper-parameters per algorithm, choosing on household/valid_seen ONLY.

For each algorithm: a grid over the learning rate, the rollout temperature and the method's one or two
main knobs (`MAIN_KNOBS`); every point is a bench run of that one algorithm (same warm start, teacher,
budget and seeds as the bench), scored by its pooled `valid_seen` success. `valid_unseen` is evaluated
by nothing here (the bench's eval splits are restricted to train + valid_seen), so the choice can never
peek at it. Output: `<out>/sweep.json` (every point) and a markdown table with the chosen point per
algorithm, ready for README and for `--algo-set` / the bench's per-algorithm defaults.

    python scripts/sweep_bench.py --algos grpo,opd --seeds 0 --out runs/sweep      # a slice
    python scripts/sweep_bench.py --quick --algos opd                              # smoke

Cost: points x seeds bench runs per algorithm; with the defaults below 3 lr x 2 temperatures x up to 2
knob values = 12 points per algorithm (OPD: 3 divergences, 18). Run it where CPU time is plentiful; it writes after every point,
so an interrupted sweep keeps what it measured.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from pathlib import Path

LEARNING_RATES = (1e-4, 3e-4, 1e-3)
TEMPERATURES = (0.5, 1.0)
# each method's main knob(s): the values tried (the first is the method's own default)
MAIN_KNOBS: dict[str, dict[str, tuple]] = {
    "sft": {"algo.context_fraction": (0.0, 0.5)},
    "grpo": {"algo.kl_coef": (0.0, 0.01)},
    "opd": {"algo.divergence": ("reverse_kl", "forward_kl", "jsd")},
    "opsd": {"algo.teacher": ("frozen", "ema")},
    "sdpo": {"algo.distill_weight": (1.0, 0.5)},
    "vpd": {"algo.beta": (0.1, 0.5)},
    "lopd": {"algo.num_experiences": (2, 4)},
    "sage_opd": {"algo.alpha": (0.5, 0.25)},
}
SELECTION_SPLIT = "household/valid_seen"


def grid(algo: str, lrs: tuple = LEARNING_RATES, temperatures: tuple = TEMPERATURES,
         knob_values: dict[str, tuple] | None = None) -> list[dict[str, object]]:
    """Every point of an algorithm's grid: {'lr':..., 'temperature':..., '<algo knob>':...}."""
    knobs = MAIN_KNOBS.get(algo, {}) if knob_values is None else knob_values
    names = list(knobs)
    points = []
    for lr, temp, *values in itertools.product(lrs, temperatures, *[knobs[n] for n in names]):
        points.append({"lr": lr, "temperature": temp, **dict(zip(names, values))})
    return points


def choose(points: list[dict]) -> dict | None:
    """The point with the best valid_seen success (ties: the earlier point, i.e. the smaller lr)."""
    scored = [p for p in points if p.get("valid_seen") is not None]
    return max(scored, key=lambda p: p["valid_seen"]) if scored else None


def point_settings(algo: str, point: dict, args: argparse.Namespace, out: Path):
    """The bench settings of one sweep point: that algorithm alone, evaluated on valid_seen (and its training
    tasks) only, without the reference rows (they do not depend on the point)."""
    from evaluation.bench.settings import BenchSettings

    # the point's lr and temperature go in last, after the bench's tuned per-algorithm defaults (TUNED_OVERRIDES),
    # which would otherwise replace them
    knobs = [f"{k}={v}" for k, v in point.items() if k.startswith("algo.")]
    knobs += [f"train.lr={point['lr']}", f"rollout.temperature={point['temperature']}"]
    changes = dict(algos=[algo], seeds=args.seeds, lr=point["lr"], temperature=point["temperature"],
                   algo_overrides={algo: knobs}, eval_envs=[SELECTION_SPLIT], output_dir=str(out),
                   progress=False, base_models=args.base_models, references=False)
    for name in ("steps", "episodes_per_step", "eval_episodes"):
        if getattr(args, name):
            changes[name] = getattr(args, name)
    return BenchSettings.quick(**changes) if args.quick else BenchSettings.full(**changes)


def run_point(algo: str, point: dict, args: argparse.Namespace, out: Path) -> float | None:
    from evaluation.bench.pipeline import run_bench
    from evaluation.bench.results import mean_success

    summary = run_bench(point_settings(algo, point, args, out))
    if summary["failures"]:
        return None
    return mean_success(summary, algo, SELECTION_SPLIT)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    from agentgym_opd.config import parse_key_values

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--algos", default=",".join(MAIN_KNOBS), help="comma-separated algorithms")
    parser.add_argument("--seeds", default="0", help="comma-separated seeds per point")
    parser.add_argument("--steps", type=int, default=None, help="update steps per run (default: the bench's)")
    parser.add_argument("--episodes-per-step", type=int, default=None, help="rollout episodes per step (default: the bench's)")
    parser.add_argument("--eval-episodes", type=int, default=None, help="valid_seen episodes per seed (default: the bench's)")
    parser.add_argument("--base-models", default="auto", choices=("auto", "off"),
                        help="start from the household base pair (the bench's --base-models)")
    parser.add_argument("--lrs", default=None, help=f"comma-separated learning rates (default {LEARNING_RATES})")
    parser.add_argument("--temperatures", default=None, help=f"comma-separated temperatures (default {TEMPERATURES})")
    parser.add_argument("--knob", action="append", default=[], metavar="KEY=V1,V2",
                        help="replace the algorithm's main knob values, e.g. algo.divergence=reverse_kl")
    parser.add_argument("--default-knobs", action="store_true",
                        help="sweep lr and temperature only, every method at its own knob defaults")
    parser.add_argument("--quick", action="store_true", help="the bench's --quick settings per point (smoke)")
    parser.add_argument("--out", default="runs/sweep")
    args = parser.parse_args(argv)
    args.seeds = [int(s) for s in args.seeds.split(",")]
    args.lrs = tuple(float(v) for v in args.lrs.split(",")) if args.lrs else LEARNING_RATES
    args.temperatures = tuple(float(v) for v in args.temperatures.split(",")) if args.temperatures else TEMPERATURES
    args.knob_values = {} if args.default_knobs else None
    if args.knob and args.default_knobs:
        parser.error("--knob and --default-knobs exclude each other")
    if args.knob:
        args.knob_values = {}
        for item in args.knob:
            key, sep, values = item.partition("=")
            if not sep or not key.startswith("algo."):
                parser.error(f"--knob wants algo.KEY=V1,V2, got {item!r}")
            # each value as the bench's --env-arg reads one: JSON when it parses (numbers, true), else text
            args.knob_values[key] = tuple(parse_key_values([f"{key}={v}"], "--knob")[key] for v in values.split(","))
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results: dict[str, list[dict]] = {}
    for algo in [a.strip() for a in args.algos.split(",") if a.strip()]:
        results[algo] = []
        for i, point in enumerate(grid(algo, args.lrs, args.temperatures, args.knob_values)):
            started = time.perf_counter()
            seen = run_point(algo, point, args, out / algo / f"point{i}")
            results[algo].append({**point, "valid_seen": seen, "wall_s": round(time.perf_counter() - started, 1)})
            (out / "sweep.json").write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
            print(f"{algo} {point}: valid_seen {seen}", file=sys.stderr)
    lines = ["| algorithm | lr | temperature | knobs | valid_seen success (chosen) | points |", "|---|---|---|---|---|---|"]
    for algo, points in results.items():
        best = choose(points)
        if best is None:
            lines.append(f"| {algo} | - | - | - | all points failed | {len(points)} |")
            continue
        knobs = ", ".join(f"{k}={v}" for k, v in best.items() if k.startswith("algo."))
        lines.append(f"| {algo} | {best['lr']} | {best['temperature']} | {knobs} | {best['valid_seen']:.3f} | {len(points)} |")
    table = "\n".join(lines)
    (out / "sweep.md").write_text(table + "\n", encoding="utf-8")
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
