"""`agentgym-opd leaderboard reproduce RECORD`: rerun a record's command on CPU, report old vs new.

The command comes from the record's ``provenance.command``. Only the project's own ``bench`` and
``eval`` subcommands are run (a record is third-party data: it never names an executable), through this
interpreter (``python -m agentgym_opd.cli``), with ``--device cpu`` and the output sent to a fresh
temporary folder. A bench record's rerun is narrowed to its own algorithm and seed (``--algos``,
``--seeds``, and ``--no-references`` unless the record is a reference row): runs are independent and
seeded, so that is the same run, at a fraction of the cost.

A record is third-party data, so its command is checked before it runs: every option that makes the
command write outside the rerun's folder (``WRITING_FLAGS``: ``--publish`` would add to the repo's
leaderboard) is dropped in any spelling argparse could read as it (``--pub``, ``--publish=1``), the rerun's own
output folder is added, and the result is parsed by the subcommand's own arguments with abbreviations off (as
the CLI parses them): a command that does not parse word for word, that sets a config key naming where a run
writes (``WRITING_CONFIG_KEYS``, e.g. ``output_dir=/elsewhere``), or whose parsed outputs are not the rerun's
folder is refused before anything runs.

An eval record that carries the training behind its policy (``provenance.training``, from the checkpoint's
``training.json``) is rerun in two phases: the training, from the record's resolved config (``agentgym-opd
train --config``, into the rerun's folder, on CPU, up to the step the record evaluated), then the eval command
against the new checkpoint (its ``--policy`` replaced). Every starting model the training names must be here
with the same weights (`evaluation.training_provenance.starting_model_problems`), and the config must name no
place to write (``WRITING_CONFIG_KEYS``), before anything runs. A bench record's rerun is its bench job, which
trains too.

The report: per metric, the old and new means and the difference in standard errors,
``z = (new - old) / sqrt(se_old^2 + se_new^2)``. A record made on CPU must reproduce exactly (every
mean equal, and the evaluated weights' hash equal where both records state one: exit 0, else 1); a GPU record
(evaluated or trained on a GPU) is accepted when every |z| <= 2.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable

from evaluation.records import REFERENCE_ROWS, RecordError, protocol_label, reproduces_id, validate_record

# the project's commands a record may rerun
SUBCOMMANDS = ("bench", "eval")
OUTPUT_FLAGS = {"bench": "--output-dir", "eval": "--out"}
# every option with which a command writes outside the folder it is given: dropped from a record's command
# (the output folder is replaced by the rerun's own; --publish adds to the repo's leaderboard/)
WRITING_FLAGS = {"bench": ("--output-dir", "--publish"), "eval": ("--out",)}
# config keys (bench's `section.key=value` overrides and --algo-set ALGO:key=value) that name where a run
# writes: a command setting one is refused, since its run would write there
WRITING_CONFIG_KEYS = ("output_dir", "algo.bank_path")
# options the rerun sets itself (the device, and a bench narrowed to the record's own run)
REPLACED_FLAGS = {"bench": ("--device", "--algos", "--seeds", "--jobs"), "eval": ("--device",)}
# the cheapest selection that still runs the reference row
REFERENCE_ALGOS = {"warm_start": "sft", "warm_start+context": "sft", "teacher": "opd"}


class _RaisingParser(argparse.ArgumentParser):
    """An ArgumentParser whose every error (a missing required option too) is raised, never printed and exited."""

    def error(self, message: str):  # type: ignore[override]
        raise argparse.ArgumentError(None, message)


def command_parser(sub: str) -> argparse.ArgumentParser:
    """``agentgym-opd SUB``'s own arguments as the CLI parses them, with abbreviations off (``--pub`` is not
    ``--publish``) and errors raised rather than printed and exited."""
    parser = _RaisingParser(prog=f"agentgym-opd {sub}", add_help=False, allow_abbrev=False, exit_on_error=False)
    _command_module(sub).add_arguments(parser)
    return parser


def _command_module(sub: str) -> Any:
    """The module that defines ``agentgym-opd SUB``, found as the CLI finds it (its entry point), so the
    arguments checked here are the ones the rerun's CLI parses."""
    from importlib import metadata

    from agentgym_opd.cli import COMMAND_GROUP

    found = list(metadata.entry_points(group=COMMAND_GROUP, name=sub))
    if not found:
        raise RecordError(f"the `agentgym-opd {sub}` command is not installed here; reinstall the package")
    return found[0].load()


