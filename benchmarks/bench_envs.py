"""Steps per second of each embedded environment, and the TextEnv wrapper's overhead over the raw logic.

Each env family's own benchmark module exposes `run(seconds) -> dict` with `env_steps_per_s` (through
`env.step`, the full contract) and `raw_steps_per_s` (the same work minus the wrapper), measured in the same
process so the ratio is meaningful on a noisy machine. Usage: `python benchmarks/bench_envs.py [--seconds 3]`.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

FAMILIES = {"household/train": "bench_household", "tooluse/train": "bench_tooluse"}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="measuring time per env and mode")
    args = parser.parse_args()
    rows = []
    for env_id, module in FAMILIES.items():
        rows.append({"env_id": env_id, **importlib.import_module(module).run(args.seconds)})
    print(f"\n{'env':<28} {'env.step/s':>12} {'raw/s':>12} {'overhead':>9}")
    for r in rows:
        overhead = r["raw_steps_per_s"] / r["env_steps_per_s"] - 1.0
        print(f"{r['env_id']:<28} {r['env_steps_per_s']:>12,.0f} {r['raw_steps_per_s']:>12,.0f} {overhead:>8.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
