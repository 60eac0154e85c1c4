"""Decode tokens/s of the HF session: the in-place KV cache + copy-free GQA against stock Transformers.

Both paths run in this process on the same prompts and seeds, alternating, and the script checks they
sample the same tokens. "Stock" is `DynamicCache` (append by `torch.cat`) with Transformers' SDPA
attention (which repeats the KV heads when there is an attention mask, as there always is in a session).

    python benchmarks/bench_decode.py [--model smollm2] [--batch 8] [--context 1024] [--new-tokens 32] [--repeats 2]
"""

from __future__ import annotations

import argparse
import statistics
import time
from contextlib import contextmanager

import torch

import agentgym_opd.policy.hf as hf
from agentgym_opd.policy.base import SamplingParams
from agentgym_opd.policy.loading import load_policy, resolve_policy


@contextmanager
def stock_transformers(policy):
    """The session's cache and the model's attention as Transformers ships them."""
    from transformers import DynamicCache

    saved = hf.slab_cache
    implementation = policy.model.config._attn_implementation
    hf.slab_cache = DynamicCache
    policy.model.set_attn_implementation("sdpa")
    try:
        yield
    finally:
        hf.slab_cache = saved
        policy.model.set_attn_implementation(implementation)


def decode(policy, prompts: list[list[int]], new_tokens: int) -> tuple[float, list]:
    """Prefill the prompts in a session, then time the decode of `new_tokens` per row (tokens/s)."""
    session = policy.session()
    rows = list(range(len(prompts)))
    first = session.generate(rows, prompts, SamplingParams(max_new_tokens=1, temperature=0.0), seeds=rows)
    sequences = [p + g.token_ids for p, g in zip(prompts, first)]
    params = SamplingParams(max_new_tokens=new_tokens, temperature=1.0)
    start = time.perf_counter()
    gens = session.generate(rows, sequences, params, seeds=rows)
    elapsed = time.perf_counter() - start
    return sum(len(g.token_ids) for g in gens) / elapsed, gens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--context", type=int, default=1024, help="prompt tokens per row")
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()

    policy = load_policy(resolve_policy(args.model), device="cpu")
    policy.stop_token_ids = []  # every row decodes all its tokens: equal work on both paths
    generator = torch.Generator().manual_seed(0)
    vocab = int(policy.model.config.vocab_size)
    prompts = [torch.randint(100, min(vocab, 20000), (args.context,), generator=generator).tolist()
               for _ in range(args.batch)]
    decode(policy, prompts[:1], 2)  # warm-up
    ours, stock = [], []
    for _ in range(args.repeats):
        rate, ours_gens = decode(policy, prompts, args.new_tokens)
        ours.append(rate)
        with stock_transformers(policy):
            rate, stock_gens = decode(policy, prompts, args.new_tokens)
        stock.append(rate)
        if [g.token_ids for g in ours_gens] != [g.token_ids for g in stock_gens]:
            raise SystemExit("the two paths sampled different tokens")
    a, b = statistics.median(ours), statistics.median(stock)
    print(f"{args.model}, batch {args.batch}, {args.context} cached tokens per row, {args.new_tokens} new tokens, "
          f"{torch.get_num_threads()} threads, median of {args.repeats}")
    print(f"{'path':<34}{'decode tok/s':>14}")
    print(f"{'in-place KV cache + GQA (ours)':<34}{a:>14.1f}")
    print(f"{'DynamicCache + stock SDPA':<34}{b:>14.1f}")
    print(f"ratio {a / b:.1f}x; same tokens on both paths")


if __name__ == "__main__":
    main()