def drop_option(argv: list[str], flag: str, parser: argparse.ArgumentParser) -> list[str]:
    """``argv`` without ``flag`` of ``parser`` in any spelling argparse could read as it: whole, abbreviated
    (``--pub``, ``--p``), or with ``=value`` (``--publish=1``, ``--out=x``); and without its value when it takes
    one. Another option's own full name is kept (``--seed`` is not ``--seeds``)."""
    options = parser._option_string_actions  # noqa: SLF001 (argparse keeps no public table of its options)
    takes_value = options[flag].nargs != 0
    out, i = [], 0
    while i < len(argv):
        name, eq, _ = argv[i].partition("=")
        if name.startswith("--") and len(name) > 2 and flag.startswith(name) and (name == flag or name not in options):
            i += 1 + (1 if takes_value and not eq else 0)
            continue
        out.append(argv[i])
        i += 1
    return out


def parse_command(sub: str, argv: list[str]) -> argparse.Namespace:
    """``argv`` parsed as the CLI parses ``agentgym-opd SUB argv`` (``section.key=value`` words between flags
    join bench's overrides), with abbreviations off; anything else is a RecordError."""
    def refuse(problem: str) -> RecordError:
        return RecordError(f"the record's command is not one `agentgym-opd {sub}` accepts word for word ({problem}); "
                           "options must be spelled out in full (abbreviations such as --pub are refused)")

    try:
        args, extra = command_parser(sub).parse_known_args(argv)
    except (argparse.ArgumentError, SystemExit) as err:
        raise refuse(str(err)) from err
    if extra and not hasattr(args, "overrides"):
        raise refuse(f"it does not take {extra[:5]!r}")
    overrides = list(getattr(args, "overrides", None) or []) + extra
    stray = [x for x in overrides if "=" not in x or x.startswith("-")]
    if stray:
        raise refuse(f"{stray[:5]!r} are neither its options nor section.key=value overrides")
    if hasattr(args, "overrides"):
        args.overrides = overrides
    return args


def _config_writes(args: argparse.Namespace) -> list[str]:
    """The config overrides of a parsed command that set where a run writes (``WRITING_CONFIG_KEYS``)."""
    items = list(getattr(args, "overrides", None) or []) + [x.partition(":")[2] for x in getattr(args, "algo_set", None) or []]
    return [x for x in items if x.partition("=")[0].strip() in WRITING_CONFIG_KEYS]


def _check_writes_only_into(sub: str, args: argparse.Namespace, out_dir: Path) -> None:
    """Refuse a parsed rerun command that would write anywhere but ``out_dir``: what runs is what was checked."""
    problems = [f"it sets {x!r}" for x in _config_writes(args)]
    if sub == "bench" and (args.publish or args.output_dir != str(out_dir)):
        problems.append("it would publish or write outside the rerun's folder")
    if sub == "eval" and args.out != str(out_dir / "record.json"):
        problems.append("it would write its record outside the rerun's folder")
    if problems:
        raise RecordError(f"the record's command writes outside the folder reproduce gives it: {'; '.join(problems)}; "
                          "nothing was run (a published command names no output location of its own)")


def rerun_argv(record: dict[str, Any], out_dir: Path, *, policy: Path | None = None) -> list[str]:
    """The argv (after ``python -m agentgym_opd.cli``) that reruns the record into ``out_dir`` on CPU; an eval
    command's ``--policy`` is replaced by ``policy`` when given (the checkpoint a rerun training made)."""
    command = list((record.get("provenance") or {}).get("command") or [])
    if len(command) < 2 or command[0] != "agentgym-opd" or command[1] not in SUBCOMMANDS:
        raise RecordError(f"record has no reproducible command (provenance.command must start with "
                          f"'agentgym-opd {'|'.join(SUBCOMMANDS)}'), got {command[:3]!r}")
    sub, args = command[1], command[2:]
    parser = command_parser(sub)
    for flag in (*WRITING_FLAGS[sub], *REPLACED_FLAGS[sub]):
        args = drop_option(args, flag, parser)
    if sub == "bench":
        algo = REFERENCE_ALGOS.get(record["algorithm"], record["algorithm"])
        args += ["--algos", algo, "--seeds", f"{record['seed']},", "--output-dir", str(out_dir)]
        if record["algorithm"] not in REFERENCE_ROWS and "--no-references" not in args:
            args.append("--no-references")  # an algorithm's run does not depend on the reference rows
    else:
        if policy is not None:
            args = drop_option(args, "--policy", parser) + ["--policy", str(policy)]
        args += ["--out", str(out_dir / "record.json")]
    argv = [*args, "--device", "cpu", "--no-progress"]
    _check_writes_only_into(sub, parse_command(sub, argv), out_dir)
    return [sub, *argv]


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


