"""One OPD step of SmolLM2-135M-Instruct in float32, under bf16 autocast, and bf16 with LoRA, in the same run, at
1 and 2 threads.

Part 1 (time): the real `Trainer` runs ``--steps`` OPD steps (student and teacher both SmolLM2: the cost is
what is measured, not the teacher's quality, so the OPD loss of these runs is ~0) in a fresh process per
(threads, variant), the variants' order reversed at each thread count so a neighbour's load hits them alike.
Variants: ``float32`` (full fine-tuning), ``bf16`` (``model.autocast=bfloat16``, full fine-tuning) and
``bf16-lora8`` (the same with ``model.lora_rank=8``). Per step it reports the trainer's own phase times
(``time/rollout_s``, ``time/teacher_s``, ``time/update_s``: the update excludes teacher scoring, but the
teacher's output head runs chunk by chunk inside the loss and is counted in the update), rollout tokens/s
(agent tokens generated per second of rollout), train tokens/s (sequence tokens per second of teacher scoring
plus update), the update's peak resident memory, the process's CPU seconds per step, and the ratio of each
variant's time to float32's. The first step is a warm-up and left out when more ran.

Part 2 (precision): one batch of the student's own rollouts, scored in float32 and under bf16 autocast: the
student's per-token log-probs of its sampled tokens (mean and max absolute difference) and OPD's per-token
reverse KL to a teacher that differs from the student (the same SmolLM2 shown the task's walkthrough in its
prompt, OPSD-style: the KL is a real signal, not 0), mean over agent tokens in both precisions: that mean is
OPD's loss on the batch, so its two values are the loss difference bf16 makes.

bf16 autocast keeps float32 weights and float32 logits (`agentgym_opd.policy.precision`); its speed needs a
CPU with native bf16 (``lscpu | grep -o 'avx512_bf16\\|amx_bf16'``) or a GPU. Timings on a shared machine are
noisy: read the ratios, and say how loaded the machine was (the report prints the load before and after).

    python benchmarks/bench_smollm2_opd_step.py                          # defaults: small sizes, ~10 min
    python benchmarks/bench_smollm2_opd_step.py --threads 1 --steps 3 --tasks 4 --max-turns 6
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# variant -> (model.autocast, model.lora_rank)
VARIANTS = {"float32": ("none", 0), "bf16": ("bfloat16", 0), "bf16-lora8": ("bfloat16", 8)}
PHASES = ("rollout", "teacher", "update")


# ------------------------------------------------------------------------------------------------ workers
def timing_worker(args: argparse.Namespace) -> dict:
    """Run the Trainer's OPD steps under one (threads, variant) in this process; per-step phase times."""
    import torch

    torch.set_num_threads(args.threads)
    from agentgym_opd.config import load_config
    from agentgym_opd.trainer import Trainer, algorithm_class

    autocast, lora_rank = VARIANTS[args.variant]
    overrides = {"algorithm": "opd", "env": args.env, "output_dir": args.out, "model.student": args.student,
                 "model.teacher": args.teacher, "model.device": "cpu", "model.autocast": autocast,
                 "model.lora_rank": lora_rank, "train.steps": args.steps, "train.checkpoint_every": 0,
                 "eval.every": 0, "seed": 0, "rollout.tasks_per_step": args.tasks, "rollout.max_turns": args.max_turns,
                 "rollout.max_new_tokens": args.max_new_tokens, "train.micro_batch_size": args.tasks}
    config = load_config(None, [f"{k}={v}" for k, v in overrides.items()], algo_config_cls=algorithm_class("opd").Config)
    trainer = Trainer(config, progress=False)
    cpu, wall = time.process_time(), time.perf_counter()
    trainer.train()
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    rows = [json.loads(line) for line in (Path(args.out) / "metrics.jsonl").read_text().splitlines() if line.strip()]
    rows = [r for r in rows if "time/rollout_s" in r]
    if not rows:
        raise RuntimeError(f"no step metrics in {args.out}/metrics.jsonl")
    timed = rows[1:] or rows
    mean = lambda key: statistics.mean(float(r.get(key, 0.0)) for r in timed)  # noqa: E731
    result = {f"{name}_s": mean(f"time/{name}_s") for name in PHASES}
    scoring_and_update = statistics.mean(float(r["time/teacher_s"]) + float(r["time/update_s"]) for r in timed)
    result.update({
        "step_s": sum(result[f"{name}_s"] for name in PHASES),
        "rollout_tps": statistics.mean(float(r["agent_tokens"]) / max(float(r["time/rollout_s"]), 1e-9) for r in timed),
        "train_tps": mean("tokens") / max(scoring_and_update, 1e-9),
        "agent_tokens": mean("agent_tokens"), "tokens": mean("tokens"),
        "update_peak_mb": max((float(r.get("mem/update_peak_mb", 0.0)) for r in timed), default=0.0),
        "trainable": sum(p.numel() for p in trainer.student.model.parameters() if p.requires_grad),
        "loss": [float(r.get("loss", float("nan"))) for r in rows], "cpu_s_per_step": cpu / len(rows),
        "wall_s": wall, "steps": len(rows), "timed_steps": len(timed)})
    return result


