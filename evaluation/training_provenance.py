"""A record's ``provenance.training``: the training that made its policy, checked, read and stated.

| key | type | meaning |
|---|---|---|
| `command` | list of str or null | ``agentgym-opd train ...`` as typed (output folder: ``<output_dir>``), or the ``agentgym-opd bench ...`` command whose job trained it; null for a run started from Python |
| `config` | object | the resolved run config (``train``) or the bench job's ``algorithm_config`` (``bench``): what a rerun trains from |
| `models` | list of {"role": str, "name": str, "sha256": str or null} | the starting models (``student``, ``teacher``, ``teacher:NAME``) by the name given, with the sha256 of their weight files (`agentgym_opd.run_provenance.weights_files_sha256`) |
| `seed` | int | the training run's seed |
| `code_revision` | str | git revision of the code that trained (``+dirty``: uncommitted changes) |
| `device` | str | where it trained: a CPU training reruns bit-identically on a CPU |
| `budget` | {"steps", "rollout_episodes", "tokens"}: int or null each | updates, rollout episodes and agent tokens spent up to the evaluated checkpoint |

`agentgym-opd train` writes it as ``training.json`` into every checkpoint; ``eval --out`` on a checkpoint
copies it into the record, ``leaderboard import-bench`` states the bench job's. Like the rest of a record it
is third-party data: every string is printable and bounded, the config at most ``MAX_CONFIG_CHARS`` of JSON
and ``MAX_CONFIG_DEPTH`` deep.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

from evaluation.records import MAX_COUNT, MAX_NAME_CHARS, MAX_PROMPT_CHARS, SEED_LIMIT, RecordError

TRAINING_KEYS = {"command", "config", "models", "seed", "code_revision", "device", "budget"}
BUDGET_KEYS = {"steps", "rollout_episodes", "tokens"}
TRAINING_SUBCOMMANDS = ("train", "bench")
MAX_CONFIG_CHARS = 20_000
MAX_CONFIG_DEPTH = 6
MAX_CONFIG_ENTRIES = 200  # keys of one object, items of one list
MAX_MODELS = 16
MAX_COMMAND_ARGS = 200
MAX_ARG_CHARS = 1000
MAX_FILE_BYTES = 200_000  # a training.json read from a checkpoint
SHA256 = re.compile(r"[0-9a-f]{64}")


def _printable(value: Any, limit: int = MAX_NAME_CHARS) -> bool:
    return isinstance(value, str) and 0 < len(value) <= limit and value.isprintable()


def _int(value: Any, low: int, high: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def _check_config(value: Any, depth: int = 0) -> str | None:
    """Plain JSON of bounded shape: printable keys, printable strings (newlines allowed: a system prompt)."""
    if depth > MAX_CONFIG_DEPTH:
        return f"nests deeper than {MAX_CONFIG_DEPTH} levels"
    if isinstance(value, dict):
        if len(value) > MAX_CONFIG_ENTRIES:
            return f"has an object of {len(value)} keys (at most {MAX_CONFIG_ENTRIES})"
        for key, item in value.items():
            if not _printable(key, 64):
                return f"has the key {key!r:.80}, not a printable name of at most 64 characters"
            problem = _check_config(item, depth + 1)
            if problem:
                return problem
        return None
    if isinstance(value, list):
        if len(value) > MAX_CONFIG_ENTRIES:
            return f"has a list of {len(value)} items (at most {MAX_CONFIG_ENTRIES})"
        return next((p for p in (_check_config(v, depth + 1) for v in value) if p), None)
    if isinstance(value, str):
        ok = len(value) <= MAX_PROMPT_CHARS and all(ch.isprintable() or ch in "\n\t" for ch in value)
        return None if ok else f"has a string that is not printable text of at most {MAX_PROMPT_CHARS} characters: {value!r:.80}"
    if value is None or isinstance(value, bool) or (isinstance(value, (int, float)) and math.isfinite(value)
                                                    and abs(value) <= 1e18):
        return None
    return f"has the value {value!r:.80}, which is not plain finite JSON"


def _check_command(command: Any) -> str | None:
    if command is None:
        return None
    if not (isinstance(command, list) and 2 <= len(command) <= MAX_COMMAND_ARGS
            and all(isinstance(a, str) and len(a) <= MAX_ARG_CHARS and a.isprintable() for a in command)
            and command[0] == "agentgym-opd" and command[1] in TRAINING_SUBCOMMANDS):
        return (f"'command' must be null or an argv list of at most {MAX_COMMAND_ARGS} printable strings starting "
                f"'agentgym-opd {'|'.join(TRAINING_SUBCOMMANDS)}'")
    return None


def _check_models(models: Any) -> str | None:
    want = (f"'models' must be a list of at most {MAX_MODELS} {{'role': name, 'name': name, 'sha256': hex digest "
            "or null}")
    if not (isinstance(models, list) and len(models) <= MAX_MODELS):
        return want
    for m in models:
        if not (isinstance(m, dict) and set(m) == {"role", "name", "sha256"} and _printable(m["role"], 64)
                and _printable(m["name"]) and (m["sha256"] is None or (isinstance(m["sha256"], str)
                                                                      and SHA256.fullmatch(m["sha256"])))):
            return f"{want}, got {m!r:.200}"
    return None


def check_training(value: Any) -> str | None:
    """The record schema's check of ``provenance.training`` (None when fine, else what is wrong)."""
    if not isinstance(value, dict) or set(value) != TRAINING_KEYS:
        return f"'training' must be an object with exactly the keys {sorted(TRAINING_KEYS)}"
    problem = _check_command(value["command"]) or _check_models(value["models"])
    if problem:
        return f"'training': {problem}"
    if not isinstance(value["config"], dict):
        return "'training': 'config' must be an object (the run's resolved config)"
    try:
        size = len(json.dumps(value["config"], allow_nan=False))
    except (TypeError, ValueError, RecursionError):
        return "'training': 'config' must be plain, finite JSON"
    if size > MAX_CONFIG_CHARS:
        return f"'training': 'config' is {size} characters of JSON; at most {MAX_CONFIG_CHARS}"
    problem = _check_config(value["config"])
    if problem:
        return f"'training': 'config' {problem}"
    if not _int(value["seed"], -SEED_LIMIT + 1, SEED_LIMIT - 1):
        return "'training': 'seed' must be a 64-bit integer"
    if not _printable(value["code_revision"]):
        return "'training': 'code_revision' must be a printable string"
    if not _printable(value["device"], 64):
        return "'training': 'device' must be a short printable string"
    budget = value["budget"]
    if not (isinstance(budget, dict) and set(budget) == BUDGET_KEYS
            and all(v is None or _int(v, 0, MAX_COUNT) for v in budget.values())):
        return f"'training': 'budget' must be {{{', '.join(sorted(BUDGET_KEYS))}}}, each an integer in [0, {MAX_COUNT:.0e}] or null"
    return None


