"""Steps per second of each embedded environment, and the TextEnv wrapper's overhead over the raw logic.

Each env family's own benchmark module exposes `run(seconds) -> dict` with `env_steps_per_s` (through
`env.step`, the full contract), `raw_steps_per_s` (the same work minus the wrapper) and the overhead with
its interquartile range over paired rounds, and the overhead of the bare gymnasium API (`_gym_floor.py`),
all measured in the same process so the ratios are meaningful on a noisy machine.
`bench_envs_instructions.py` counts the same overhead in CPU instructions, which load cannot move. Usage:
`python benchmarks/bench_envs.py [--seconds 3]`.
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
    parser.add_argument("--new-texts", action="store_true",
                        help="also time household actions that arrive as new string objects, and never-seen texts")
    args = parser.parse_args()
    rows = []
    for env_id, module in FAMILIES.items():
        rows.append({"env_id": env_id, **importlib.import_module(module).run(args.seconds)})
    print(f"\n{'env':<16} {'env.step/s':>11} {'raw/s':>11} {'overhead':>9} {'IQR':>15} {'gym API floor':>14}")
    for r in rows:
        q1, q3 = r["overhead_iqr"]
        print(f"{r['env_id']:<16} {r['env_steps_per_s']:>11,.0f} {r['raw_steps_per_s']:>11,.0f} "
              f"{r['wrapper_overhead']:>8.1%} {q1:>7.1%}..{q3:<6.1%} {r['floor_overhead']:>13.1%}")
    if args.new_texts:
        new = importlib.import_module("bench_household").run_new_texts(args.seconds)
        print(f"\nhousehold/train, actions as new string objects: {new['wrapped_new_object']:.1%} overhead; "
              f"every text unseen (full checks each step): {new['wrapped_unseen']:.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
