"""Base models for the embedded bench: a small student and a larger teacher, trained once on household/train.

The papers distil between instruction-tuned models that already (a) act sensibly in the domain and (b) can
read extra context in their prompt (a solution, feedback on a failed attempt, a successful sibling). A
randomly initialised tiny model has neither, so every self-teacher method would distil noise. This module
builds the analogue once, offline, as ordinary Hugging Face folders. This module holds the specs, the shipped
pair (``base_pair/``), the cache and the build; the data is made in `base_data`, the training loop is
`base_training`'s:

* the data: one episode per train task, played through the same `RolloutEngine` (and chat template) the
  bench's rollouts use, so what the model learns to say is token for token what it will be asked to say.
  Without context the actions are the observable expert's `privileged["demonstration"]` (it searches until
  it sees the object: learnable, and it generalises to held-out combinations). A share of episodes
  (`context_share`) carries a context block after the first observation, in the exact formats the
  self-teachers use (`agentgym_opd.distill`): the task's walkthrough (the actions are then that walkthrough:
  copying a plan from context is the skill OPSD/VPD/LOPD teachers need), a successful sibling's actions
  (SDPO; the actions follow the sibling) or feedback on a failed attempt (SDPO; the actions are the
  demonstration: the network learns that such feedback does not derail it);
* mistakes (the teacher's `mistake_share`): a share of the episodes that do not copy a walkthrough carry
  invalid commands like a student's in their history, masked out of the loss (`with_mistakes`), because
  on-policy distillation asks the teacher what to do after exactly such turns;
* the student's own turns (the teacher's `history_share`): a share of the episodes without context open with
  the student's sampled rollout of the task, cut at a random turn and masked out of the loss, and go on with
  the observable expert's `continuation` from the state the student left: DAgger's labels, on the states
  on-policy distillation asks the teacher about. Off in the bench's pair (README, "The teacher is a poor
  guide on the student's states", measures a teacher built so);
* the env: the status line restates the task and what is carried, names the wanted object in view, and
  ends with the coming action's number ("Step 4 next."), which is how a numbered plan in context names its
  steps: following a plan becomes a lookup, where a network from scratch cannot count its own turns;
* the models: Llama-style, the tiny tokenizer trained on the env's text plus the pair's own prompt formats
  (`prompt_corpus`; the same tokenizer for both: distillation compares their token distributions), student
  smaller than teacher, plain next-token cross-entropy on the agent's tokens;
* the cache: `<cache>/bench-base/<name>-<key>/model`, the key a hash of every setting (`BaseModelSpec`),
  so a changed recipe can never hand back a stale model; a build is deterministic (seeded data order and
  initialisation, one torch thread recommended) and shows a progress bar.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

BUILD_VERSION = 3  # bump when the data or the recipe changes in a way the spec does not capture
TRAIN_ENV = "household/train"
CONTEXT_KINDS = ("walkthrough", "sibling", "feedback")
CONTEXT_WEIGHTS = (0.5, 0.25, 0.25)


@dataclass(frozen=True)
class BaseModelSpec:
    """Every setting a base model depends on (its cache key)."""

    name: str
    hidden: int
    layers: int
    heads: int
    steps: int
    batch_size: int = 8
    lr: float = 3e-3
    warmup_steps: int = 30
    train_tasks: int = 2000
    context_share: float = 0.35
    max_turns: int = 40
    status_line: bool = True  # the household env's status line (task + what is carried) after every step
    goal_in_view: bool = True  # the status line also names the wanted object (or lamp) in view (needs status_line)
    turn_counter: bool = True  # observations end "Step N next.", as numbered plans in context name their steps
    decision_weight: float = 1.0  # loss weight of each action's first token, where go/open/take/put is chosen
    seed: int = 0
    version: int = BUILD_VERSION
    # share of the expert's episodes (not those copying a walkthrough) whose history carries invalid commands
    # like a student's, masked out of the loss (`with_mistakes`): the model learns to act well after mistakes
    mistake_share: float = 0.0
    # how the context episodes divide among CONTEXT_KINDS (walkthrough, sibling, feedback); None: CONTEXT_WEIGHTS
    context_weights: tuple[float, float, float] | None = None
    # share of the episodes without context that open with a student's own turns (`history_model`'s sampled
    # rollout of the task, cut at a random turn; masked out of the loss) and go on with the observable
    # expert's `continuation` from the state the student left (DAgger's labels on the student's states)
    history_share: float = 0.0
    history_model: "BaseModelSpec | None" = None
    # the cosine schedule's length; None: ``steps``. Longer than ``steps``, the model is a checkpoint from partway
    # through training (its learning rate not yet decayed), which further supervision can still move
    schedule_steps: int | None = None

    def key(self) -> str:
        settings = dataclasses.asdict(self)
        added_later = ("mistake_share", "context_weights", "history_share", "history_model", "schedule_steps")
        for later in added_later:  # unset, they leave cached models' keys
            if not settings[later]:
                del settings[later]
        if self.history_model is not None:
            settings["history_model"] = self.history_model.key()
        return hashlib.sha1(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:10]


# The bench's pair: the teacher is wider and trained 1.5x as long as the student. 80% of the student's
# episodes carry context, four in five of those a walkthrough, so that its own network learns to follow a plan.
# The student is a checkpoint halfway through a 2000-step schedule (its learning rate not yet decayed): a weak
# searcher that reads a plan well (README: at the bench's 20 turns it solves 0.31 of valid_unseen alone and
# 0.46 with the plan) and, unlike the same network annealed to the end of its schedule, one that supervision
# on its own states can still lift (README, "A student that supervision can move"). Half the teacher's plain
# episodes carry a student's kind of mistakes, as on-policy distillation shows it the student's own histories.
STUDENT_SPEC = BaseModelSpec("student", hidden=64, layers=2, heads=4, steps=1000, context_share=0.8,
                             context_weights=(0.8, 0.1, 0.1), schedule_steps=2000)
TEACHER_SPEC = BaseModelSpec("teacher", hidden=128, layers=2, heads=4, steps=1500, context_share=0.5,
                             mistake_share=0.5)


def base_env_args(spec: BaseModelSpec) -> dict[str, Any]:
    """The household env options a base model was trained with (its rollouts and evaluations must use them)."""
    args: dict[str, Any] = {"status_line": True} if spec.status_line else {}
    if spec.status_line and spec.goal_in_view:
        args["goal_in_view"] = True
    if spec.status_line and spec.turn_counter:
        args["turn_counter"] = True
    return args


# The default pair ships with the repository (a few MB), so a fresh clone's first bench starts at once; a pair
# of other settings (``--base-steps``, a changed recipe) is built into the cache. `agentgym-opd base-pair
# build` rebuilds the default pair from its recipe and `base-pair check` compares the rebuild with these files.
SHIPPED_PAIR_DIR = Path(__file__).resolve().parent / "base_pair"

# Measured build speed on the 2-core build machine (one torch thread, idle): seconds per training step by the
# model's width, plus the data: playing the train split's episodes through the rollout engine first.
BUILD_SECONDS_PER_STEP = {64: 0.3, 128: 0.95}
BUILD_DATA_SECONDS = 45.0


def base_model_dir(spec: BaseModelSpec) -> Path:
    """Where a build of ``spec`` goes (and is looked for): the cache, never the shipped folder."""
    from agentgym_opd.policy.tiny import cache_dir

    return cache_dir() / "bench-base" / f"{spec.name}-{spec.key()}"


def shipped_model_dir(spec: BaseModelSpec) -> Path:
    return SHIPPED_PAIR_DIR / f"{spec.name}-{spec.key()}" / "model"


def _is_model(model: Path) -> bool:
    return (model / "config.json").is_file() and (model / "tokenizer.json").is_file()


def cached_base_model(spec: BaseModelSpec, *, shipped: bool = True) -> Path | None:
    """The spec's model folder if it exists: the shipped one first (``shipped=True``), else a cached build."""
    if hasattr(spec, "cached"):  # a track's own pair (e.g. `alfworld_pair`): its spec knows its cache
        return spec.cached()
    if shipped and _is_model(shipped_model_dir(spec)):
        return shipped_model_dir(spec)
    model = base_model_dir(spec) / "model"
    return model if _is_model(model) else None