def checkpoint_training(checkpoint: Path) -> dict[str, Any] | None:
    """The ``training.json`` a trainer checkpoint carries, checked; None when it has none (a checkpoint
    written before the trainer wrote one). A file that is too large or does not pass is a RecordError."""
    from agentgym_opd.run_provenance import TRAINING_FILE

    path = Path(checkpoint) / TRAINING_FILE
    if not path.is_file():
        return None
    if path.stat().st_size > MAX_FILE_BYTES:
        raise RecordError(f"{path} is {path.stat().st_size} bytes; a training.json is at most {MAX_FILE_BYTES}")
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as err:
        raise RecordError(f"cannot read {path} ({str(err)[:200]}); retrain, or remove the file to publish without "
                          "training provenance") from err
    problem = check_training(value)
    if problem:
        raise RecordError(f"{path}: {problem}")
    return value


def starting_model_problems(training: dict[str, Any]) -> list[str]:
    """Each starting model a training's provenance names that is not here, or is here with other weights."""
    from agentgym_opd.policy.loading import is_named_model
    from agentgym_opd.run_provenance import model_folder, weights_files_sha256

    problems = []
    for model in training["models"]:
        name, role = model["name"], model["role"]
        if not is_named_model(name) and not Path(name).expanduser().is_dir():
            problems.append(f"{role} {name!r} is not available here (neither a named model nor a local folder); "
                            "put that model at that path, or install the package that names it")
            continue
        if model["sha256"] is not None:
            here = weights_files_sha256(model_folder(name))
            if here != model["sha256"]:
                problems.append(f"{role} {name!r} here has other weights (record: {model['sha256'][:12]}, here: "
                                f"{(here or 'no weight files')[:12]}); use the model the record was trained from")
    return problems


def bench_training(out: Path, record: dict[str, Any], settings: Any, argv: list[str], device: str,
                   tokens: int | None) -> dict[str, Any]:
    """A bench job's ``provenance.training``, with the bench command that reruns the job. The job's trainer wrote
    ``training.json`` into its checkpoint (resolved config, starting models hashed): that is kept, its models
    named as the record names them rather than by their folders in the bench's output. A bench run before the
    trainer wrote it gets the equivalent from the record: its ``algorithm_config`` (algorithm and bench
    settings), the warm start and teacher it started from (hashed where the bench still has them), the budget."""
    from agentgym_opd.run_provenance import weights_files_sha256
    from evaluation.bench.publish import checkpoint_of, reference_model

    names = {"student": record["student"], "teacher": record["teacher"]}
    try:
        kept = checkpoint_training(checkpoint_of(out, record, settings).parent)
    except (OSError, RecordError):
        kept = None
    if kept is not None:
        models = [{**m, "name": names.get(m["role"]) or m["name"]} for m in kept["models"]]
        return {**kept, "command": list(argv), "models": models}

    def sha(which: str) -> str | None:
        try:
            return weights_files_sha256(reference_model(out, which, settings))
        except (OSError, RecordError):  # the bench's folder no longer has it
            return None

    models = [{"role": role, "name": names[role], "sha256": sha(which)}
              for role, which in (("student", "warm_start"), ("teacher", "teacher")) if names[role] is not None]
    steps = ((record.get("algorithm_config") or {}).get("bench") or {}).get("steps")
    return {"command": list(argv), "config": dict(record.get("algorithm_config") or {}), "models": models,
            "seed": int(record["seed"]), "code_revision": record["code_revision"], "device": device,
            "budget": {"steps": steps if isinstance(steps, int) else None,
                       "rollout_episodes": int(settings.budget), "tokens": tokens}}
