"""The TextEnv wrapper's overhead counted by valgrind, in measures that machine load cannot move.

`bench_envs.py` times the wrapped and the raw loops; on a shared 2-core machine its ratio moves by several
points from run to run. This script plays the same loops (each family's `episode_modes()`) inside `valgrind
--tool=callgrind` with its cache and branch simulation: repeatable for the same interpreter, inputs and hash
seed, whatever else the machine does. Counting is switched on only inside `sys.call_tracing` (a C function
nothing else calls), and callgrind writes one profile per call, so one process measures every mode
("wrapped", "raw" and the bare-API "floor") after the same warm-up. Two figures per mode:

* instructions executed;
* estimated cycles, KCachegrind's "cycle estimation": instructions + 10 x (first-level cache misses +
  mispredicted branches) + 100 x last-level misses. WHY: instructions alone undercount the wrapper, whose
  code misses the instruction cache and mispredicts the interpreter's dispatch branches more often per
  instruction than the world logic; the estimate tracks the timed overhead of `bench_envs.py` to about a
  point, and stays repeatable.

Usage: `python benchmarks/bench_envs_instructions.py [--episodes 200]` (needs valgrind; ~2 minutes per
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


def _dump_totals(path: Path) -> dict[str, int]:
    """callgrind's event totals of one dump: Ir (instructions), I1mr/D1mr/D1mw (first-level misses),
    ILmr/DLmr/DLmw (last-level misses), Bcm/Bim (mispredicted conditional/indirect branches), ..."""
    text = path.read_text()
    events = re.search(r"^events: (.+)$", text, re.MULTILINE)
    totals = re.search(r"^(?:summary|totals): ([\d ]+)$", text, re.MULTILINE)
    if events is None or totals is None:
        raise RuntimeError(f"no event totals in callgrind's {path}")
    return dict(zip(events.group(1).split(), map(int, totals.group(1).split())))


def estimated_cycles(e: dict[str, int]) -> int:
    """KCachegrind's cycle estimation from callgrind's cache and branch simulation."""
    first_level = e["I1mr"] + e["D1mr"] + e["D1mw"]
    last_level = e["ILmr"] + e["DLmr"] + e["DLmw"]
    return e["Ir"] + 10 * (first_level + e["Bcm"] + e["Bim"]) + 100 * last_level


def count(module_name: str, episodes: int) -> dict[str, dict[str, float]]:
    """Instructions and estimated cycles per step of each mode, from one valgrind run of `child`."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "cg.out"
        cmd = [
            "valgrind", "--tool=callgrind", "--cache-sim=yes", "--branch-sim=yes", f"--callgrind-out-file={out}",
            "--collect-atstart=no",
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
        totals = [_dump_totals(p) for p in dumps]
    return {name: {"instructions": t["Ir"] / steps[name], "cycles": estimated_cycles(t) / steps[name]}
            for name, t in zip(MODES, totals)}


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
    print(f"\n{'env':<16} {'per step: instructions':>23} {'overhead':>9} {'floor':>7}   "
          f"{'estimated cycles':>16} {'overhead':>9} {'floor':>7}")
    for env_id, module_name in FAMILIES.items():
        if args.family and env_id not in args.family:
            continue
        per_step = count(module_name, args.episodes)
        row = f"{env_id:<16}"
        for measure, width in (("instructions", 23), ("cycles", 16)):
            wrapped, raw, floor = (per_step[m][measure] for m in MODES)
            row += f" {raw:>{width},.0f} {wrapped / raw - 1:>8.1%} {floor / raw - 1:>7.1%}  "
        print(row, flush=True)
    print("(per step of the raw logic; overhead = wrapped over raw, floor = the bare gymnasium API over raw)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