def estimated_build_seconds(spec: BaseModelSpec) -> float:
    """A forecast of one build on the 2-core machine (one core), from its width and steps."""
    if hasattr(spec, "estimated_seconds"):  # a track's own pair
        return spec.estimated_seconds()
    per_step = BUILD_SECONDS_PER_STEP.get(spec.hidden, BUILD_SECONDS_PER_STEP[64] * (spec.hidden / 64) ** 1.7)
    return BUILD_DATA_SECONDS + spec.steps * per_step


def base_label(spec: Any) -> str:
    """How records name a base model: its role, size, training steps and share of episodes with mistakes (the
    cache key is in the folder name)."""
    if hasattr(spec, "label"):  # a track's own pair names itself
        return spec.label()
    label = f"household-{spec.name}-{spec.hidden}x{spec.layers}-{spec.steps}steps"
    return label + (f"-mistakes{round(100 * spec.mistake_share)}" if spec.mistake_share else "")


def name_model_folder(model: Path, spec: BaseModelSpec) -> Path:
    """Write the label records use (:func:`base_label`) into the model folder, so an `eval` of this folder, or
    of a run trained from it, names it as the bench's records do, not by a local cache path."""
    from agentgym_opd.policy.loading import MODEL_NAME_FILE

    target = model / MODEL_NAME_FILE
    if not target.is_file():
        target.write_text(json.dumps({"name": base_label(spec)}) + "\n", encoding="utf-8")
    return model