def precision_worker(args: argparse.Namespace) -> dict:
    """Score one batch of the student's rollouts in float32 and under bf16 autocast; the differences."""
    import copy

    import torch

    torch.set_num_threads(args.threads)
    from agentgym_opd.distill import aligned_teacher_logits, privileged_text, teacher_inputs, teacher_prefix
    from agentgym_opd.losses import full_vocab_divergence
    from agentgym_opd.policy.base import SamplingParams
    from agentgym_opd.policy.hf import HFPolicy
    from agentgym_opd.policy.loading import model_path
    from agentgym_opd.policy.precision import enable_autocast
    from agentgym_opd.registry import env_protocol, make
    from agentgym_opd.rollout import RolloutEngine

    torch.manual_seed(0)
    policy = HFPolicy.from_pretrained(model_path(args.student))
    protocol = env_protocol(args.env)
    engine = RolloutEngine(policy, SamplingParams(max_new_tokens=args.max_new_tokens, temperature=1.0),
                           system_prompt=protocol.system_prompt, action_parser=protocol.action_parser)
    envs = [make(args.env, max_turns=args.max_turns) for _ in range(args.tasks)]
    task_ids = envs[0].task_ids()[: args.tasks]
    batch = engine.collect(envs, task_ids, seed=0)
    prefixes = [teacher_prefix(policy, e, privileged_text(e.task)) for e in batch.episodes]
    inputs = teacher_inputs(batch, slice(0, len(task_ids)), prefixes, policy.pad_id)
    ids, attention = batch.input_ids, batch.attention_mask
    mask = batch.loss_mask[:, 1:].bool()

    def scores(model) -> tuple[torch.Tensor, torch.Tensor]:
        with torch.no_grad():
            logits = model(input_ids=ids, attention_mask=attention, use_cache=False).logits.float()[:, :-1]
            logp = logits.log_softmax(-1).gather(-1, ids[:, 1:, None])[..., 0]
            teacher = aligned_teacher_logits(model, inputs, ids.shape[1])
            kl = full_vocab_divergence(logits, teacher, mask.float(), "reverse_kl")
        return logp[mask], kl[mask]

    logp32, kl32 = scores(policy.model)
    logp16, kl16 = scores(enable_autocast(copy.deepcopy(policy.model), "bfloat16"))
    delta = (logp16 - logp32).abs()
    return {"agent_tokens": int(mask.sum()), "logp_mean_abs_diff": float(delta.mean()),
            "logp_max_abs_diff": float(delta.max()), "logp_mean_fp32": float(logp32.mean()),
            "logp_mean_bf16": float(logp16.mean()), "kl_mean_fp32": float(kl32.mean()),
            "kl_mean_bf16": float(kl16.mean()), "kl_token_mean_abs_diff": float((kl16 - kl32).abs().mean())}


# ------------------------------------------------------------------------------------------------ driver
def spawn(kind: str, args: argparse.Namespace, **extra) -> dict:
    """Run a worker in a fresh process (its own torch thread count) and read its JSON result."""
    with tempfile.TemporaryDirectory(prefix="bench_smollm2_") as tmp:
        result = Path(tmp) / "result.json"
        cmd = [sys.executable, __file__, "--worker", kind, "--result", str(result), "--out", str(Path(tmp) / "run"),
               *passthrough(args), *[f"--{k.replace('_', '-')}={v}" for k, v in extra.items()]]
        threads = str(extra.get("threads", 1))
        env = {**os.environ, "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads, "TOKENIZERS_PARALLELISM": "false"}
        proc = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True)
        if proc.returncode != 0:
            return {"error": (proc.stderr or proc.stdout).strip().splitlines()[-1:] or [f"exit {proc.returncode}"]}
        return json.loads(result.read_text())


def passthrough(args: argparse.Namespace) -> list[str]:
    return [f"--env={args.env}", f"--student={args.student}", f"--teacher={args.teacher}", f"--steps={args.steps}",
            f"--tasks={args.tasks}", f"--max-turns={args.max_turns}", f"--max-new-tokens={args.max_new_tokens}"]


