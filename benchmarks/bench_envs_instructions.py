"""The TextEnv wrapper's overhead counted in CPU instructions, a measure that machine load cannot move.

`bench_envs.py` times the wrapped and the raw loops; on a shared 2-core machine its ratio moves by several
points from run to run. This script plays the same loops (each family's `episode_modes()`) inside `valgrind
--tool=callgrind`, which counts the instructions the CPU executes: repeatable for the same interpreter,
inputs and hash seed, whatever else the machine does. Counting is switched on only inside `sys.call_tracing`
(a C function nothing else calls), and callgrind writes one profile per call, so one process measures every
mode ("wrapped", "raw" and the bare-API "floor") after the same warm-up. Instructions are not seconds: the
wrapper's code misses the instruction cache more often than the world logic (callgrind's cache simulation of
the household loops: 17% more first-level instruction-cache misses per step for 10% more instructions), so
the timed overhead runs above the counted one. The timed ratio stays the headline; this one is the
repeatable way to compare two versions of the wrapper.

Usage: `python benchmarks/bench_envs_instructions.py [--episodes 200]` (needs valgrind; ~1 minute per
family, most of it the interpreter starting under valgrind).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
FAMILIES = {"household/train": "bench_household", "tooluse/train": "bench_tooluse"}
MODES = ("wrapped", "raw", "floor")


def _play(mode, episodes: int) -> int:
    return sum(mode(k) for k in range(episodes))


def child(module_name: str, episodes: int) -> None:
    """Runs under valgrind: warm up every mode uncounted, then one counted `sys.call_tracing` per mode."""
    sys.path.insert(0, str(HERE))
    module = __import__(module_name)
    modes, _ = module.episode_modes()
    for name in MODES:  # first passes fill the envs' caches (generated tasks, admissible lists)
        _play(modes[name], episodes)
    steps = {name: sys.call_tracing(_play, (modes[name], episodes)) for name in MODES}
    print(json.dumps(steps))


def _dump_total(path: Path) -> int:
    match = re.search(r"^(?:summary|totals): (\d+)", path.read_text(), re.MULTILINE)
    if match is None:
        raise RuntimeError(f"no instruction total in callgrind's {path}")
    return int(match.group(1))


def count(module_name: str, episodes: int) -> dict[str, float]:
    """Instructions per step of each mode, from one valgrind run of `child`."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "cg.out"
        cmd = [
            "valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", "--collect-atstart=no",
            "--toggle-collect=sys_call_tracing", "--dump-after=sys_call_tracing",
            sys.executable, __file__, "--child", module_name, "--episodes", str(episodes),
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "PYTHONHASHSEED": "0"})
        if proc.returncode != 0:
            raise RuntimeError(f"valgrind run failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
        steps = json.loads(proc.stdout.strip().splitlines()[-1])
        dumps = sorted(Path(tmp).glob("cg.out.*"), key=lambda p: int(p.name.rsplit(".", 1)[1]))
        if len(dumps) != len(MODES):
            raise RuntimeError(
                f"expected {len(MODES)} callgrind dumps, found {len(dumps)}: is {sys.executable} built without "
                "symbols (callgrind must find the C function sys_call_tracing)?")
        totals = [_dump_total(p) for p in dumps]
    return {name: total / steps[name] for name, total in zip(MODES, totals)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--episodes", type=int, default=200, help="episodes per mode (counted once each)")
    parser.add_argument("--family", choices=sorted(FAMILIES), action="append",
                        help="measure only this env family (repeatable; default: all)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.episodes)
        return 0
    if shutil.which("valgrind") is None:
        print("valgrind is not installed (Debian: apt-get install valgrind)", file=sys.stderr)
        return 2
    print(f"\n{'env':<16} {'instructions/step: wrapped':>27} {'raw':>8} {'floor':>8} {'overhead':>9} {'floor':>7}")
    for env_id, module_name in FAMILIES.items():
        if args.family and env_id not in args.family:
            continue
        per_step = count(module_name, args.episodes)
        overhead = per_step["wrapped"] / per_step["raw"] - 1.0
        floor = per_step["floor"] / per_step["raw"] - 1.0
        print(f"{env_id:<16} {per_step['wrapped']:>27,.0f} {per_step['raw']:>8,.0f} {per_step['floor']:>8,.0f} "
              f"{overhead:>8.1%} {floor:>7.1%}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
