"""Top-J retrieval latency of the experience bank at 10k and 100k entries, and a real query's embedding cost.

The bulk rows are embedded with the hashing embedder (384 dims, the width of all-MiniLM-L6-v2) so the
benchmark measures the store + index, not minutes of embedding; the real model's per-query cost is timed
separately. Usage: `python benchmarks/bench_experience_bank.py [--sizes 10000 100000] [--queries 200]`.
"""

from __future__ import annotations

import argparse
import tempfile
import time

import numpy as np

from agentgym_opd.embedding import HashingEmbedder, SentenceEmbedder
from experience_bank import Experience, ExperienceBank

WORDS = "apple mug knife book lamp fridge cabinet drawer shelf sofa heat cool clean put take examine".split()


def synthetic(n: int, rng: np.random.Generator) -> list[Experience]:
    out = []
    for i in range(n):
        words = " ".join(rng.choice(WORDS, size=6))
        out.append(Experience("bench/env", f"t{i}", f"task {i}: {words}", [(f"go to {words}", "ok")]))
    return out


def percentile_ms(samples: list[float], q: float) -> float:
    return float(np.percentile(np.array(samples) * 1000, q))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--k", type=int, default=3)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    rows = []
    for size in args.sizes:
        with tempfile.TemporaryDirectory() as tmp, ExperienceBank(tmp, HashingEmbedder(dim=384)) as bank:
            t0 = time.perf_counter()
            for start in range(0, size, 5000):
                bank.add_many(synthetic(min(5000, size - start), rng))
            build_s = time.perf_counter() - t0
            latencies, filtered = [], []
            for q in range(args.queries):
                text = f"task {q}: " + " ".join(rng.choice(WORDS, size=6))
                t = time.perf_counter()
                bank.retrieve(text, k=args.k)
                latencies.append(time.perf_counter() - t)
                t = time.perf_counter()
                bank.retrieve(text, k=args.k, env_id="bench/env")
                filtered.append(time.perf_counter() - t)
            rows.append((size, build_s, latencies, filtered))
    embedder = SentenceEmbedder()
    embedder.embed(["warm up"])
    embed_times = []
    for q in range(20):
        t = time.perf_counter()
        embedder.embed([f"put a clean mug {q} in the cabinet"])
        embed_times.append(time.perf_counter() - t)

    print(f"\ntop-{args.k} retrieval (store + faiss exact inner product, 384 dims), {args.queries} queries")
    print(f"{'entries':>9} {'insert s':>9} {'p50 ms':>8} {'p95 ms':>8} {'p50 ms (env filter)':>20}")
    for size, build_s, lat, filt in rows:
        print(f"{size:>9,} {build_s:>9.1f} {percentile_ms(lat, 50):>8.2f} {percentile_ms(lat, 95):>8.2f} "
              f"{percentile_ms(filt, 50):>20.2f}")
    print(f"\nreal query embedding (all-MiniLM-L6-v2, CPU): p50 {percentile_ms(embed_times, 50):.1f} ms, "
          f"p95 {percentile_ms(embed_times, 95):.1f} ms")


if __name__ == "__main__":
    main()
