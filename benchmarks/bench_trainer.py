"""Trainer throughput per registered algorithm, and the top-M loss's memory against the full vocabulary.

Part 1 runs every algorithm in the registry through the real :class:`agentgym_opd.trainer.Trainer` on the
offline tiny model and the embedded household env, all in this one process with the same budget (tasks
per step, turns, tokens), and prints rollout tokens/s (agent tokens generated per second of rollout) and
train tokens/s (sequence tokens per second of update) from each run's ``metrics.jsonl``, skipping the first
step (warm-up), with each algorithm's ratio to SFT's train tokens/s. An algorithm needing a teacher gets
the tiny model as its teacher (the cost is what is measured, not the teacher's quality); one needing groups
gets ``group_size=2``. An algorithm that fails is listed with its error, not dropped.

It then prints each algorithm's step-time breakdown: seconds and share of rollout, teacher scoring and
update per step, and each phase's peak memory (the ``time/*`` and ``mem/*`` fields every step logs).

Part 2 runs ``benchmarks/bench_losses.py`` (each configuration in its own subprocess, peak RSS) for a
151,936-token vocabulary (Qwen's) and prints its table: peak memory of the top-M + tail reverse KL
against the full-vocabulary reverse KL, as ratios.

Timings on a shared machine are noisy: compare the ratios, and rerun before trusting a small difference.
Usage: ``python benchmarks/bench_trainer.py [--quick] [--algos sft,grpo] [--steps 4] [--skip-memory]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agentgym_opd.config import load_config  # noqa: E402
from agentgym_opd.registry import algorithm_registry  # noqa: E402
from agentgym_opd.trainer import Trainer, algorithm_class  # noqa: E402


def run_algorithm(name: str, steps: int, out: Path, *, tasks_per_step: int, max_turns: int, max_new_tokens: int) -> dict:
    """Train ``name`` for ``steps`` steps; the mean throughput of steps 2.. (or step 1 if only one ran)."""
    cls = algorithm_class(name)
    overrides = {"algorithm": name, "env": "household/train", "output_dir": str(out), "model.student": "tiny",
                 "model.device": "cpu", "train.steps": steps, "train.checkpoint_every": 0, "eval.every": 0,
                 "rollout.tasks_per_step": tasks_per_step, "rollout.max_turns": max_turns,
                 "rollout.max_new_tokens": max_new_tokens, "rollout.group_size": 2 if cls.needs_groups else 1}
    if cls.needs_teacher:
        overrides["model.teacher"] = "tiny"
    config = load_config(None, [f"{k}={v}" for k, v in overrides.items()], algo_config_cls=cls.Config)
    started = time.perf_counter()
    trainer = Trainer(config, env_overrides={"num_tasks": 8}, progress=False)
    trainer.train()
    wall = time.perf_counter() - started
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    timed = rows[1:] or rows
    return {"rollout_tps": statistics.mean(r["rollout_tokens_per_s"] for r in timed),
            "train_tps": statistics.mean(r["train_tokens_per_s"] for r in timed),
            "update_s": statistics.mean(r["update_s"] for r in timed), "wall_s": wall,
            "phases": {phase: (statistics.mean(r.get(f"time/{phase}_s", 0.0) for r in timed),
                               max((r.get(f"mem/{phase}_peak_mb", float("nan")) for r in timed), default=float("nan")))
                       for phase in ("rollout", "teacher", "update")},
            "episodes": sum(1 for _ in rows) * tasks_per_step * overrides["rollout.group_size"]}


def throughput_table(names: list[str], steps: int, **budget: int) -> None:
    results: dict[str, dict | str] = {}
    with tempfile.TemporaryDirectory(prefix="bench_trainer_") as tmp:
        for name in names:
            print(f"  {name} ...", file=sys.stderr, flush=True)
            try:
                results[name] = run_algorithm(name, steps, Path(tmp) / name, **budget)
            except Exception as err:  # a broken algorithm is a row of the table, not a crash of the bench
                traceback.print_exc(file=sys.stderr)
                results[name] = f"{type(err).__name__}: {err}"
    base = results.get("sft")
    base_tps = base["train_tps"] if isinstance(base, dict) else None
    print(f"\nTrainer throughput: household/train, tiny model, {steps} steps, {budget}")
    header = f"{'algorithm':<10} {'rollout tok/s':>14} {'train tok/s':>12} {'x SFT train':>12} {'update s':>9} {'wall s':>8}"
    print(header)
    print("-" * len(header))
    for name, r in results.items():
        if isinstance(r, str):
            print(f"{name:<10} FAILED: {r[:200]}")
            continue
        ratio = f"{r['train_tps'] / base_tps:.2f}" if base_tps else "n/a"
        print(f"{name:<10} {r['rollout_tps']:>14.1f} {r['train_tps']:>12.1f} {ratio:>12} {r['update_s']:>9.2f} {r['wall_s']:>8.1f}")
    print("\nStep-time breakdown (metrics.jsonl time/* and mem/*: the update's seconds exclude teacher scoring;"
          " peak memory is the process's resident high-water mark per phase on CPU, the CUDA allocator's on GPU)")
    header = (f"{'algorithm':<10} {'rollout s':>9} {'teacher s':>9} {'update s':>9} {'rollout':>8} {'teacher':>8} "
              f"{'update':>8} {'rollout MB':>10} {'teacher MB':>10} {'update MB':>10}")
    print(header)
    print("-" * len(header))
    for name, r in results.items():
        if isinstance(r, str):
            continue
        phases = r["phases"]
        total = sum(seconds for seconds, _ in phases.values()) or 1e-9
        secs = " ".join(f"{phases[p][0]:>9.2f}" for p in ("rollout", "teacher", "update"))
        shares = " ".join(f"{phases[p][0] / total:>8.0%}" for p in ("rollout", "teacher", "update"))
        peaks = " ".join(f"{phases[p][1]:>10.0f}" for p in ("rollout", "teacher", "update"))
        print(f"{name:<10} {secs} {shares} {peaks}")
    print("SFT's rollout generates nothing (its episodes are replayed walkthroughs), so its rollout tok/s is not a sampling speed.")
    print("x SFT train = this algorithm's train tokens/s / SFT's (< 1: its update costs more per token, e.g. a teacher pass).")


def memory_table(quick: bool) -> None:
    script = Path(__file__).with_name("bench_losses.py")
    args = ["--tokens", "512", "--vocab", "151936", "--m", "64" if quick else "16,64,256", "--reps", "1" if quick else "3"]
    print("\nTop-M + tail reverse KL against the full vocabulary (benchmarks/bench_losses.py " + " ".join(args) + ")",
          flush=True)
    subprocess.run([sys.executable, str(script), *args], check=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="2 steps, 1 task per step, one M")
    parser.add_argument("--algos", default="", help="comma-separated subset (default: every registered algorithm)")
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--skip-memory", action="store_true")
    args = parser.parse_args()
    names = [n for n in args.algos.split(",") if n] or algorithm_registry.ids()
    unknown = [n for n in names if n not in algorithm_registry]
    if unknown:
        parser.error(f"unknown algorithm(s) {unknown}; registered: {algorithm_registry.ids()}")
    steps = args.steps or (2 if args.quick else 4)
    throughput_table(names, steps, tasks_per_step=1 if args.quick else 2, max_turns=4 if args.quick else 6,
                     max_new_tokens=12)
    if not args.skip_memory:
        memory_table(args.quick)


if __name__ == "__main__":
    main()
