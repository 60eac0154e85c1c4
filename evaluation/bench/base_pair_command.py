"""`agentgym-opd base-pair [show | build | check]`: the household base pair that the bench starts from.

The default pair (a student and a larger teacher, `evaluation.bench.base_models.STUDENT_SPEC` / `TEACHER_SPEC`)
ships with the repository, so a fresh clone's bench starts at once. This command makes the shipped files
checkable rather than trusted:

* `show` lists both models: their short names (`household-student`, `household-teacher`, accepted by
  `--student`/`--teacher`/`--policy` everywhere), their labels in records, the settings key, and which
  folder is used (shipped or a cached build).
* `build` trains the pair again from its recipe into the cache (both models side by side, one process and
  one torch thread each, with a progress bar and ETA). It never overwrites the shipped files.
* `check` compares that rebuild with the shipped pair: bit-identical weights, or else (floating point may
  differ across CPUs) the two versions' greedy success on the bench's held-out tasks, paired task by task
  with the exact interval. It passes when the weights are identical or the interval contains 0.

Exit codes: 0 done (check: agrees), 1 check disagrees, 2 bad use (nothing built yet, unknown role).
"""

from __future__ import annotations

import argparse
import sys
import time

HELP = "show, rebuild from its recipe, or check the shipped household base pair the bench starts from"
ROLES = ("student", "teacher")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", nargs="?", choices=("show", "build", "check"), default="show",
                        help="show (default): where each model comes from; build: retrain the pair into the "
                             "cache; check: compare the rebuild with the shipped files")
    parser.add_argument("--only", choices=ROLES, default=None, help="build or check one model only")
    parser.add_argument("--jobs", type=int, default=2, metavar="N",
                        help="build: processes side by side (default 2: student and teacher at once)")
    parser.add_argument("--episodes", type=int, default=100, metavar="N",
                        help="check: held-out household/valid_unseen tasks to evaluate when weights differ (default 100)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")


def _specs(only: str | None) -> dict:
    from evaluation.bench.base_models import STUDENT_SPEC, TEACHER_SPEC

    specs = {"student": STUDENT_SPEC, "teacher": TEACHER_SPEC}
    return {role: spec for role, spec in specs.items() if only in (None, role)}


def show() -> int:
    from evaluation.bench.base_models import base_label, base_model_dir, cached_base_model, shipped_model_dir

    for role, spec in _specs(None).items():
        used = cached_base_model(spec)
        where = ("shipped" if used == shipped_model_dir(spec) else "cached build") if used else "not built"
        rebuilt = base_model_dir(spec) / "model"
        print(f"household-{role}: {base_label(spec)} (settings key {spec.key()})")
        print(f"  used: {used or '-'} ({where})")
        print(f"  rebuild: {rebuilt if (rebuilt / 'config.json').is_file() else '- (agentgym-opd base-pair build)'}")
    return 0


def _build_one(role: str, progress_file: str) -> str:
    """One model's build in its own process (one torch thread: the fastest for these widths on a shared CPU);
    it reports its steps done through ``progress_file``."""
    import torch
    from pathlib import Path

    torch.set_num_threads(1)
    from transformers.utils import logging as hf_logging

    from evaluation.bench.base_models import ensure_base_model

    hf_logging.disable_progress_bar()
    return str(ensure_base_model(_specs(role)[role], progress=False, shipped=False, progress_file=Path(progress_file),
                                 log=lambda line: print(line, file=sys.stderr, flush=True)))


def _steps_done(path) -> int:
    try:
        return int(path.read_text(encoding="utf-8").strip() or 0)
    except (OSError, ValueError):
        return 0


