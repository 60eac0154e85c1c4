"""Base models for the embedded bench: a small student and a larger teacher, trained once on household/train.

The papers distil between instruction-tuned models that already (a) act sensibly in the domain and (b) can
read extra context in their prompt (a solution, feedback on a failed attempt, a successful sibling). A
randomly initialised tiny model has neither, so every self-teacher method would distil noise. This module
builds the analogue once, offline, as ordinary Hugging Face folders:

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
import math
import os
import random
import re
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
    if shipped and _is_model(shipped_model_dir(spec)):
        return shipped_model_dir(spec)
    model = base_model_dir(spec) / "model"
    return model if _is_model(model) else None


def estimated_build_seconds(spec: BaseModelSpec) -> float:
    """A forecast of one build on the 2-core machine (one core), from its width and steps."""
    per_step = BUILD_SECONDS_PER_STEP.get(spec.hidden, BUILD_SECONDS_PER_STEP[64] * (spec.hidden / 64) ** 1.7)
    return BUILD_DATA_SECONDS + spec.steps * per_step


def base_label(spec: Any) -> str:
    """How records name a base model: its role, size, training steps and share of episodes with mistakes (the
    cache key is in the folder name)."""
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


def prompt_corpus(spec: BaseModelSpec, tasks: int = 40) -> list[str]:
    """Text in the pair's own prompt formats (status lines, context blocks) for the tokenizer: its words
    become tokens instead of letters, which keeps prompts short and the numbered steps easy to match."""
    from agentgym_opd.distill import privileged_text
    from agentgym_opd.registry import make

    env = make(TRAIN_ENV, **base_env_args(spec), num_tasks=tasks, max_turns=spec.max_turns)
    scratch = make(TRAIN_ENV, **base_env_args(spec), num_tasks=tasks, max_turns=spec.max_turns)
    rng = random.Random(f"base-model-corpus/{spec.seed}")
    texts: list[str] = []
    for task_id in env.task_ids():
        task = env.get_task(task_id)
        obs, _ = env.reset(options={"task_id": task_id})
        texts += [obs, privileged_text(task) or ""]
        for kind in ("sibling", "feedback"):
            texts.append(context_plan(task, kind, scratch, rng)[0])
        for action in task.privileged["demonstration"]:
            obs, _, terminated, truncated, _ = env.step(action)
            texts.append(obs)
            if terminated or truncated:
                break
    return texts


# ----------------------------------------------------------------------------------------------------
# Data: expert episodes with and without context, as (token ids, loss mask)
# ----------------------------------------------------------------------------------------------------


def context_plan(task: Any, kind: str, env: Any, rng: random.Random) -> tuple[str | None, list[str]]:
    """(context text or None, the actions the episode then takes) for one task and context kind."""
    from agentgym_opd.distill import actions_block, privileged_text, with_context

    demo = list(task.privileged["demonstration"])
    if kind == "none":
        return None, demo
    if kind == "walkthrough":
        return privileged_text(task), list(task.privileged["walkthrough"])
    if kind == "sibling":
        return with_context(["A successful attempt at this task. " + actions_block(demo), SDPO_INSTRUCTION]), demo
    if kind == "feedback":
        return with_context(["Feedback on your previous attempt: " + failed_attempt_feedback(env, task, rng),
                             SDPO_INSTRUCTION]), demo
    raise ValueError(f"unknown context kind {kind!r}; expected none or one of {CONTEXT_KINDS}")


SDPO_INSTRUCTION = "Solve the original task correctly."  # the closing line SDPO's teacher prompt uses


def failed_attempt_feedback(env: Any, task: Any, rng: random.Random) -> str:
    """The env's own feedback after a plausible failed attempt: a prefix of the demonstration cut short."""
    demo = task.privileged["demonstration"]
    env.reset(options={"task_id": task.id})
    for action in demo[: rng.randrange(len(demo))]:
        env.step(action)
    return env.episode_feedback()


MISTAKE_RATE = 0.25  # before each expert action of a chosen episode: chance of (another) invalid command


