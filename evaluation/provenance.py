"""Provenance: what another lab needs to trust a number or rerun it (the record's ``provenance`` field).

| key | type | meaning |
|---|---|---|
| `packages` | {name: version} | versions of the packages the number depends on (python, torch, transformers, ...) |
| `tasks_sha256` | str | sha256 of the evaluated tasks: ids and content (instruction, privileged, metadata), in order |
| `chat_template_sha256` | str or null | sha256 of the student's chat template (null: no template, e.g. a scripted agent) |
| `weights_sha256` | str or null | sha256 over the student's parameters (names, shapes, dtypes, bytes) |
| `command` | list of str | the full command that produced the record, as argv (``agentgym-opd ...``) |
| `seeds` | list of int | every seed of the run that produced it |
| `device` | str | where it ran (``cpu``, ``cuda``): a CPU record reproduces exactly, a GPU one within noise |

The hashes are of *content*, not of names, so ``tiny+sft120`` trained twice with the same settings has the
same weights hash only if the training really was bit-identical.
"""

from __future__ import annotations

import hashlib
import json
import platform
import re
import sys
from importlib import metadata
from pathlib import Path
from typing import Any, Iterable, Sequence

PACKAGES = ("agentgym-opd", "torch", "transformers", "tokenizers", "numpy", "gymnasium", "peft", "accelerate")
SHA256 = re.compile(r"[0-9a-f]{64}")
KEYS = {"packages", "tasks_sha256", "chat_template_sha256", "weights_sha256", "command", "seeds", "device"}
MAX_COMMAND_ARGS = 200
MAX_ARG_CHARS = 1000


def package_versions(names: Iterable[str] = PACKAGES) -> dict[str, str]:
    versions = {"python": platform.python_version()}
    for name in names:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "not installed"
    return versions


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def tasks_sha256(tasks: Sequence[Any]) -> str:
    """Hash of an ordered task list: each task's id, instruction, privileged and metadata as canonical JSON."""
    h = hashlib.sha256()
    for task in tasks:
        body = {"id": task.id, "env_id": task.env_id, "split": task.split, "instruction": task.instruction,
                "privileged": task.privileged, "metadata": task.metadata}
        h.update(json.dumps(body, sort_keys=True, default=repr, separators=(",", ":")).encode())
        h.update(b"\n")
    return h.hexdigest()


def env_tasks_sha256(env_id: str, task_ids: Sequence[str], **env_kwargs: Any) -> str:
    """:func:`tasks_sha256` of the given task ids of a registered env (built once, closed after)."""
    from agentgym_opd.registry import make

    env = make(env_id, **env_kwargs)
    try:
        return tasks_sha256([env.get_task(t) for t in task_ids])
    finally:
        env.close()


def chat_template_sha256(policy: Any) -> str | None:
    tokenizer = getattr(policy, "tokenizer", None)
    template = getattr(tokenizer, "chat_template", None)
    if not template:
        return None
    text = template if isinstance(template, str) else json.dumps(template, sort_keys=True)
    return _sha(text.encode())


def weights_sha256(policy: Any) -> str | None:
    """sha256 over every parameter and buffer (name, dtype, shape, raw bytes), in name order."""
    model = getattr(policy, "model", policy)
    if not hasattr(model, "state_dict"):
        return None
    import torch

    h = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        t = tensor.detach().to("cpu").contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}\n".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def command_line(argv: Sequence[str] | None = None) -> list[str]:
    """The command as a user would type it again: ``agentgym-opd`` and the arguments after the program."""
    args = list(sys.argv[1:] if argv is None else argv)
    return ["agentgym-opd", *args]


def collect(*, tasks_sha: str, seeds: Sequence[int], command: Sequence[str], policy: Any = None,
            device: str = "cpu") -> dict[str, Any]:
    """A provenance block; ``policy`` None (a scripted agent) has no template or weights hash."""
    return {"packages": package_versions(), "tasks_sha256": tasks_sha,
            "chat_template_sha256": chat_template_sha256(policy) if policy is not None else None,
            "weights_sha256": weights_sha256(policy) if policy is not None else None,
            "command": list(command), "seeds": [int(s) for s in seeds], "device": device}