def ensure_base_model(spec: BaseModelSpec, *, progress: bool = True, log: Callable[[str], None] = print,
                      shipped: bool = True, progress_file: Path | None = None) -> Path:
    """The spec's model folder: the shipped one, a cached build, or a new build into the cache (prints the
    one-time build time). ``shipped=False`` ignores the shipped pair (``base-pair build`` rebuilds it);
    ``progress_file`` receives the steps done, for a parent process that shows the progress of a worker's build."""
    if hasattr(spec, "ensure"):  # a track's own pair builds (or resumes) by its own recipe
        return spec.ensure(progress=progress, log=log, progress_file=progress_file)
    cached = cached_base_model(spec, shipped=shipped)
    if cached is not None:
        return cached if cached == shipped_model_dir(spec) else name_model_folder(cached, spec)
    final = base_model_dir(spec)
    tmp = final.with_name(final.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    started = time.perf_counter()
    log(f"building base model {spec.name} ({spec.hidden}x{spec.layers}, {spec.steps} steps, "
        f"~{estimated_build_seconds(spec) / 60:.0f} min): these settings are not the shipped pair's, so it is "
        f"trained once from its recipe and cached in {final}")
    name_model_folder(build_base_model(spec, tmp / "model", progress=progress, progress_file=progress_file), spec)
    (tmp / "spec.json").write_text(json.dumps(dataclasses.asdict(spec), indent=2) + "\n", encoding="utf-8")
    wall = time.perf_counter() - started
    (tmp / "build_time_s.txt").write_text(f"{wall:.1f}\n", encoding="utf-8")
    try:
        tmp.rename(final)
    except OSError:  # another process finished first: keep theirs
        shutil.rmtree(tmp, ignore_errors=True)
    log(f"base model {spec.name} built in {wall / 60:.1f} min (one-time; not part of the bench's own time)")
    return final / "model"


def build_base_model(spec: BaseModelSpec, out: Path, *, progress: bool = True, progress_file: Path | None = None) -> Path:
    """Initialise (seeded) and train one base model into ``out`` (a plain HF folder)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from agentgym_opd.policy.hf import HFPolicy
    from agentgym_opd.policy.tiny import GENERIC_TEXT, build_tiny_model, env_corpus
    from evaluation.bench.base_data import prompt_corpus, training_examples
    from evaluation.bench.base_training import train_on_examples

    build_tiny_model(out, env_corpus() + GENERIC_TEXT + prompt_corpus(spec), hidden=spec.hidden, layers=spec.layers, heads=spec.heads,
                     seed=spec.seed)
    tokenizer = AutoTokenizer.from_pretrained(out, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(out, local_files_only=True)
    policy = HFPolicy(model, tokenizer)
    examples = training_examples(policy, spec, progress=progress)
    train_on_examples(model, examples, spec, progress=progress, progress_file=progress_file)
    model.eval()
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    del torch
    return out


def household_student() -> Path:
    """`household-student`: the bench's default base student (entry point of `agentgym_opd.models`)."""
    return ensure_base_model(STUDENT_SPEC, log=_log_stderr)


def household_teacher() -> Path:
    """`household-teacher`: the bench's default base teacher (entry point of `agentgym_opd.models`)."""
    return ensure_base_model(TEACHER_SPEC, log=_log_stderr)


def _log_stderr(line: str) -> None:
    import sys

    print(line, file=sys.stderr, flush=True)