def with_mistakes(env: Any, task: Any, actions: list[str], rng: random.Random, max_turns: int) -> tuple[list[str], set[int]]:
    """The expert's actions with invalid commands put before some of them, and the turns that are mistakes.

    A student under training says things like "take cup 2 from countertop 3" where there is no cup, or goes
    to a receptacle the room does not have; a teacher that has only ever seen flawless histories is lost
    after such a turn, and on-policy distillation asks it about exactly those states. A mistake here is the
    expert's next action with one name swapped (for another name of the room, or a number the room does
    not have) such that the env rejects it: an invalid command changes nothing, so the expert's next action
    is still right, and it is what the model learns to say after the mistake (the mistake's own tokens are
    masked out of the loss)."""
    env.reset(options={"task_id": task.id})
    world = env.world
    out: list[str] = []
    mistakes: set[int] = set()
    slack = max_turns - len(actions)
    for action in actions:
        while len(mistakes) < slack and rng.random() < MISTAKE_RATE:
            wrong = invalid_variant(world, action, rng)
            if wrong is None:
                break
            mistakes.add(len(out))
            out.append(wrong)
        out.append(action)
        env.step(action)
    return out, mistakes


def invalid_variant(world: Any, action: str, rng: random.Random) -> str | None:
    """``action`` with one of its names ("cup 2") replaced so that the world rejects it, or None."""
    from environments.household.commands import resolve

    names = re.findall(r"[a-z]+ \d+", action)
    if not names:
        return None
    name = rng.choice(names)
    kind = name.split(" ")[0]
    pool = list(world.o_names) + list(world.r_names) + [f"{kind} {n}" for n in range(1, 7)]
    rng.shuffle(pool)
    for other in pool:
        wrong = action.replace(name, other, 1)
        if other != name and resolve(world, wrong) is None:
            return wrong
    return None


def choose_kind(rng: random.Random, share: float, weights: tuple[float, ...] | None = None) -> str:
    if rng.random() >= share:
        return "none"
    return rng.choices(CONTEXT_KINDS, weights=weights or CONTEXT_WEIGHTS)[0]


def training_examples(policy: Any, spec: BaseModelSpec, *, env_id: str = TRAIN_ENV,
                      progress: bool = False) -> list[tuple[list[int], list[int]]]:
    """One expert episode per task of ``env_id`` (its first ``spec.train_tasks``), context per ``choose_kind``.
    Another split than train only for measuring a model (`evaluation.base_model_probe`), never to train one."""
    from agentgym_opd.registry import make

    env = make(env_id, **base_env_args(spec), num_tasks=spec.train_tasks, max_turns=spec.max_turns)
    scratch = make(env_id, **base_env_args(spec), num_tasks=spec.train_tasks, max_turns=spec.max_turns)
    rng = random.Random(f"base-model-data/{spec.seed}")
    mistake_rng = random.Random(f"base-model-mistakes/{spec.seed}")  # apart: mistake_share 0 keeps the old data
    history_rng = random.Random(f"base-model-histories/{spec.seed}")  # apart: history_share 0 likewise
    plans = []  # (task id, context, actions, turns masked out of the loss), or a task id awaiting a student's turns
    for task_id in env.task_ids():
        task = env.get_task(task_id)
        kind = choose_kind(rng, spec.context_share, spec.context_weights)
        context, actions = context_plan(task, kind, scratch, rng)
        if len(actions) > spec.max_turns:  # 1 train task in 2000 (a lamp found only after a full round)
            continue
        mistakes: set[int] = set()
        if spec.history_share and kind == "none" and history_rng.random() < spec.history_share:
            plans.append(task_id)
            continue
        if spec.mistake_share and kind != "walkthrough" and mistake_rng.random() < spec.mistake_share:
            actions, mistakes = with_mistakes(scratch, task, actions, mistake_rng, spec.max_turns)
        plans.append((task_id, context, actions, mistakes))
    waiting = [p for p in plans if isinstance(p, str)]
    if waiting:
        histories = student_turns(spec, env_id, waiting, progress=progress)
        plans = [p if not isinstance(p, str) else after_student(scratch, env.get_task(p), histories[p], history_rng,
                                                                spec.max_turns) for p in plans]
    examples = []
    for task_id, context, actions, mistakes in plans:
        example, episode = scripted_example(policy, env, task_id, actions, mistakes, context)
        if mistakes and not episode.success and episode.metadata.get("context_truncated"):
            # a student's history of long garbage outgrew the context budget: the plain demonstration instead
            actions = list(env.get_task(task_id).privileged["demonstration"])
            example, episode = scripted_example(policy, env, task_id, actions, set(), context)
        if not episode.success:
            raise RuntimeError(f"expert episode of {task_id} did not succeed: the demonstration is broken")
        examples.append(example)
    return examples


