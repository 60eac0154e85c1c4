"""How far bf16 can take SmolLM2's update on this CPU: forward + backward in float32, under bf16 autocast (float32
master weights, what ``model.autocast=bfloat16`` runs), and with the weights themselves stored in bf16 (no casts, a
bf16 residual stream: the ceiling of a "bf16 weights + float32 master copies" optimiser, whose extra copy step
is left out here).

One process, one torch thread, the three variants interleaved (their order reversed each round) so a neighbour's
load hits them alike; CPU seconds per forward + backward, median over ``--rounds``, and each variant's ratio to
float32. The loss is a mean log-prob of the batch's own tokens, so the backward covers the whole model and the
output head, as an update does.

    python benchmarks/bench_bf16_update.py                   # 4 x 512 tokens, 3 rounds, ~5 min on one core
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)

    import torch
    from transformers import AutoModelForCausalLM

    from agentgym_opd.policy.precision import enable_autocast
    from agentgym_opd.policy.smollm2 import smollm2_path

    torch.set_num_threads(1)
    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(str(smollm2_path()), dtype=torch.float32)
    base.config.use_cache = False
    models = {"float32": base, "bf16 autocast": enable_autocast(copy.deepcopy(base), "bfloat16"),
              "bf16 weights": copy.deepcopy(base).to(torch.bfloat16)}
    ids = torch.randint(0, base.config.vocab_size, (args.rows, args.tokens))

    def forward_backward(model: torch.nn.Module) -> float:
        start = time.process_time()
        logits = model(input_ids=ids).logits.float()
        torch.log_softmax(logits, -1).gather(-1, ids[..., None]).mean().backward()
        model.zero_grad(set_to_none=True)
        return time.process_time() - start

    for model in models.values():  # warm-up
        forward_backward(model)
    times: dict[str, list[float]] = {name: [] for name in models}
    for r in range(args.rounds):
        for name in (list(models) if r % 2 == 0 else list(models)[::-1]):
            times[name].append(forward_backward(models[name]))
    median = {name: statistics.median(v) for name, v in times.items()}
    print(f"SmolLM2-135M forward + backward, {args.rows} x {args.tokens} tokens, one thread, median of {args.rounds}")
    print(f"{'variant':<15} {'CPU s':>7} {'vs float32':>10}")
    for name, seconds in median.items():
        print(f"{name:<15} {seconds:>7.2f} {median['float32'] / seconds:>9.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