def check_provenance(value: Any) -> str | None:
    """The record schema's check of ``provenance`` (None when fine, else what is wrong)."""
    if not isinstance(value, dict) or set(value) != KEYS:
        return f"must be an object with exactly the keys {sorted(KEYS)}"
    packages = value["packages"]
    if not (isinstance(packages, dict) and len(packages) <= 100
            and all(isinstance(k, str) and isinstance(v, str) and 0 < len(k) <= 100 and len(v) <= 100
                    and k.isprintable() and v.isprintable() for k, v in packages.items())):
        return "'packages' must be {name: version} of at most 100 printable strings"
    if not (isinstance(value["tasks_sha256"], str) and SHA256.fullmatch(value["tasks_sha256"])):
        return "'tasks_sha256' must be a sha256 hex digest"
    for key in ("chat_template_sha256", "weights_sha256"):
        if value[key] is not None and not (isinstance(value[key], str) and SHA256.fullmatch(value[key])):
            return f"{key!r} must be a sha256 hex digest or null"
    command = value["command"]
    if not (isinstance(command, list) and 0 < len(command) <= MAX_COMMAND_ARGS
            and all(isinstance(a, str) and len(a) <= MAX_ARG_CHARS and a.isprintable() for a in command)):
        return f"'command' must be a non-empty argv list of at most {MAX_COMMAND_ARGS} printable strings"
    seeds = value["seeds"]
    if not (isinstance(seeds, list) and 0 < len(seeds) <= 1000
            and all(isinstance(s, int) and not isinstance(s, bool) and abs(s) < 2**63 for s in seeds)):
        return "'seeds' must be a non-empty list of 64-bit integers"
    if not (isinstance(value["device"], str) and 0 < len(value["device"]) <= 64 and value["device"].isprintable()):
        return "'device' must be a short printable string"
    return None


def training_budget(checkpoint: Path) -> dict[str, Any] | None:
    """What a trainer checkpoint (``<run>/checkpoints/step_N``) spent: rollout episodes (N steps x tasks per
    step x group size, as the trainer collects them) and the agent tokens its ``metrics.jsonl`` logged up to
    step N. None when the run's files are not there to say."""
    from agentgym_opd.config import read_mapping
    from agentgym_opd.trainer import algorithm_class

    try:
        step = int(checkpoint.name.split("_", 1)[1])
        run = read_mapping(checkpoint / "config.yaml")
        rollout = run.get("rollout") or {}
        group = int(rollout.get("group_size", 1)) if algorithm_class(str(run["algorithm"])).needs_groups else 1
        episodes = step * int(rollout["tasks_per_step"]) * group
        metrics = checkpoint.parent.parent / "metrics.jsonl"
        tokens = None
        if metrics.is_file():
            rows = [json.loads(line) for line in metrics.read_text(encoding="utf-8").splitlines() if line.strip()]
            tokens = int(sum(float(r.get("agent_tokens", 0)) for r in rows if int(r.get("step", 0)) <= step))
    except (Exception,):  # a foreign folder layout: no budget rather than a wrong one
        return None
    return {"rollout_episodes": episodes, "tokens": tokens}


def stamp_eval_record(record: dict[str, Any], command: Sequence[str]) -> dict[str, Any]:
    """Fill ``provenance`` (and ``origin``) of a record written by ``command`` = ``agentgym-opd eval ...``.

    The command is parsed with eval's own parser and the evaluated tasks, the model's weights and its chat
    template are hashed from what that command evaluates. ``agentgym-opd eval`` can call this on each
    record it writes (``stamp_eval_record(record, command_line())``); ``agentgym-opd leaderboard stamp``
    does it afterwards for records made without it.
    """
    import argparse

    from agentgym_opd.config import parse_key_values
    from agentgym_opd.registry import make
    from evaluation import eval_command
    from evaluation.records import RecordError
    from evaluation.runner import SCRIPTED_AGENTS, select_tasks

    command = list(command)
    if command[:2] != ["agentgym-opd", "eval"]:
        raise RecordError(f"stamp takes the `agentgym-opd eval ...` command that wrote the record, got {command[:2]!r}")
    parser = argparse.ArgumentParser(prog="agentgym-opd eval", add_help=False)
    eval_command.add_arguments(parser)
    try:
        args = parser.parse_args(command[2:])
    except SystemExit as err:
        raise RecordError(f"the command is not a valid `agentgym-opd eval` command: {' '.join(command)}") from err
    if args.env != record["env_id"]:
        raise RecordError(f"the command evaluates {args.env}, the record {record['env_id']}: not the command that wrote it")
    env_kwargs = parse_key_values(args.env_arg, "--env-arg")
    env = make(args.env, **env_kwargs)
    try:
        tasks = [env.get_task(t) for t in select_tasks(env.task_ids(), args.episodes)]
    finally:
        env.close()
    policy = None
    if args.policy not in SCRIPTED_AGENTS:
        from evaluation.policy_eval import load_policy, resolve_policy

        source = resolve_policy(args.policy)
        policy = load_policy(source, device="cpu", dtype=args.dtype)
        if source.checkpoint is not None and "budget" not in record:
            budget = training_budget(source.checkpoint)
            if budget is not None:
                record["budget"] = budget
    seeds = args.seeds if args.seeds is not None else [args.seed if args.seed is not None else 0]
    device = "cpu"
    if args.device != "cpu" and policy is not None:
        import torch

        device = "cuda" if (args.device.startswith("cuda") or (args.device == "auto" and torch.cuda.is_available())) else "cpu"
    record["provenance"] = collect(tasks_sha=tasks_sha256(tasks), seeds=seeds, command=command, policy=policy, device=device)
    record.setdefault("origin", "original")
    return record