def scripted_example(policy: Any, env: Any, task_id: str, actions: list[str], masked: set[int],
                     context: str | None = None) -> tuple[tuple[list[int], list[int]], Any]:
    """((token ids, loss mask), episode) of ``actions`` played on ``env``'s task through the bench's own
    `RolloutEngine` and chat template; the turns in ``masked`` are left out of the loss."""
    from agentgym_opd.policy.base import SamplingParams
    from agentgym_opd.policy.scripted import ScriptAgent, ScriptedPolicy
    from agentgym_opd.rollout import RolloutEngine
    from agentgym_opd.trainer import DEFAULT_SYSTEM_PROMPT

    longest = max(len(policy.tokenizer.encode(a, add_special_tokens=False)) for a in actions)
    engine = RolloutEngine(ScriptedPolicy(ScriptAgent(actions), like=policy), SamplingParams(max_new_tokens=longest + 1),
                           system_prompt=DEFAULT_SYSTEM_PROMPT, action_parser="text")
    batch = engine.collect([env], [task_id], seed=0, contexts=[context])
    n = int(batch.attention_mask[0].sum())
    mask = [int(m) * int(int(t) not in masked) for m, t in zip(batch.loss_mask[0, :n].tolist(),
                                                                 batch.turn_index[0, :n].tolist())]
    return (batch.input_ids[0, :n].tolist(), mask), batch.episodes[0]


def student_turns(spec: BaseModelSpec, env_id: str, task_ids: list[str], *, progress: bool = False) -> dict[str, list[str]]:
    """The actions of ``spec.history_model`` (built first if not cached) in one sampled rollout of each task."""
    from agentgym_opd.policy.hf import HFPolicy

    if spec.history_model is None:
        raise ValueError(f"base model spec {spec.name!r} has history_share {spec.history_share} but no history_model")
    student = HFPolicy.from_pretrained(str(ensure_base_model(spec.history_model, progress=progress)))
    return sampled_turns(student, env_id, task_ids, env_args=base_env_args(spec.history_model), seed=spec.seed,
                         progress=progress, desc=f"{spec.history_model.name} rollouts for {spec.name}")


def sampled_turns(policy: Any, env_id: str, task_ids: list[str], *, env_args: dict[str, Any], seed: int = 0,
                  progress: bool = False, desc: str = "rollouts") -> dict[str, list[str]]:
    """The policy's actions in one rollout of each task, sampled as the bench's on-policy training samples them
    (its temperature, turn limit and token budget per action; the env family's parser and system prompt)."""
    from tqdm import tqdm

    from agentgym_opd.playing import play_tasks
    from agentgym_opd.policy.base import SamplingParams
    from agentgym_opd.registry import env_protocol
    from evaluation.bench import BenchSettings

    protocol = env_protocol(env_id)
    sampling = SamplingParams(max_new_tokens=BenchSettings.max_new_tokens, temperature=BenchSettings.temperature)
    bar = tqdm(total=len(task_ids), desc=desc, unit="episode", disable=not progress)
    episodes = play_tasks(policy, env_id, task_ids, sampling=sampling,
                          action_parser=protocol.action_parser, system_prompt=protocol.system_prompt, batch_size=32,
                          max_context_tokens=4096, seed=seed, on_episode=lambda i, e: bar.update(1),
                          env_kwargs={**env_args, "max_turns": BenchSettings.max_turns})
    bar.close()
    return {task_id: [turn.action for turn in episode.turns] for task_id, episode in zip(task_ids, episodes)}


def after_student(env: Any, task: Any, student: list[str], rng: random.Random, max_turns: int
                  ) -> tuple[str, None, list[str], set[int]]:
    """(task id, no context, actions, masked turns): the student's first k turns (k uniform over the turns it
    played before it ended, at least one), then the observable expert's `continuation` from where they left
    the world. The plain demonstration if the continuation would not fit in ``max_turns``."""
    from environments.household.expert import continuation

    if not student:
        return task.id, None, list(task.privileged["demonstration"]), set()
    env.reset(options={"task_id": task.id})
    k = rng.randint(1, len(student))
    done = False
    for action in student[:k]:
        _, _, terminated, truncated, _ = env.step(action)
        done = terminated or truncated
    if done:  # the student solved it (or ran out of turns) by turn k: its last turn led nowhere new; keep k - 1
        k -= 1
        env.reset(options={"task_id": task.id})
        for action in student[:k]:
            env.step(action)
    rest = continuation(env.world, env.checker)
    if k + len(rest) > max_turns:
        return task.id, None, list(task.privileged["demonstration"]), set()
    return task.id, None, student[:k] + rest, set(range(k))


# ----------------------------------------------------------------------------------------------------
# Training: next-token cross-entropy on the agent's tokens
# ----------------------------------------------------------------------------------------------------


