"""What a training run states about itself so that a result of its policy can be rerun: ``training.json``.

The trainer writes it into the run folder when training starts and into every checkpoint it saves, the
checkpoint's with the budget spent up to that step. An evaluation of the checkpoint copies it into its
record (``provenance.training``, checked by ``evaluation.provenance.check_training``), and
``agentgym-opd leaderboard reproduce`` reruns the training from it.

| key | type | meaning |
|---|---|---|
| `command` | list of str or null | the train command as typed (``agentgym-opd train ...``), its output folder replaced by ``OUTPUT_PLACEHOLDER``; null for a run started from Python (the bench) |
| `config` | object | the resolved run config (``config.yaml``'s content; ``output_dir`` is the placeholder): what a rerun trains from |
| `models` | list of {"role", "name", "sha256"} | the starting models: ``student``, ``teacher`` or ``teacher:NAME``, by the name the config gives, with :func:`weights_files_sha256` of the folder that name loads |
| `seed` | int | the run's seed |
| `code_revision` | str | git revision of the code that trained (``+dirty``: uncommitted changes) |
| `device` | str | where it trained (``cpu``, ``cuda``): a CPU training reruns bit-identically on a CPU |
| `budget` | {"steps", "rollout_episodes", "tokens"} | updates done, rollout episodes collected, agent tokens generated (null in the run folder's file, counted in a checkpoint's) |

The starting models are hashed by their *weight files* (not by loading them): the hash is then the same
however a run loads the model (dtype, LoRA on top), and a rerun can check that a name loads the same
weights here before it spends anything.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path
from typing import Any, Sequence

TRAINING_FILE = "training.json"
OUTPUT_PLACEHOLDER = "<output_dir>"
# files that hold a model's weights (sharded or not); config and tokenizer files are left out, since saving
# them again under another transformers version changes their bytes but not the model
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")
# train options whose value is a folder the run writes (or resumes): replaced by the placeholder
_OUTPUT_OPTIONS = ("--output-dir", "--resume")
_CHUNK = 1 << 20


def code_revision() -> str:
    """The git revision of this checkout (with '+dirty' for uncommitted changes to tracked files), or 'unknown'."""
    root = Path(__file__).resolve().parents[1]
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10)
        if rev.returncode != 0:
            return "unknown"
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return rev.stdout.strip() + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def weights_files_sha256(folder: str | Path) -> str | None:
    """sha256 over a model folder's weight files (``WEIGHT_SUFFIXES``, any depth): each file's path relative
    to the folder and the sha256 of its bytes, in path order. None when the folder holds no weight file."""
    root = Path(folder)
    files = sorted(p for p in root.rglob("*") if p.is_file() and p.name.endswith(WEIGHT_SUFFIXES)) if root.is_dir() else []
    if not files:
        return None
    h = hashlib.sha256()
    for path in files:
        body = hashlib.sha256()
        with open(path, "rb") as fh:
            while chunk := fh.read(_CHUNK):
                body.update(chunk)
        h.update(f"{path.relative_to(root).as_posix()}\0{body.hexdigest()}\n".encode())
    return h.hexdigest()


def model_folder(name: str) -> Path:
    """The folder a config's model name loads (a named model's cache folder, else the path)."""
    from agentgym_opd.policy.loading import model_path

    return Path(model_path(name)).expanduser()


def starting_models(model: Any) -> list[dict[str, Any]]:
    """The run's starting models (``model``: its ModelConfig) as ``{"role", "name", "sha256"}``."""
    named = [("student", model.student), ("teacher", model.teacher),
             *((f"teacher:{n}", p) for n, p in sorted(dict(model.teachers or {}).items()))]
    return [{"role": role, "name": str(name), "sha256": weights_files_sha256(model_folder(str(name)))}
            for role, name in named if name]


def train_command(argv: Sequence[str]) -> list[str]:
    """``agentgym-opd train ARGS`` with every output folder (``--output-dir``, ``--resume``, ``output_dir=``)
    replaced by ``OUTPUT_PLACEHOLDER``: where a run wrote is not part of what it did."""
    out: list[str] = ["agentgym-opd", "train"]
    args = list(argv)
    i = 0
    while i < len(args):
        word = args[i]
        name, eq, _ = word.partition("=")
        if word in _OUTPUT_OPTIONS and i + 1 < len(args):
            out += [word, OUTPUT_PLACEHOLDER]
            i += 2
            continue
        if eq and (name in _OUTPUT_OPTIONS or name.strip() == "output_dir"):
            word = f"{name}={OUTPUT_PLACEHOLDER}"
        out.append(word)
        i += 1
    return out


def run_config(config: Any) -> dict[str, Any]:
    """The resolved config as plain JSON, its output folder the placeholder."""
    from agentgym_opd.config import to_dict

    return {**to_dict(config), "output_dir": OUTPUT_PLACEHOLDER}


def spent_tokens(metrics_file: Path, step: int) -> int | None:
    """Agent tokens the run's ``metrics.jsonl`` logged up to ``step`` (None without the file)."""
    if not metrics_file.is_file():
        return None
    total = 0.0
    for line in metrics_file.read_text(encoding="utf-8").splitlines():
        if line.strip():
            row = json.loads(line)
            if int(row.get("step", 0)) <= step:
                total += float(row.get("agent_tokens", 0.0))
    return int(total)


def training_provenance(config: Any, *, command: Sequence[str] | None, models: list[dict[str, Any]], device: str,
                        budget: dict[str, Any] | None = None, revision: str | None = None) -> dict[str, Any]:
    """The ``training.json`` content of a run (see the module docstring)."""
    return {"command": list(command) if command is not None else None, "config": run_config(config),
            "models": models, "seed": int(config.seed), "code_revision": revision or code_revision(),
            "device": "cuda" if str(device).startswith("cuda") else str(device),
            "budget": budget or {"steps": None, "rollout_episodes": None, "tokens": None}}


def write_training_json(folder: Path, data: dict[str, Any]) -> Path:
    """Write ``folder/training.json`` whole or not at all (a kill mid-write leaves the previous file)."""
    path = folder / TRAINING_FILE
    tmp = path.with_name(TRAINING_FILE + ".tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, path)
    return path
