"""`agentgym-opd leaderboard reproduce RECORD`: rerun a record's command on CPU, report old vs new.

The command comes from the record's ``provenance.command``. Only the project's own ``bench`` and
``eval`` subcommands are run (a record is third-party data: it never names an executable), through this
interpreter (``python -m agentgym_opd.cli``), with ``--device cpu`` and the output sent to a fresh
temporary folder. A bench record's rerun is narrowed to its own algorithm and seed (``--algos``,
``--seeds``, and ``--no-references`` unless the record is a reference row): runs are independent and
seeded, so that is the same run, at a fraction of the cost.

The report: per metric, the old and new means and the difference in standard errors,
``z = (new - old) / sqrt(se_old^2 + se_new^2)``. A record made on CPU must reproduce exactly (every
mean equal: exit 0, else 1); a GPU record is accepted when every |z| <= 2.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from evaluation.records import REFERENCE_ROWS, RecordError, protocol_label, validate_record

SUBCOMMANDS = ("bench", "eval")
OUTPUT_FLAGS = {"bench": "--output-dir", "eval": "--out"}
# the cheapest selection that still runs the reference row
REFERENCE_ALGOS = {"warm_start": "sft", "warm_start+context": "sft", "teacher": "opd"}


def _drop_flag(argv: list[str], flag: str) -> list[str]:
    out, skip = [], False
    for i, arg in enumerate(argv):
        if skip:
            skip = False
            continue
        if arg == flag:
            skip = True
            continue
        if arg.startswith(flag + "="):
            continue
        out.append(arg)
    return out


def rerun_argv(record: dict[str, Any], out_dir: Path) -> list[str]:
    """The argv (after ``python -m agentgym_opd.cli``) that reruns the record into ``out_dir`` on CPU."""
    command = list((record.get("provenance") or {}).get("command") or [])
    if len(command) < 2 or command[0] != "agentgym-opd" or command[1] not in SUBCOMMANDS:
        raise RecordError(f"record has no reproducible command (provenance.command must start with "
                          f"'agentgym-opd {'|'.join(SUBCOMMANDS)}'), got {command[:3]!r}")
    sub, args = command[1], command[2:]
    for flag in (OUTPUT_FLAGS[sub], "--device", "--publish"):
        args = _drop_flag(args, flag) if flag != "--publish" else [a for a in args if a != "--publish"]
    if sub == "bench":
        for flag in ("--algos", "--seeds", "--jobs"):
            args = _drop_flag(args, flag)
        algo = REFERENCE_ALGOS.get(record["algorithm"], record["algorithm"])
        args += ["--algos", algo, "--seeds", f"{record['seed']},", "--output-dir", str(out_dir)]
        if record["algorithm"] not in REFERENCE_ROWS and "--no-references" not in args:
            args.append("--no-references")  # an algorithm's run does not depend on the reference rows
    else:
        args += ["--out", str(out_dir / "record.json")]
    return [sub, *args, "--device", "cpu", "--no-progress"]


def find_match(record: dict[str, Any], folder: Path) -> dict[str, Any]:
    """The rerun's record of the same env, algorithm, seed and protocol. Only the protocol entries the
    published record states are compared: a record written before an entry existed (``env_args``) is still
    found in its rerun, which states it."""
    key = (record["env_id"], record["algorithm"], record["seed"], protocol_label(record))
    stated = set(record.get("protocol") or {})
    for path in sorted(folder.rglob("*.json")):
        try:
            candidate = validate_record(json.loads(path.read_text(encoding="utf-8")))
        except (ValueError, RecordError, OSError):
            continue
        protocol = {k: v for k, v in (candidate.get("protocol") or {}).items() if k in stated}
        if (candidate["env_id"], candidate["algorithm"], candidate["seed"],
                protocol_label({"protocol": protocol})) == key:
            return candidate
    raise RecordError(f"the rerun wrote no record for {key} under {folder}")


def compare(old: dict[str, Any], new: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for name in sorted(set(old["metrics"]) | set(new["metrics"])):
        a, b = old["metrics"].get(name), new["metrics"].get(name)
        if a is None or b is None:
            rows.append({"metric": name, "old": a and a["mean"], "new": b and b["mean"], "z": math.inf})
            continue
        scale = math.sqrt(a["stderr"] ** 2 + b["stderr"] ** 2)
        diff = b["mean"] - a["mean"]
        z = 0.0 if diff == 0 else (math.inf if scale == 0 else diff / scale)
        rows.append({"metric": name, "old": a["mean"], "new": b["mean"], "z": z})
    return rows


def format_report(rows: list[dict[str, Any]]) -> str:
    lines = [f"{'metric':<28} {'old':>9} {'new':>9} {'diff/se':>8}"]
    for r in rows:
        fmt = lambda v: "-" if v is None else f"{v:.4f}"  # noqa: E731
        lines.append(f"{r['metric']:<28} {fmt(r['old']):>9} {fmt(r['new']):>9} {r['z']:>8.2f}")
    return "\n".join(lines)


def reproduce(record: dict[str, Any], *, timeout_s: float = 3600, keep: Path | None = None) -> tuple[bool, dict[str, Any], list[dict[str, Any]]]:
    """Rerun and compare: (reproduced?, the new record marked ``origin: reproduced``, the comparison)."""
    validate_record(record)
    with tempfile.TemporaryDirectory(prefix="agentgym-opd-reproduce-") as tmp:
        out = Path(keep or tmp)
        argv = [sys.executable, "-m", "agentgym_opd.cli", *rerun_argv(record, out)]
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)
        if proc.returncode not in (0,):
            raise RecordError(f"the rerun failed (exit {proc.returncode}): {' '.join(argv[3:])}\n{proc.stderr[-1500:]}")
        new = find_match(record, out)
    rows = compare(record, new)
    exact = all(r["old"] == r["new"] for r in rows)
    device = (record.get("provenance") or {}).get("device", "cpu")
    ok = exact if device == "cpu" else all(abs(r["z"]) <= 2 for r in rows)
    return ok, {**new, "origin": "reproduced"}, rows