def retrains(record: dict[str, Any]) -> bool:
    """Whether reproducing the record reruns its training first: an eval record whose provenance carries a
    trainer's run config (a bench record's job trains by itself)."""
    provenance = record.get("provenance") or {}
    training, command = provenance.get("training"), provenance.get("command") or []
    return (command[1:2] == ["eval"] and isinstance(training, dict)
            and (training["command"] is None or training["command"][1] == "train"))


def training_argv(record: dict[str, Any], out_dir: Path) -> tuple[list[str], Path]:
    """The argv (after ``python -m agentgym_opd.cli``) that reruns the record's training into
    ``out_dir/training`` on CPU, up to the step the record evaluated, and the checkpoint it will write.
    Refused before anything runs: a starting model that is not here or has other weights, a config that names
    a place to write (``WRITING_CONFIG_KEYS``)."""
    from evaluation.training_provenance import starting_model_problems

    training = record["provenance"]["training"]
    problems = starting_model_problems(training)
    config = json.loads(json.dumps(training["config"]))
    for key in WRITING_CONFIG_KEYS[1:]:  # output_dir is replaced below
        head, _, name = key.partition(".")
        if (config.get(head) or {}).get(name):
            problems.append(f"its config sets {key}={config[head][name]!r:.80}, a place to write outside the rerun's folder")
    steps = training["budget"]["steps"] or (config.get("train") or {}).get("steps")
    if not (isinstance(config.get("model"), dict) and isinstance(steps, int) and steps >= 1):
        problems.append("its config has no model section or no step count to train to")
    if problems:
        raise RecordError(f"the record's training cannot be rerun here: {'; '.join(problems)}; nothing was run")
    config["output_dir"] = str(out_dir / "training")
    config["model"]["device"] = "cpu"
    config["train"] = {**(config.get("train") or {}), "steps": steps}  # the loop's bound only: same steps up to it
    path = out_dir / "training-config.json"
    path.write_text(json.dumps(config, indent=2), encoding="utf-8")
    return ["train", "--config", str(path), "--no-progress"], out_dir / "training" / "checkpoints" / f"step_{steps}"


def _run(argv: list[str], what: str, timeout_s: float) -> None:
    full = [sys.executable, "-m", "agentgym_opd.cli", *argv]
    proc = subprocess.run(full, capture_output=True, text=True, timeout=timeout_s)
    if proc.returncode != 0:
        raise RecordError(f"the rerun's {what} failed (exit {proc.returncode}): agentgym-opd {' '.join(argv)}\n"
                          f"{proc.stderr[-1500:]}")


def weights_agree(old: dict[str, Any], new: dict[str, Any]) -> bool | None:
    """Whether the rerun evaluated the same weights (``provenance.weights_sha256``); None when either lacks it."""
    a, b = ((r.get("provenance") or {}).get("weights_sha256") for r in (old, new))
    return None if a is None or b is None else a == b


def reproduce(record: dict[str, Any], *, timeout_s: float = 3600, keep: Path | None = None,
              log: Callable[[str], None] | None = None) -> tuple[bool, dict[str, Any], list[dict[str, Any]]]:
    """Rerun and compare: (reproduced?, the new record marked ``origin: reproduced`` and naming the record it
    reruns in ``reproduces``, the comparison). ``log`` is told each phase as it starts."""
    validate_record(record)
    say = log or (lambda line: None)
    with tempfile.TemporaryDirectory(prefix="agentgym-opd-reproduce-") as tmp:
        out = Path(keep or tmp)
        out.mkdir(parents=True, exist_ok=True)
        train, checkpoint = training_argv(record, out) if retrains(record) else (None, None)
        argv = rerun_argv(record, out, policy=checkpoint)  # both checked before either runs
        if train is not None:
            say(f"phase 1/2, training (on cpu, to {checkpoint.name}): agentgym-opd {' '.join(train)}")
            _run(train, "training", timeout_s)
        say(f"{'phase 2/2, ' if train else ''}evaluation (on cpu): agentgym-opd {' '.join(argv)}")
        _run(argv, "evaluation" if train is None else "evaluation of the retrained checkpoint", timeout_s)
        new = find_match(record, out)
    rows = compare(record, new)
    exact = all(r["old"] == r["new"] for r in rows)
    provenance = record.get("provenance") or {}
    trained_on_cpu = train is None or provenance["training"]["device"] == "cpu"
    if provenance.get("device", "cpu") == "cpu" and trained_on_cpu:
        ok = exact and weights_agree(record, new) is not False
    else:
        ok = all(abs(r["z"]) <= 2 for r in rows)
    return ok, {**new, "origin": "reproduced", "reproduces": reproduces_id(record)}, rows
