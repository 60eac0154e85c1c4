"""Retrieval quality and latency of SearchQA's retrievers on HotpotQA dev.

For each backend (BM25 via bm25s, dense via faiss + all-MiniLM-L6-v2) this prints recall@k for
k = 1, 3, 5, 10: the fraction of a question's supporting titles found in the top k passages (averaged
over questions; `all@k` = both supporting titles found, what a multi-hop question needs), the index
build/load time, and per-query latency (one query at a time, as the env issues them), in one table.
Both backends run in the same process over the same corpus, so their ratios are comparable.

    python benchmarks/bench_retrieval.py [--data-root ../shared/data] [--limit N] [--cache-dir DIR]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from environments.searchqa.datasets import load_hotpotqa
from environments.searchqa.retrievers import build_retriever

KS = (1, 3, 5, 10)


def evaluate(backend: str, examples, passages, cache_dir) -> dict:
    start = time.perf_counter()
    retriever = build_retriever(backend, passages, cache_dir=cache_dir)
    build_s = time.perf_counter() - start
    retriever.search("warm up", max(KS))
    latencies, recall, full = [], {k: [] for k in KS}, {k: [] for k in KS}
    for example in examples:
        t0 = time.perf_counter()
        hits = retriever.search(example.question, max(KS))
        latencies.append(time.perf_counter() - t0)
        gold = set(example.supporting_titles)
        for k in KS:
            found = gold & {p.title for p, _ in hits[:k]}
            recall[k].append(len(found) / len(gold))
            full[k].append(float(found == gold))
    latencies.sort()
    return {
        "backend": backend,
        "built": "built" if retriever.built_from_scratch else "cache",
        "build_s": build_s,
        "recall": {k: statistics.mean(v) for k, v in recall.items()},
        "all": {k: statistics.mean(v) for k, v in full.items()},
        "p50_ms": 1000 * latencies[len(latencies) // 2],
        "p95_ms": 1000 * latencies[int(len(latencies) * 0.95) - 1],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-root", default=str(Path(__file__).resolve().parents[2] / "shared" / "data"))
    parser.add_argument("--limit", type=int, default=None, help="first N dev questions (and only their paragraphs)")
    parser.add_argument("--cache-dir", default=None, help="index cache (default $AGENTGYM_OPD_CACHE or ~/.cache/agentgym_opd)")
    parser.add_argument("--backends", default="bm25,dense")
    args = parser.parse_args()
    examples, passages = load_hotpotqa("dev", data_root=args.data_root, limit=args.limit)
    examples = [e for e in examples if e.supporting_titles]
    print(f"HotpotQA dev: {len(examples)} questions, {len(passages)} passages\n")
    header = ["backend", "index", "index s"] + [f"R@{k}" for k in KS] + [f"all@{k}" for k in KS] + ["p50 ms", "p95 ms"]
    rows = []
    for backend in args.backends.split(","):
        r = evaluate(backend.strip(), examples, passages, args.cache_dir)
        rows.append([r["backend"], r["built"], f"{r['build_s']:.1f}"] + [f"{r['recall'][k]:.3f}" for k in KS]
                    + [f"{r['all'][k]:.3f}" for k in KS] + [f"{r['p50_ms']:.2f}", f"{r['p95_ms']:.2f}"])
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(header)]
    print(" | ".join(h.ljust(w) for h, w in zip(header, widths)))
    print("-+-".join("-" * w for w in widths))
    for row in rows:
        print(" | ".join(c.ljust(w) for c, w in zip(row, widths)))


if __name__ == "__main__":
    main()
