"""One typed config per run: dataclasses, loaded from YAML/JSON plus ``section.key=value`` overrides.

Why dataclasses and not a free dict: a typo (``train.lrr``) or a wrong type (``rollout.group_size=eight``)
must stop a run before it spends an hour of rollouts, with an error that names the key and says what
would fix it. Why the ``algo`` section stays a dict here: the trainer does not know every algorithm's
knobs (plugins add algorithms); each algorithm validates its own section with its own config dataclass
through :func:`dataclass_from_dict`, which works for any dataclass.

Range and choice constraints live in field metadata (:func:`constrained`), so a config class reads as its
own schema. Values are coerced by the field's type: from the command line every value is text
(``train.lr=1e-4`` -> float), and from YAML a numeric string is accepted for a number field too, because
PyYAML reads ``1e-4`` (no dot) as a string. The config saved beside a checkpoint is YAML and reloads
equal (:func:`save_config`, :func:`load_config`).
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import types
import typing
from collections.abc import Iterable, Mapping
from dataclasses import MISSING, dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar, Union

import yaml

T = TypeVar("T")
_NONE_WORDS = {"none", "null", "~"}
_TRUE_WORDS = {"true", "yes", "on", "1"}
_FALSE_WORDS = {"false", "no", "off", "0"}


class ConfigError(ValueError):
    """An invalid config: the message names the dotted key and what would fix it."""


def constrained(
    default: Any = MISSING,
    *,
    default_factory: Any = MISSING,
    ge: float | None = None,
    gt: float | None = None,
    le: float | None = None,
    lt: float | None = None,
    choices: Iterable[Any] | None = None,
    help: str = "",
) -> Any:
    """A dataclass field with a range / choice constraint checked on load, and a help line."""
    metadata = {
        "ge": ge, "gt": gt, "le": le, "lt": lt,
        "choices": tuple(choices) if choices is not None else None,
        "help": help,
    }
    if default_factory is not MISSING:
        return field(default_factory=default_factory, metadata=metadata)
    return field(default=default, metadata=metadata)


# ----------------------------------------------------------------------------------------------------
# The run config
# ----------------------------------------------------------------------------------------------------


@dataclass
class ModelConfig:
    """Which networks a run uses. Paths are local (no hub downloads on build machines)."""

    student: str | None = constrained(None, help="path of the student model (or a tiny-model spec)")
    teacher: str | None = constrained(None, help="path of a separate teacher (opd, sage_opd); None for self-teachers")
    backend: str = constrained("hf", choices=("hf", "vllm"), help="policy backend for rollouts")
    teacher_backend: str = constrained("hf", choices=("hf", "vllm"),
                                       help="where a separate teacher (model.teacher) runs: in-process HF, or a "
                                            "vLLM engine scoring the student's ids with prompt log-probs")
    teachers: dict[str, str] = constrained(default_factory=dict, help=(
        "several teachers by name (--teacher NAME=PATH, repeated), each task routed to one (opd)"))
    teacher_route: str = constrained("env", help="what of a task picks its teacher: env, family, split or metadata.<field>")
    teacher_routes: dict[str, str] = constrained(default_factory=dict, help=(
        "ordered 'pattern: teacher name' (shell patterns on the route key, first match wins); "
        "empty = the teacher named like the key"))
    dtype: str = constrained("float32", choices=("float32", "bfloat16", "float16"))
    autocast: str = constrained("none", choices=("none", "bfloat16", "float16"), help=(
        "run every forward (rollouts, teacher scoring, the update) under torch.autocast to this dtype, weights "
        "kept in model.dtype; bfloat16 is about 2x on a CPU with AVX512-BF16 (benchmarks/bench_smollm2_opd_step.py)"))
    teacher_autocast: str = constrained("same", choices=("same", "none", "bfloat16", "float16"), help=(
        "the separate teacher's forwards: 'same' = model.autocast; bfloat16 scores with a frozen teacher stored "
        "in bf16 while the student keeps model.autocast (a large teacher of a small student: the teacher's "
        "forward is most of the step)"))
    device: str = constrained("auto", help="'auto', 'cpu', 'cuda', 'cuda:1', ...")
    gguf_file: str | None = constrained(None, help="GGUF file inside the student folder, for GGUF checkpoints")
    lora_rank: int = constrained(0, ge=0, help="LoRA rank; 0 trains all weights")
    lora_alpha: float = constrained(16.0, gt=0)
    lora_dropout: float = constrained(0.0, ge=0, lt=1)
    max_seq_len: int = constrained(2048, ge=1, help="longest prompt + history the policy sees, in tokens")
    vllm_tensor_parallel_size: int = constrained(1, ge=1, help="backend=vllm: GPUs the rollout engine spans")
    vllm_gpu_memory_utilization: float = constrained(0.3, gt=0, le=1,
                                                     help="backend=vllm: share of GPU memory (host RAM on CPU) for vLLM")

    def __post_init__(self) -> None:
        from agentgym_opd.teachers import check_teacher_settings

        check_teacher_settings(self.teacher, self.teachers, self.teacher_route, self.teacher_routes)


@dataclass
class TrainConfig:
    """Optimisation: how many updates, how big, how fast."""

    steps: int = constrained(100, ge=1, help="number of update steps")
    lr: float = constrained(1e-5, gt=0, help="learning rate")
    optimizer: str = constrained("adamw", choices=("adamw", "sgd"))
    weight_decay: float = constrained(0.0, ge=0)
    grad_clip: float | None = constrained(1.0, gt=0, help="max grad norm; None disables clipping")
    warmup_steps: int = constrained(0, ge=0)
    micro_batch_size: int = constrained(4, ge=1, help="sequences per forward/backward; a step accumulates them all")
    checkpoint_every: int = constrained(0, ge=0, help="steps between checkpoints; 0 = only at the end")
    keep_checkpoints: int = constrained(0, ge=0, help="checkpoints kept on disk, the newest; 0 = every one")
    strategy: str = constrained("none", choices=("none", "ddp", "fsdp"),
                                help="data parallelism under torchrun: ddp or fsdp (none = one process)")


@dataclass
class RolloutConfig:
    """On-policy sampling: how many tasks and rollouts per step, how long. The split is part of the env id
    (``household/train``), so it is not repeated here."""

    tasks_per_step: int = constrained(4, ge=1, help="distinct tasks per update step")
    group_size: int = constrained(1, ge=1, help="rollouts per task (G; GRPO needs G >= 2)")
    max_turns: int = constrained(20, ge=1)
    max_new_tokens: int = constrained(128, ge=1, help="tokens per agent turn")
    temperature: float = constrained(1.0, ge=0)
    top_p: float = constrained(1.0, gt=0, le=1)
    action_parser: str | None = constrained(None, help="reads the model's replies: text, json, code, tags or "
                                                       "module:function; None = the env family's default")
    system_prompt: str | None = constrained(None, help="None = the env family's default; '' = no system prompt")


@dataclass
class EvalConfig:
    """Held-out evaluation during training."""

    every: int = constrained(0, ge=0, help="steps between evaluations; 0 = never during training")
    env: str | None = constrained(None, help="env id to evaluate on; None = the training env")
    episodes: int = constrained(32, ge=1)
    temperature: float = constrained(0.0, ge=0, help="0 = greedy decoding")
    seed: int = 0


@dataclass
class RunConfig:
    """Everything one training run needs; saved beside every checkpoint."""

    algorithm: str = constrained("", help="registered algorithm name, e.g. grpo")
    env: str = constrained("", help="registered env id, e.g. household/train")
    env_args: dict[str, Any] = constrained(default_factory=dict, help="the env's constructor options, e.g. num_tasks: 4")
    seed: int = 0
    output_dir: str = "runs/run"
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    algo: dict[str, Any] = constrained(default_factory=dict, help="the algorithm's own section (its config class checks it)")

    @staticmethod
    def normalise_mapping(data: Mapping[str, Any]) -> dict[str, Any]:
        """Files may write the env as a section, ``env: {id: household/train, args: {num_tasks: 4}}``."""
        data = dict(data)
        env = data.get("env")
        if isinstance(env, Mapping):
            unknown = sorted(set(env) - {"id", "args"})
            if unknown or "id" not in env:
                raise ConfigError(f"section 'env' takes 'id' (the env id) and 'args' (constructor options); got {sorted(env)}")
            if "env_args" in data:
                raise ConfigError("give the env's constructor options once: in env.args or in env_args, not both")
            data["env"], data["env_args"] = env["id"], dict(env.get("args") or {})
        return data

    def algo_config(self, config_cls: type[T]) -> T:
        """This run's ``algo`` section as the algorithm's own config dataclass (errors say ``algo.<key>``)."""
        return dataclass_from_dict(config_cls, self.algo, path="algo")


# ----------------------------------------------------------------------------------------------------
# Dict <-> dataclass with validation
# ----------------------------------------------------------------------------------------------------


def _key(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def _type_name(tp: Any) -> str:
    if isinstance(tp, type):
        return tp.__name__
    return str(tp).replace("typing.", "")


def _hints(cls: type) -> dict[str, Any]:
    try:
        return typing.get_type_hints(cls)
    except (NameError, TypeError):  # a locally defined class with unresolvable annotations: use them raw
        return {f.name: f.type for f in dataclasses.fields(cls)}


def _unknown_key_error(key: str, name: str, valid: list[str], path: str) -> ConfigError:
    close = difflib.get_close_matches(name, valid, n=3, cutoff=0.6)
    hint = f"; did you mean {' or '.join(repr(_key(path, c)) for c in close)}?" if close else ""
    section = f"under '{path}'" if path else "at the top level"
    return ConfigError(f"unknown config key '{key}'{hint} (valid keys {section}: {', '.join(valid)})")


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """Convert ``value`` to type ``tp`` (text from the command line included) or raise naming ``key``."""
    if tp is Any or tp is object:
        return value
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (Union, types.UnionType):
        if value is None or (isinstance(value, str) and value.strip().lower() in _NONE_WORDS and type(None) in args):
            if type(None) in args:
                return None
        errors = []
        for arm in (a for a in args if a is not type(None)):
            try:
                return _coerce(value, arm, key)
            except ConfigError as exc:
                errors.append(str(exc))
        detail = f" ({errors[0]})" if len(errors) == 1 else ""
        raise ConfigError(f"config key '{key}' expects {_type_name(tp)}, got {value!r}{detail}")
    if tp is type(None):
        if value is None or (isinstance(value, str) and value.strip().lower() in _NONE_WORDS):
            return None
        raise ConfigError(f"config key '{key}' expects null, got {value!r}")
    if origin is Literal:
        for choice in args:
            if value == choice or (isinstance(value, str) and not isinstance(choice, str) and value == str(choice)):
                return choice
        raise ConfigError(f"config key '{key}' = {value!r} is not one of: {', '.join(map(str, args))}")
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        if isinstance(value, tp):
            value = to_dict(value)
        if isinstance(value, str):
            raise ConfigError(f"config key '{key}' is a section; set its fields instead, e.g. {key}.<field>=VALUE")
        return dataclass_from_dict(tp, value, path=key)
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in _TRUE_WORDS | _FALSE_WORDS:
            return value.strip().lower() in _TRUE_WORDS
        raise ConfigError(f"config key '{key}' expects a bool (true/false), got {value!r}")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, str):
            try:
                return int(value.strip())
            except ValueError:
                pass
        raise ConfigError(f"config key '{key}' expects an int, got {value!r} ({type(value).__name__}); e.g. {key}=8")
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value.strip())
            except ValueError:
                pass
        raise ConfigError(f"config key '{key}' expects a float, got {value!r} ({type(value).__name__}); e.g. {key}=1e-4")
    if tp is str:
        if isinstance(value, str):
            return value
        raise ConfigError(f"config key '{key}' expects a string, got {value!r} ({type(value).__name__}); quote it in YAML")
    if origin in (list, tuple, set, frozenset) or tp in (list, tuple):
        if isinstance(value, str):
            parsed = yaml.safe_load(value) if value.strip() else []
            value = parsed if isinstance(parsed, list) else [v.strip() for v in value.split(",")]
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"config key '{key}' expects a list, got {value!r}; e.g. {key}=[1,2,3]")
        if origin is tuple and args and not (len(args) == 2 and args[1] is Ellipsis):
            if len(args) != len(value):
                raise ConfigError(f"config key '{key}' expects {len(args)} items, got {len(value)}")
            return tuple(_coerce(v, a, f"{key}[{i}]") for i, (v, a) in enumerate(zip(args, value)))
        item_type = args[0] if args else Any
        items = [_coerce(v, item_type, f"{key}[{i}]") for i, v in enumerate(value)]
        return (origin or tp)(items) if (origin or tp) is not list else items
    if origin is dict or tp is dict:
        if isinstance(value, str):
            value = yaml.safe_load(value) if value.strip() else {}
        if not isinstance(value, Mapping):
            raise ConfigError(f"config key '{key}' expects a mapping, got {value!r}")
        key_type, value_type = args if args else (Any, Any)
        return {_coerce(k, key_type, key): _coerce(v, value_type, _key(key, str(k))) for k, v in value.items()}
    if isinstance(tp, type):
        if isinstance(value, tp):
            return value
        raise ConfigError(f"config key '{key}' expects {tp.__name__}, got {value!r}")
    return value


def _check_constraints(value: Any, metadata: Mapping[str, Any], key: str) -> None:
    if value is None:
        return
    choices = metadata.get("choices")
    if choices is not None and value not in choices:
        close = difflib.get_close_matches(str(value), [str(c) for c in choices], n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ConfigError(f"config key '{key}' = {value!r} is not one of: {', '.join(map(str, choices))}{hint}")
    bounds = [
        ("ge", ">=", lambda v, b: v >= b),
        ("gt", ">", lambda v, b: v > b),
        ("le", "<=", lambda v, b: v <= b),
        ("lt", "<", lambda v, b: v < b),
    ]
    for name, symbol, ok in bounds:
        bound = metadata.get(name)
        if bound is not None and not ok(value, bound):
            wanted = " and ".join(f"{s} {metadata[n]}" for n, s, _ in bounds if metadata.get(n) is not None)
            raise ConfigError(f"config key '{key}' = {value!r} is out of range: it must be {wanted}")


def dataclass_from_dict(cls: type[T], data: Mapping[str, Any] | None, *, path: str = "") -> T:
    """Build and validate any config dataclass from a (nested) mapping.

    Unknown keys (with close matches), wrong types, out-of-range values, missing required fields, and
    a ``ValueError`` from the class's own ``__post_init__`` all become a :class:`ConfigError` that names
    the dotted key (prefixed by ``path``, e.g. ``"algo"``).
    """
    if not (dataclasses.is_dataclass(cls) and isinstance(cls, type)):
        raise TypeError(f"dataclass_from_dict needs a dataclass type, got {cls!r}")
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        where = f"section '{path}'" if path else "the config"
        raise ConfigError(f"{where} must be a mapping of keys to values, got {type(data).__name__}: {data!r}")
    if hasattr(cls, "normalise_mapping"):
        data = cls.normalise_mapping(data)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    hints = _hints(cls)
    for name in data:
        if name not in fields:
            raise _unknown_key_error(_key(path, str(name)), str(name), list(fields), path)
    kwargs: dict[str, Any] = {}
    for name, f in fields.items():
        key = _key(path, name)
        if name not in data:
            if f.default is MISSING and f.default_factory is MISSING:
                type_name = _type_name(hints.get(name, f.type))
                raise ConfigError(
                    f"missing required config key '{key}' ({type_name}); set it in the file or pass {key}=VALUE"
                )
            continue
        value = _coerce(data[name], hints.get(name, f.type), key)
        _check_constraints(value, f.metadata, key)
        kwargs[name] = value
    try:
        return cls(**kwargs)
    except ConfigError:
        raise
    except (ValueError, TypeError) as exc:
        where = f"config section '{path}'" if path else f"config {cls.__name__}"
        raise ConfigError(f"invalid {where}: {exc}") from exc


def to_dict(config: Any) -> dict[str, Any]:
    """A plain, YAML/JSON-safe nested dict of a config dataclass (tuples become lists)."""
    def plain(value: Any) -> Any:
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
        if isinstance(value, Mapping):
            return {k: plain(v) for k, v in value.items()}
        if isinstance(value, (list, tuple, set, frozenset)):
            return [plain(v) for v in value]
        return value

    return plain(config)


# ----------------------------------------------------------------------------------------------------
# Command-line overrides
# ----------------------------------------------------------------------------------------------------


def parse_override(text: str) -> tuple[list[str], str]:
    """``"train.lr=1e-4"`` -> ``(["train", "lr"], "1e-4")``."""
    key, sep, value = text.partition("=")
    key = key.strip()
    if not sep or not key or any(not part for part in key.split(".")):
        raise ConfigError(f"override {text!r} must look like section.key=value, e.g. train.lr=1e-4")
    return key.split("."), value


def _field_type_at(cls: Any, parts: list[str]) -> Any:
    """The declared type of a dotted key (``Any`` inside free-form dict sections)."""
    tp: Any = cls
    for depth, part in enumerate(parts):
        if dataclasses.is_dataclass(tp) and isinstance(tp, type):
            hints = _hints(tp)
            names = [f.name for f in dataclasses.fields(tp)]
            if part not in names:
                path = ".".join(parts[:depth])
                raise _unknown_key_error(".".join(parts[: depth + 1]), part, names, path)
            tp = hints[part]
        elif typing.get_origin(tp) is dict or tp is dict:
            args = typing.get_args(tp)
            tp = args[1] if args else Any
        elif tp is Any:
            return Any
        else:
            raise ConfigError(f"'{'.'.join(parts[:depth])}' is a value, not a section; cannot set '{'.'.join(parts)}'")
    return tp


def apply_overrides(config: T, overrides: Iterable[str] | Mapping[str, Any]) -> T:
    """A new, validated config with ``section.key=value`` overrides applied (the input is not changed).

    Text values are parsed by the target field's type; inside a free-form dict section (``algo`` before
    the algorithm validates it) they are parsed as YAML scalars (``algo.beta=0.1`` -> 0.1).
    """
    cls = type(config)
    data = to_dict(config)
    items = list(overrides.items()) if isinstance(overrides, Mapping) else [parse_override(o) for o in overrides]
    for raw_key, value in items:
        parts = raw_key.split(".") if isinstance(raw_key, str) else list(raw_key)
        target_type = _field_type_at(cls, parts)
        if target_type is Any and isinstance(value, str):
            value = yaml.safe_load(value) if value.strip() else ""
        node = data
        for depth, part in enumerate(parts[:-1]):
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                where, full = ".".join(parts[: depth + 1]), ".".join(parts)
                raise ConfigError(f"'{where}' is a value, not a section; cannot set '{full}'")
            node = child
        node[parts[-1]] = value
    return dataclass_from_dict(cls, data)


# ----------------------------------------------------------------------------------------------------
# Files
# ----------------------------------------------------------------------------------------------------


def read_mapping(path: str | Path) -> dict[str, Any]:
    """Read a YAML (``.yaml``/``.yml``) or JSON (``.json``) file into a dict; an empty file is ``{}``."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"config file not found: {path}")
    text = path.read_text(encoding="utf-8")
    try:
        data = json.loads(text) if path.suffix.lower() == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        raise ConfigError(f"cannot parse config file {path}: {exc}") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping at the top level, got {type(data).__name__}")
    return data