def build(only: str | None, jobs: int, progress: bool) -> int:
    """The builds in ``jobs`` processes side by side, with one bar over both (steps done, ETA)."""
    import concurrent.futures as cf
    import multiprocessing
    import tempfile
    from pathlib import Path

    from tqdm import tqdm

    from evaluation.bench.base_models import estimated_build_seconds

    specs = _specs(only)
    if jobs < 1:
        print(f"error: --jobs needs at least 1 process, got {jobs}", file=sys.stderr)
        return 2
    estimates = {role: estimated_build_seconds(spec) for role, spec in specs.items()}
    total = max(estimates.values()) if jobs > 1 else sum(estimates.values())
    print(f"rebuilding {', '.join(specs)} from the recipe in evaluation/bench/base_models.py into the cache "
          f"(the shipped files stay as they are); ~{total / 60:.0f} min on 2 cores", file=sys.stderr, flush=True)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="base-pair-") as tmp, \
            cf.ProcessPoolExecutor(max_workers=min(jobs, len(specs)), mp_context=multiprocessing.get_context("spawn")) as pool:
        files = {role: Path(tmp) / f"{role}.progress" for role in specs}
        futures = {role: pool.submit(_build_one, role, str(files[role])) for role in specs}
        with tqdm(total=sum(spec.steps for spec in specs.values()), desc="base pair", unit="step",
                  disable=not progress) as bar:
            while not all(f.done() for f in futures.values()):
                cf.wait(list(futures.values()), timeout=2.0)
                bar.n = sum(_steps_done(path) for path in files.values())
                bar.set_description("base pair (building: " + ", ".join(r for r, f in futures.items() if not f.done()) + ")")
                bar.refresh()
        paths = {role: future.result() for role, future in futures.items()}
    for role, path in paths.items():
        print(f"household-{role}: {path}")
    print(f"built in {(time.perf_counter() - started) / 60:.1f} min; compare with the shipped pair: "
          "agentgym-opd base-pair check", file=sys.stderr)
    return 0


def weights_identical(a, b) -> tuple[bool, float]:
    """(every tensor equal, the largest absolute difference) between two model folders' safetensors."""
    from safetensors.torch import load_file

    left, right = load_file(str(a / "model.safetensors")), load_file(str(b / "model.safetensors"))
    if set(left) != set(right):
        return False, float("inf")
    worst = 0.0
    for name, tensor in left.items():
        other = right[name]
        if tensor.shape != other.shape:
            return False, float("inf")
        worst = max(worst, float((tensor.float() - other.float()).abs().max()) if tensor.numel() else 0.0)
    return worst == 0.0, worst


def held_out_outcomes(model, episodes: int) -> dict[tuple[int, str], float]:
    """Greedy success per task of one model folder on the bench's first ``episodes`` valid_unseen tasks."""
    from evaluation.bench.episodes import eval_env_args, evaluate_policy, load_frozen_policy, make_env
    from evaluation.bench.settings import BenchSettings

    settings = BenchSettings.full(seeds=[0], eval_episodes=episodes, progress=False)
    env_id = "household/valid_unseen"
    env_args = eval_env_args(env_id, settings)
    tasks = make_env(env_id, settings, env_args).task_ids()[:episodes]
    played, _ = evaluate_policy(load_frozen_policy(str(model), settings), env_id, settings, env_args=env_args, tasks=tasks)
    return {(0, task): float(episode.success) for task, episode in zip(tasks, played)}


def check(only: str | None, episodes: int) -> int:
    from evaluation.bench.base_models import base_model_dir, shipped_model_dir
    from evaluation.bench.stats import format_difference, paired_difference

    agree = True
    for role, spec in _specs(only).items():
        shipped, rebuilt = shipped_model_dir(spec), base_model_dir(spec) / "model"
        missing = [str(p) for p in (shipped, rebuilt) if not (p / "model.safetensors").is_file()]
        if missing:
            print(f"error: household-{role}: no model in {', '.join(missing)}; run `agentgym-opd base-pair build` "
                  "first (and keep the shipped files of evaluation/bench/base_pair)", file=sys.stderr)
            return 2
        same, worst = weights_identical(shipped, rebuilt)
        if same:
            print(f"household-{role}: rebuild identical to the shipped weights (bit for bit)")
            continue
        print(f"household-{role}: weights differ (largest difference {worst:.3g}); evaluating both on "
              f"{episodes} household/valid_unseen tasks", file=sys.stderr, flush=True)
        a, b = held_out_outcomes(rebuilt, episodes), held_out_outcomes(shipped, episodes)
        diff = paired_difference(a, b)
        ok = diff is not None and diff["low"] <= 0.0 <= diff["high"]
        agree &= ok
        print(f"household-{role}: success rebuilt {sum(a.values()) / len(a):.3f}, shipped {sum(b.values()) / len(b):.3f}, "
              f"rebuilt - shipped {format_difference(diff)} (exact paired 95% interval): "
              + ("agrees" if ok else "DIFFERS"))
    return 0 if agree else 1


def run(args: argparse.Namespace) -> int:
    if args.action == "build":
        return build(args.only, args.jobs, progress=not args.no_progress)
    if args.action == "check":
        if args.episodes < 2:
            print(f"error: --episodes needs at least 2 tasks for a paired interval, got {args.episodes}", file=sys.stderr)
            return 2
        return check(args.only, args.episodes)
    return show()
