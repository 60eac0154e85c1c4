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
| `training` | optional object, see `evaluation.training_provenance` | the training that made the policy: train (or bench) command, resolved config, starting models by name and weights hash, seed, code revision, device, budget; ``eval --out`` copies it from the checkpoint's ``training.json``, ``import-bench`` states the bench job's |

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

from evaluation.records import RecordError

PACKAGES = ("agentgym-opd", "torch", "transformers", "tokenizers", "numpy", "gymnasium", "peft", "accelerate")
SHA256 = re.compile(r"[0-9a-f]{64}")
KEYS = {"packages", "tasks_sha256", "chat_template_sha256", "weights_sha256", "command", "seeds", "device"}
OPTIONAL_KEYS = {"training"}
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
    if not isinstance(value, dict) or not KEYS <= set(value) <= KEYS | OPTIONAL_KEYS:
        return f"must be an object with exactly the keys {sorted(KEYS)} (and optionally {sorted(OPTIONAL_KEYS)})"
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
    if "training" in value:
        from evaluation.training_provenance import check_training

        return check_training(value["training"])
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
    template are hashed from what that command evaluates; a trainer checkpoint's ``training.json`` becomes
    ``provenance.training``. A command that disagrees with what the record
    states about its own run (env, episodes, seed, policy, protocol) is refused with a RecordError naming
    each difference: its provenance would describe another evaluation, and `reproduce` would rerun that.
    ``agentgym-opd eval --out`` calls this on each record it writes; ``agentgym-opd leaderboard stamp``
    does it afterwards for records written without it.
    """
    from evaluation.runner import SCRIPTED_AGENTS

    command = list(command)
    args = _parse_eval_command(command)
    source = None if args.policy in SCRIPTED_AGENTS else _policy_source(args.policy)
    tasks = _command_tasks(args, record["seed"]) if args.env == record["env_id"] else None
    problems = command_disagreements(record, args, source, None if tasks is None else len(tasks))
    if problems:
        raise RecordError(_refusal(record, problems))
    policy, training = None, None
    if source is not None:
        from evaluation.policy_eval import load_policy
        from evaluation.training_provenance import checkpoint_training

        training = checkpoint_training(source.checkpoint) if source.checkpoint is not None else None
        policy = load_policy(source, device="cpu", dtype=args.dtype)
        if source.checkpoint is not None and "budget" not in record:
            budget = training_budget(source.checkpoint)
            if budget is not None:
                record["budget"] = budget
    device = "cpu"
    if args.device != "cpu" and policy is not None:
        import torch

        device = "cuda" if (args.device.startswith("cuda") or (args.device == "auto" and torch.cuda.is_available())) else "cpu"
    record["provenance"] = collect(tasks_sha=tasks_sha256(tasks), seeds=_seeds(args), command=command, policy=policy, device=device)
    if training is not None:
        record["provenance"]["training"] = training
    record.setdefault("origin", "original")
    return record


def _parse_eval_command(command: list[str]) -> Any:
    """The command's arguments, parsed by `agentgym-opd eval`'s own arguments (so its defaults apply) with
    abbreviations off, as `reproduce` parses it: a stamped command is one reproduce reruns word for word."""
    import argparse

    from evaluation.reproduce import command_parser

    if command[:2] != ["agentgym-opd", "eval"]:
        raise RecordError(f"stamp takes the `agentgym-opd eval ...` command that wrote the record, got {command[:2]!r}")
    try:
        return command_parser("eval").parse_args(command[2:])
    except (SystemExit, argparse.ArgumentError) as err:
        raise RecordError(f"the command is not a valid `agentgym-opd eval` command ({err}); spell every option out "
                          f"in full: {' '.join(command)[:500]}") from err


def _seeds(args: Any) -> list[int]:
    """The seeds an eval command runs, as eval reads them."""
    from evaluation.eval_command import command_seeds

    return command_seeds(args)


def _policy_source(policy: str) -> Any:
    """What the command's ``--policy`` names here, as eval resolves it (its record's algorithm and models)."""
    from evaluation.policy_eval import resolve_policy

    try:
        return resolve_policy(policy)
    except ValueError as err:  # PolicySetupError: the message says what --policy may be
        raise RecordError(f"the command's policy cannot be found from here: {err}") from err


def _command_tasks(args: Any, seed: int) -> list[Any]:
    """The tasks the command evaluates for ``seed``, in order, as eval selects them."""
    from agentgym_opd.config import parse_key_values
    from agentgym_opd.registry import make
    from evaluation.policy_eval import seed_tasks, split_options

    options = split_options(args.env, parse_key_values(args.env_arg, "--env-arg"), [seed], args.episodes, args.bench_tasks)
    try:
        env = make(args.env, **options)
    except (LookupError, ValueError, TypeError) as err:
        raise RecordError(f"cannot build the command's env {args.env} here ({err}); install the package that "
                          "registers it") from err
    try:
        ids = seed_tasks(args.env, env.task_ids(), seed, args.episodes, args.bench_tasks)
        return [env.get_task(t) for t in ids]
    except ValueError as err:  # --bench-tasks beyond the split's tasks
        raise RecordError(f"the command's tasks cannot be selected here: {err}") from err
    finally:
        env.close()


def command_disagreements(record: dict[str, Any], args: Any, source: Any, n_tasks: int | None) -> list[str]:
    """Each field where the record states something other than what the parsed eval command writes
    (``source``: the command's model, None for a scripted agent; ``n_tasks``: the tasks it evaluates, None
    when its env differs), as 'field (record: X, command: Y)'."""
    problems: list[str] = []

    def compare(name: str, have: Any, want: Any) -> None:
        if have != want:
            problems.append(f"{name} (record: {have!r:.80}, command: {want!r:.80})")

    compare("env_id", record["env_id"], args.env)
    if record["seed"] not in _seeds(args):
        problems.append(f"seed (record: {record['seed']}, command: seeds {_seeds(args)})")
    if n_tasks is not None:
        expected, n = n_tasks * args.samples, record["n_episodes"]
        partial = (record.get("protocol") or {}).get("partial") is True  # an interrupted run kept fewer
        if n != expected and not (partial and n < expected):
            problems.append(f"n_episodes (record: {n}, command: {expected} = {n_tasks} tasks x {args.samples} samples"
                            f"{'' if args.episodes is None else f', from --episodes {args.episodes}'})")
    for name, want in _written_names(args, source).items():
        compare(name, record.get(name), want)
    if source is not None:
        written, stated = _written_protocol(args, source), record.get("protocol") or {}
        # env_args is written only when there are some, so a record stating them against a command without
        # them is compared too (`partial` marks an interrupted run: not a setting of the command)
        for key in [*written, *(k for k in ("env_args",) if k in stated and k not in written)]:
            if key == "max_context_tokens" and key not in stated:
                continue  # a record written before eval stated its context budget
            compare(f"protocol.{key}", stated.get(key), written.get(key))
    return problems


def _written_names(args: Any, source: Any) -> dict[str, Any]:
    """The algorithm, student and teacher an eval command writes into its record."""
    if source is None:  # a scripted agent
        return {"algorithm": args.policy, "student": f"scripted:{args.policy}", "teacher": None}
    return {"algorithm": source.algorithm, "student": source.student, "teacher": source.teacher}


def _written_protocol(args: Any, source: Any) -> dict[str, Any]:
    """The ``protocol`` a model eval command writes into its record."""
    from agentgym_opd.config import parse_key_values
    from evaluation.policy_eval import record_protocol

    return record_protocol(args.env, source, temperature=args.temperature, top_p=args.top_p, samples=args.samples,
                           max_new_tokens=args.max_new_tokens, max_turns=args.max_turns, backend=args.backend,
                           action_parser=args.action_parser, system_prompt=args.system_prompt,
                           env_args=parse_key_values(args.env_arg, "--env-arg"), max_context_tokens=args.max_context_tokens)


def _refusal(record: dict[str, Any], problems: list[str]) -> str:
    """The refusal's text: every difference, the fix, and whether the record already carries provenance."""
    text = (f"the command disagrees with the record on {'; '.join(problems)}: not the command that wrote it; pass "
            "the exact `agentgym-opd eval ...` command that wrote the record")
    if record.get("provenance"):
        text += (f". The record already carries provenance (command: {' '.join(record['provenance']['command'])}): "
                 "`agentgym-opd eval --out` stamps what it writes, so stamping is only needed for records written "
                 "without it")
    return text