def load_config(
    path: str | Path | None = None,
    overrides: Iterable[str] | Mapping[str, Any] = (),
    cls: type[T] = RunConfig,  # type: ignore[assignment]
    *,
    algo_config_cls: type | None = None,
) -> T:
    """Defaults <- file (if given) <- overrides, validated. With ``algo_config_cls`` the ``algo`` section is
    validated by it and stored complete (its defaults filled in), so the saved file records every knob."""
    base = dataclass_from_dict(cls, read_mapping(path) if path is not None else {})
    config = apply_overrides(base, overrides)
    if algo_config_cls is not None and hasattr(config, "algo"):
        algo = dataclass_from_dict(algo_config_cls, getattr(config, "algo"), path="algo")
        config = dataclasses.replace(config, algo=to_dict(algo))
    return config


def save_config(config: Any, path: str | Path) -> Path:
    """Write a config as YAML (keys in declaration order); :func:`load_config` reads it back equal."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(to_dict(config), sort_keys=False, allow_unicode=True), encoding="utf-8")
    return path


def describe(cls: type, prefix: str = "") -> list[str]:
    """One line per dotted key: type, default and help; what ``--help`` lists as available overrides."""
    lines = []
    hints = _hints(cls)
    for f in dataclasses.fields(cls):
        key = _key(prefix, f.name)
        tp = hints.get(f.name, f.type)
        if dataclasses.is_dataclass(tp) and isinstance(tp, type):
            lines.extend(describe(tp, key))
            continue
        if f.default is not MISSING:
            default = f.default
        else:
            default = f.default_factory() if f.default_factory is not MISSING else "<required>"
        note = f.metadata.get("help", "") if f.metadata else ""
        lines.append(f"{key}: {_type_name(tp)} = {default!r}" + (f"  # {note}" if note else ""))
    return lines


def run_config_from_cli(
    config_path: str | Path | None,
    overrides: Iterable[str] = (),
    *,
    algorithm: str | None = None,
    env: str | None = None,
    student: str | None = None,
    teacher: str | None = None,
    algo_config_cls: type | None = None,
) -> RunConfig:
    """What ``agentgym-opd train --algo A --env E --student S [--teacher T] [--config F] [k=v ...]`` means:
    the named flags are shorthands applied before the free-form overrides, so ``model.student=...`` given
    as an override still wins over ``--student`` (the last word on the command line is explicit)."""
    flags = {"algorithm": algorithm, "env": env, "model.student": student, "model.teacher": teacher}
    shorthand = [f"{key}={value}" for key, value in flags.items() if value is not None]
    return load_config(config_path, [*shorthand, *overrides], RunConfig, algo_config_cls=algo_config_cls)


def parse_key_values(items: Iterable[str], flag: str = "--env-arg") -> dict[str, Any]:
    """``["num_tasks=8", "split=train"]`` -> ``{"num_tasks": 8, "split": "train"}`` (values as JSON when
    they parse, else as text): the command-line form of constructor options such as ``--env-arg``."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"{flag} expects KEY=VALUE, got {item!r}")
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    return out
