"""The base pair's training data: expert episodes of household/train with and without context, with mistakes or
after a student's own turns, each as (token ids, loss mask) played through the bench's own rollout engine.

`base_models`' docstring says what goes into the data and why; `training_examples` is the entry point.
"""

from __future__ import annotations

import random
import re
from typing import Any

from evaluation.bench.base_models import (CONTEXT_KINDS, CONTEXT_WEIGHTS, TRAIN_ENV, BaseModelSpec, base_env_args,
                                          ensure_base_model)


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
        _, _, terminated, truncated, _ = env.step(action)
        if terminated or truncated:  # a demonstration longer than the turn limit (its example is left out anyway)
            break
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
    Another split than train only for measuring a model (`scripts/probes/base_model_probe.py`), never to train one."""
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
    from evaluation.bench.settings import BenchSettings

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
