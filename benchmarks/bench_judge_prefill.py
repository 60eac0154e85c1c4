"""What prefill buckets buy a batch of independent prompts: SAGE-OPD's judge call on SmolLM2.

The judge sends every non-error turn of a training batch (dozens of prompts of 500-1,500 tokens, capped at
``algo.judge_max_prompt_tokens``) to one greedy ``generate`` of 16 tokens. `HFPolicy.generate` prefills them in
buckets of similar length (`agentgym_opd.policy.batching`); this times that against one left-padded batch of
all of them, in one process, one torch thread, the two interleaved (order reversed each round), CPU seconds,
median over ``--rounds``. SmolLM2 frozen with bf16 projections and bf16 autocast, as the track's judge runs.
The prompts are random token ids with lengths drawn uniformly from ``--min-len``..``--max-len`` (prefill cost
depends on the lengths, not the words); it also reports how many rows generated the same tokens both ways.

    python benchmarks/bench_judge_prefill.py                  # 48 prompts, 2 rounds, ~10 min on one core
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=48)
    parser.add_argument("--min-len", type=int, default=500)
    parser.add_argument("--max-len", type=int, default=1500)
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--model", default=None, help="a local checkpoint (default: SmolLM2-135M-Instruct)")
    args = parser.parse_args(argv)

    import torch

    import agentgym_opd.policy.hf as hf
    from agentgym_opd.config import load_config
    from agentgym_opd.policy.base import SamplingParams
    from agentgym_opd.policy.loading import load_student
    from agentgym_opd.policy.smollm2 import smollm2_path

    torch.set_num_threads(1)
    config = load_config(None, ["model.device=cpu", "model.autocast=bfloat16"])
    policy = load_student(str(args.model or smollm2_path()), config.model, trainable=False)
    rng = random.Random(0)
    prompts = [[rng.randrange(100, 40_000) for _ in range(rng.randint(args.min_len, args.max_len))]
               for _ in range(args.prompts)]
    params = SamplingParams(max_new_tokens=args.new_tokens, temperature=0.0)
    budgets = {"buckets": hf.PREFILL_TOKEN_BUDGET, "one batch": 10**12}
    seconds: dict[str, list[float]] = {name: [] for name in budgets}
    tokens: dict[str, list[list[int]]] = {}
    for round_ in range(args.rounds):
        for name in (list(budgets) if round_ % 2 == 0 else list(reversed(budgets))):
            hf.PREFILL_TOKEN_BUDGET = budgets[name]
            start = time.process_time()
            gens = policy.generate(prompts, params)
            seconds[name].append(time.process_time() - start)
            tokens[name] = [g.token_ids for g in gens]
            print(f"round {round_ + 1} {name}: {seconds[name][-1]:.1f} CPU s", flush=True)
    padded = len(prompts) * max(len(p) for p in prompts)
    real = sum(len(p) for p in prompts)
    same = sum(a == b for a, b in zip(tokens["buckets"], tokens["one batch"]))
    base = statistics.median(seconds["one batch"])
    print(f"\n{args.prompts} prompts of {args.min_len}-{args.max_len} tokens ({real} tokens; one batch pads to {padded}), "
          f"{args.new_tokens} greedy tokens, median of {args.rounds} rounds:")
    for name in budgets:
        med = statistics.median(seconds[name])
        print(f"  {name:10s} {med:7.1f} CPU s   {base / med:.2f}x one batch")
    print(f"  same tokens both ways: {same} of {args.prompts} rows")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
