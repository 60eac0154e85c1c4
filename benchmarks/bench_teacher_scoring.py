"""Teacher scoring throughput: the served vLLM teacher (prompt log-probs) beside the in-process HF teacher.

Both score the same student rollouts (the untrained tiny model on household episodes: real multi-turn
token sequences) with the same contract, `score(contexts, continuations, top_m)`: the log-probs of the
student's exact ids, plus the teacher's top-M and tail for top-M distillation. Reported: scored tokens/s
of each backend per (batch, top_m), the vLLM/HF ratio, and the largest log-prob gap between the two (the
served-teacher test asserts < 1e-4). Measured in one process, after a warm-up call each, best of
``--repeats`` (the machine is shared: only the ratio compares).

Run with the Python that has vLLM (see README "Scale"):
    /tmp/vllm_venv/bin/python benchmarks/bench_teacher_scoring.py [--batches 8 32] [--top-m 0 64] [--threads 1]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path


def rollout_sequences(batch: int, max_turns: int, max_new_tokens: int):
    """(contexts, continuations) of ``batch`` household episodes played by the untrained tiny model."""
    import agentgym_opd
    from agentgym_opd.policy.base import SamplingParams
    from agentgym_opd.policy.hf import HFPolicy
    from agentgym_opd.policy.tiny import default_tiny_model
    from agentgym_opd.rollout import RolloutEngine

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from tiny_rollouts import accept_any

    policy = HFPolicy.from_pretrained(default_tiny_model())
    engine = RolloutEngine(policy, SamplingParams(max_new_tokens=max_new_tokens), action_parser=accept_any,
                           system_prompt="You are an agent in a text environment. Reply with exactly one action per turn.")
    tasks = agentgym_opd.make("household/train").task_ids()
    out = engine.collect("household/train", [tasks[k % len(tasks)] for k in range(batch)], seed=0, max_turns=max_turns)
    contexts, continuations = [], []
    for row, episode in enumerate(out.episodes):
        length = int(out.attention_mask[row].sum())
        ids = out.input_ids[row, :length].tolist()
        start = int(episode.prompt_length)
        contexts.append(ids[:start])
        continuations.append(ids[start:])
    return policy, contexts, continuations


def best_seconds(call, repeats: int) -> float:
    call()  # warm-up
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        call()
        times.append(time.perf_counter() - started)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, nargs="+", default=[8, 32])
    parser.add_argument("--top-m", type=int, nargs="+", default=[0, 64])
    parser.add_argument("--max-turns", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    from agentgym_opd.policy.vllm_backend import load_vllm_policy

    served = load_vllm_policy("tiny", max_model_len=4096, max_logprobs=max(args.top_m))
    print(f"{'batch':>5} {'top_m':>5} {'tokens':>7} {'HF tok/s':>10} {'vLLM tok/s':>11} {'vLLM/HF':>8} {'max |gap|':>10}")
    for batch in args.batches:
        hf, contexts, continuations = rollout_sequences(batch, args.max_turns, args.max_new_tokens)
        tokens = sum(len(c) for c in continuations)
        for top_m in args.top_m:
            hf_s = best_seconds(lambda: hf.score(contexts, continuations, top_m=top_m), args.repeats)
            v_s = best_seconds(lambda: served.score(contexts, continuations, top_m=top_m), args.repeats)
            gap = max(float((a.logprobs - b.logprobs).abs().max()) for a, b in
                      zip(hf.score(contexts, continuations, top_m=top_m), served.score(contexts, continuations, top_m=top_m)))
            print(f"{batch:>5} {top_m:>5} {tokens:>7} {tokens / hf_s:>10.0f} {tokens / v_s:>11.0f} "
                  f"{hf_s / v_s:>8.2f} {gap:>10.1e}", flush=True)


if __name__ == "__main__":
    main()