def commit() -> str:
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True,
                               text=True).stdout.strip()
        return head + ("+dirty" if dirty else "") if head else "unknown"
    except OSError:
        return "unknown"


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def report(timings: dict, precision: dict, args: argparse.Namespace, load_before: str, load_after: str) -> str:
    lines = [f"{datetime.date.today()}, commit {commit()}, {os.cpu_count()} CPUs, load average (1/5/15 min) before "
             f"{load_before}, after {load_after}",
             f"OPD step, student {args.student}, teacher {args.teacher} (the same weights: the OPD loss is ~0 here, see "
             f"Part 2), {args.env}, {args.tasks} tasks x {args.max_turns} turns x {args.max_new_tokens} new tokens, "
             f"{args.steps} steps per run (first left out when more ran); times in s per step",
             "| threads | variant | rollout s | teacher s | update s | step s | rollout tok/s | train tok/s | "
             "update peak MB | CPU s/step | trainable | losses |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for (threads, name), r in timings.items():
        if "error" in r:
            lines.append(f"| {threads} | {name} | failed: {r['error']} |||||||||")
            continue
        lines.append(f"| {threads} | {name} | {r['rollout_s']:.1f} | {r['teacher_s']:.1f} | {r['update_s']:.1f} | "
                     f"{r['step_s']:.1f} | {r['rollout_tps']:.1f} | {r['train_tps']:.0f} | {r['update_peak_mb']:.0f} | "
                     f"{r['cpu_s_per_step']:.1f} | {r['trainable'] / 1e6:.2f}M | "
                     + ", ".join(f"{x:.4f}" for x in r["loss"]) + " |")
    lines.append("Speed-up against float32 at the same thread count (float32 time / variant time):")
    for threads in sorted({t for t, _ in timings}):
        base = timings.get((threads, "float32"), {})
        for name in VARIANTS:
            other = timings.get((threads, name), {})
            if name == "float32" or "step_s" not in base or "step_s" not in other:
                continue
            ratio = lambda k: base[k] / max(other[k], 1e-9)  # noqa: E731
            lines.append(f"  {threads} thread(s), {name}: rollout {ratio('rollout_s'):.2f}x, teacher scoring "
                         f"{ratio('teacher_s'):.2f}x, update {ratio('update_s'):.2f}x, whole step {ratio('step_s'):.2f}x; "
                         f"CPU time per step {ratio('cpu_s_per_step'):.2f}x")
    if 1 in {t for t, _ in timings}:
        for name in VARIANTS:
            one, more = timings.get((1, name), {}), [(t, r) for (t, n), r in timings.items() if n == name and t > 1]
            for threads, r in more:
                if "step_s" in one and "step_s" in r:
                    lines.append(f"  {name}: {threads} threads against 1, whole step {one['step_s'] / max(r['step_s'], 1e-9):.2f}x "
                                 f"(rollout {one['rollout_s'] / max(r['rollout_s'], 1e-9):.2f}x, update "
                                 f"{one['update_s'] / max(r['update_s'], 1e-9):.2f}x)")
    if precision.get("skipped"):
        lines.append("Precision comparison not run (--skip-precision).")
    elif "error" in precision:
        lines.append(f"Precision comparison failed: {precision['error']}")
    else:
        p = precision
        lines.append(f"Precision on one batch ({p['agent_tokens']} agent tokens): student log-prob |bf16 - fp32| mean "
                     f"{p['logp_mean_abs_diff']:.4f}, max {p['logp_max_abs_diff']:.4f} (mean log-prob "
                     f"{p['logp_mean_fp32']:.4f} fp32, {p['logp_mean_bf16']:.4f} bf16); OPD loss (reverse KL to the "
                     f"walkthrough-reading teacher, mean over agent tokens): {p['kl_mean_fp32']:.4f} fp32 vs "
                     f"{p['kl_mean_bf16']:.4f} bf16 (per-token |diff| mean {p['kl_token_mean_abs_diff']:.4f})")
    lines.append("The timing rows' losses are not a precision comparison: each run samples its own rollouts (bf16 "
                 "changes some sampled tokens) and the teacher is the student; Part 2 scores one batch both ways.")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", default="household/train", help="household/train: a microsecond env, so the model's "
                        "cost is what is timed; alfworld/train adds ALFWorld's own step time to the rollout")
    parser.add_argument("--student", default="smollm2")
    parser.add_argument("--teacher", default="smollm2")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--tasks", type=int, default=2)
    parser.add_argument("--max-turns", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=list(VARIANTS))
    parser.add_argument("--skip-precision", action="store_true")
    parser.add_argument("--worker", choices=["timing", "precision"], help=argparse.SUPPRESS)
    parser.add_argument("--variant", choices=list(VARIANTS), help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    for name in ("steps", "tasks", "max_turns", "max_new_tokens"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if any(t < 1 for t in args.threads):
        parser.error("--threads must be at least 1")
    if args.worker:
        args.threads = args.threads[0]
        result = timing_worker(args) if args.worker == "timing" else precision_worker(args)
        Path(args.result).write_text(json.dumps(result))
        return 0

    load_before = load()
    timings: dict[tuple[int, str], dict] = {}
    for index, threads in enumerate(args.threads):
        order = args.variants if index % 2 == 0 else list(reversed(args.variants))  # who goes first alternates
        for name in order:
            print(f"  {threads} thread(s), {name} ...", file=sys.stderr, flush=True)
            timings[(threads, name)] = r = spawn("timing", args, threads=threads, variant=name)
            print(f"    {json.dumps(r)}", file=sys.stderr, flush=True)  # kept if the run is stopped later
    timings = {k: timings[k] for k in sorted(timings, key=lambda k: (k[0], list(VARIANTS).index(k[1])))}
    precision = {"skipped": True} if args.skip_precision else spawn("precision", args, threads=max(args.threads))
    print(report(timings, precision, args, load_before, load()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