def learning_rate(step: int, spec: BaseModelSpec) -> float:
    """Linear warm-up, then cosine decay to a tenth of the peak at ``schedule_steps`` (default: ``steps``)."""
    if step < spec.warmup_steps:
        return spec.lr * (step + 1) / spec.warmup_steps
    horizon = spec.schedule_steps or spec.steps
    progress = (step - spec.warmup_steps) / max(1, horizon - spec.warmup_steps)
    return spec.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0))))


def action_spans(loss_mask: list[int]) -> list[tuple[int, int]]:
    """[start, end) of each run of agent tokens (one action and its end-of-turn token)."""
    spans, i = [], 0
    while i < len(loss_mask):
        if loss_mask[i]:
            j = i
            while j < len(loss_mask) and loss_mask[j]:
                j += 1
            spans.append((i, j))
            i = j
        else:
            i += 1
    return spans


def token_weights(loss_mask: list[int], decision_weight: float) -> list[float]:
    """Per-token loss weights: 1 on agent tokens, ``decision_weight`` on the first token of each action (the
    decision: most of an action is copied from the observation, the verb is chosen, and the rare choices
    such as taking the wanted object are the ones a small model misses), 0 elsewhere."""
    weights = [float(m) for m in loss_mask]
    for start, _ in action_spans(loss_mask):
        weights[start] = decision_weight
    return weights


def accumulate_batch_gradient(model: Any, rows: list[tuple[list[int], list[int]]], decision_weight: float = 1.0) -> float:
    """Backpropagate the batch's weighted token-mean cross-entropy on its agent tokens (`token_weights`);
    returns the loss.

    One row at a time, unpadded: with no attention mask attention takes its fused causal kernel (about twice
    as fast on CPU as a padded batch), and the rows' gradients add up to the batch mean's. The LM head runs
    only where a loss is taken (the agent's tokens, ~10% of positions): for a small model the vocabulary
    projection is most of the compute."""
    import torch

    weights = [token_weights(m, decision_weight)[1:] for _, m in rows]
    total = sum(sum(w) for w in weights)  # the batch's weighted loss tokens: the mean is over all of them
    batch_loss = 0.0
    for (seq, m), w in zip(rows, weights):
        ids = torch.tensor([seq])
        where = torch.tensor(m[1:], dtype=torch.bool)
        hidden = model.model(input_ids=ids).last_hidden_state[0, :-1]
        per_token = torch.nn.functional.cross_entropy(model.lm_head(hidden[where]), ids[0, 1:][where], reduction="none")
        loss = (per_token * torch.tensor(w)[where]).sum() / total
        loss.backward()
        batch_loss += float(loss.detach())
    return batch_loss


def train_on_examples(model: Any, examples: list[tuple[list[int], list[int]]], spec: BaseModelSpec, *,
                      progress: bool = True, progress_file: Path | None = None) -> list[float]:
    """AdamW on seeded mini-batches; returns the loss of every step. ``progress_file`` gets the number of
    steps done every 10 steps (overwritten; a reader in another process turns it into a bar with an ETA)."""
    import torch
    from tqdm import tqdm

    torch.manual_seed(spec.seed)
    rng = random.Random(f"base-model-batches/{spec.seed}")
    model.train()
    optimiser = torch.optim.AdamW(model.parameters(), lr=spec.lr, weight_decay=0.01)
    losses = []
    order: list[int] = []
    bar = tqdm(range(spec.steps), desc=f"base model {spec.name}", unit="step", disable=not progress)
    for step in bar:
        if len(order) < spec.batch_size:
            fresh = list(range(len(examples)))
            rng.shuffle(fresh)
            order += fresh
        rows = [examples[order.pop()] for _ in range(spec.batch_size)]
        for group in optimiser.param_groups:
            group["lr"] = learning_rate(step, spec)
        optimiser.zero_grad(set_to_none=True)
        step_loss = accumulate_batch_gradient(model, rows, spec.decision_weight)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimiser.step()
        losses.append(step_loss)
        bar.set_postfix(loss=f"{losses[-1]:.3f}")
        if progress_file is not None and ((step + 1) % 10 == 0 or step + 1 == spec.steps):
            progress_file.write_text(f"{step + 1}\n", encoding="utf-8")
    model.eval()
    return losses


def household_student() -> Path:
    """`household-student`: the bench's default base student (entry point of `agentgym_opd.models`)."""
    return ensure_base_model(STUDENT_SPEC, log=_log_stderr)


def household_teacher() -> Path:
    """`household-teacher`: the bench's default base teacher (entry point of `agentgym_opd.models`)."""
    return ensure_base_model(TEACHER_SPEC, log=_log_stderr)


def _log_stderr(line: str) -> None:
    import sys

    print(line, file=sys.stderr, flush=True)
