"""The uniform evaluation runner: any agent on any registered env split, fixed tasks and seeds, one record.

Which tasks: the split's task ids in their stable order; with `episodes` below the split size, an evenly
spaced subset (ids[i * n // episodes]), so every run of every algorithm sees the same tasks and the
sample spreads over task types that generators lay out in order. `samples_per_task` > 1 repeats each
task with distinct seeds, which is what pass@k needs. Envs run side by side on either executor (in this
process, or one per Ray actor) through the one rollout engine (`agentgym_opd.playing.play_tasks`), the
scripted agent wrapped as a `ScriptedPolicy`. Model policies (tiny, HF
folders, trainer checkpoints) go through `evaluation.policy_eval`, which writes the same record.
"""

from __future__ import annotations

import json
import subprocess
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Sequence

from tqdm import tqdm

from agentgym_opd.executors import make_vector_env
from agentgym_opd.playing import play_tasks
from agentgym_opd.policy.scripted import RandomAdmissibleAgent, ScriptedPolicy, TemplateTokens, WalkthroughAgent
from agentgym_opd.registry import make
from agentgym_opd.types import Episode
from evaluation.metrics import summarise
from evaluation.records import SCHEMA_VERSION, validate_record


# scripted agents, by name: seed -> agent (the walkthrough oracle ignores the seed)
SCRIPTED_AGENTS = {"walkthrough": lambda seed: WalkthroughAgent(), "random": lambda seed: RandomAdmissibleAgent(seed)}
SCRIPTED_CONTEXT = 10**9  # a scripted agent reads no context window: its episodes end by the env's turn limit


def code_revision() -> str:
    """The git revision of this checkout (with '+dirty' for uncommitted changes), or 'unknown'."""
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


def select_tasks(task_ids: list[str], episodes: int | None) -> list[str]:
    if episodes is None or episodes >= len(task_ids):
        return list(task_ids)
    if episodes < 1:
        raise ValueError(f"episodes must be at least 1, got {episodes}")
    return [task_ids[i * len(task_ids) // episodes] for i in range(episodes)]


SEED_BLOCKS = 16  # household held-out tasks: seed s evaluates block s mod 16 (seeds 16 apart share tasks)


def bench_split_args(env_id: str, seeds: Sequence[int], episodes: int) -> dict[str, Any]:
    """Constructor options that give a held-out split enough tasks for these seeds' blocks (household
    generates any number; its first tasks do not depend on how many): what the bench adds, and
    ``eval --bench-tasks`` too. Not an evaluation setting: the tasks played are the same ones."""
    if not env_id.startswith("household/"):
        return {}
    from environments.household.generator import DEFAULT_NUM_TASKS

    split = env_id.split("/", 1)[1].split("-", 1)[0]
    blocks = max(seed % SEED_BLOCKS for seed in seeds) + 1
    return {"num_tasks": max(DEFAULT_NUM_TASKS.get(split, 200), episodes * blocks)}


def bench_task_ids(env_id: str, task_ids: list[str], seed: int, episodes: int) -> list[str]:
    """The held-out tasks the bench evaluates seed ``seed`` on (``eval --bench-tasks`` uses the same):
    household takes the (seed mod 16)-th block of ``episodes`` consecutive tasks, which cycle through the six
    task types, so different seeds add different tasks; other families the same evenly spread subset for
    every seed (:func:`select_tasks`)."""
    if not env_id.startswith("household/"):
        return select_tasks(task_ids, episodes)
    k = seed % SEED_BLOCKS
    if (k + 1) * episodes > len(task_ids):
        raise ValueError(f"seed {seed} evaluates tasks {k * episodes}..{(k + 1) * episodes - 1} of {env_id}, which has "
                         f"{len(task_ids)}: the split needs num_tasks={(k + 1) * episodes} (the bench and "
                         "`eval --bench-tasks` size it so themselves; drop a smaller --env-arg num_tasks)")
    return task_ids[k * episodes:(k + 1) * episodes]


def run_agent(
    env_id: str,
    agent: str,
    task_ids: list[str] | None = None,
    *,
    episodes: int | None = None,
    samples_per_task: int = 1,
    seed: int = 0,
    num_envs: int = 8,
    executor: str = "local",
    progress: bool = True,
    **env_kwargs: Any,
) -> list[Episode]:
    """Play every selected task (x samples) with a scripted agent; episodes in task order, samples adjacent.

    Sample s of every task runs with its own agent seed (seed * 1000 + s), so samples of a task differ and
    pass@k means something; the envs are reset with seed * 1000 + s + k for entry k.
    """
    if agent not in SCRIPTED_AGENTS:
        raise ValueError(f"unknown scripted agent {agent!r}; choose one of {sorted(SCRIPTED_AGENTS)}")
    probe = make(env_id, **env_kwargs)
    ids = task_ids if task_ids is not None else select_tasks(probe.task_ids(), episodes)
    probe.close()
    vec = make_vector_env(env_id, min(num_envs, len(ids)), executor, **env_kwargs)
    tokens = TemplateTokens.tiny()  # bookkeeping only: no network reads a scripted agent's ids
    per_sample = []
    try:
        for sample in tqdm(range(samples_per_task), desc=f"eval {env_id}", unit="sample", disable=not progress):
            sample_seed = seed * 1000 + sample
            policy = ScriptedPolicy(SCRIPTED_AGENTS[agent](sample_seed), like=tokens)
            per_sample.append(play_tasks(policy, vec, ids, seed=sample_seed, max_context_tokens=SCRIPTED_CONTEXT))
    finally:
        vec.close()
    return [per_sample[s][k] for k in range(len(ids)) for s in range(samples_per_task)]


def task_outcomes(episodes: Sequence[Episode]) -> dict[str, float]:
    """Each task's success share over its episodes (one per task under greedy evaluation): what lets the
    leaderboard pair two records over the same (seed, task) episodes."""
    by_task: dict[str, list[float]] = {}
    for episode in episodes:
        by_task.setdefault(str(episode.task.id), []).append(float(episode.success))
    return {task: sum(v) / len(v) for task, v in by_task.items()}


def make_record(
    env_id: str,
    split: str,
    episodes: list[Episode],
    *,
    algorithm: str,
    student: str,
    teacher: str | None = None,
    algorithm_config: dict | None = None,
    seed: int = 0,
    wall_time_s: float = 0.0,
    curve: list[dict] | None = None,
    k_values: Sequence[int] = (1, 5, 10),
    protocol: dict[str, Any] | None = None,
    throughput: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A validated record of `episodes`; `k_values` are the pass@k reported where the sample count allows."""
    record = {
        "schema_version": SCHEMA_VERSION,
        "env_id": env_id,
        "split": split,
        "metrics": summarise(episodes, k_values),
        "n_episodes": len(episodes),
        "algorithm": algorithm,
        "algorithm_config": algorithm_config or {},
        "student": student,
        "teacher": teacher,
        "code_revision": code_revision(),
        "seed": seed,
        "wall_time_s": round(wall_time_s, 3),
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
    if curve:
        record["curve"] = curve
    record["outcomes"] = task_outcomes(episodes)
    if protocol:
        record["protocol"] = dict(protocol)
    if throughput:
        record["throughput"] = dict(throughput)
    return validate_record(record)


_TEXT_BOUND = 4000  # characters of one action / observation kept in a transcript (agent text is unbounded)


def _bounded(text: str) -> str:
    return text if len(text) <= _TEXT_BOUND else text[:_TEXT_BOUND] + f"... [{len(text) - _TEXT_BOUND} more characters]"


def episode_line(episode: Episode, index: int, *, transcript: bool, tokenizer: Any = None) -> dict[str, Any]:
    """One JSON line of an evaluation's episode file: its outcome, and with `transcript` every turn (the
    model's raw reply where a tokenizer can decode it, the action taken, the env's answer, the error)."""
    line: dict[str, Any] = {
        "index": index, "task_id": episode.task.id, "success": bool(episode.success), "score": float(episode.score),
        "return": episode.return_, "turns": episode.num_turns,
        "errors": [e.kind for e in episode.errors()],
        "agent_tokens": sum(len(t.action_token_ids) for t in episode.turns),
        "context_truncated": bool(episode.metadata.get("context_truncated", False)),
        "rollout_seed": episode.metadata.get("rollout_seed"),
    }
    if transcript:
        turns = []
        for t in episode.turns:
            turn: dict[str, Any] = {"action": _bounded(t.action), "observation": _bounded(t.observation),
                                    "reward": t.reward, "error": t.error.to_dict() if t.error else None}
            if tokenizer is not None and t.action_token_ids:
                turn["reply"] = _bounded(tokenizer.decode(t.action_token_ids, skip_special_tokens=True))
            turns.append(turn)
        line["transcript"] = {"first_observation": _bounded(episode.initial_observation), "turns": turns}
    return line


def evaluate_scripted(env_id: str, agent: str, *, episodes: int | None = None, samples_per_task: int = 1,
                      seed: int = 0, num_envs: int = 8, executor: str = "local", progress: bool = True,
                      episodes_out: Path | None = None, transcripts: int = 0, **env_kwargs: Any) -> dict[str, Any]:
    """Evaluate a scripted agent ('walkthrough' or 'random') and return a validated result record; with
    ``episodes_out``, the per-episode lines go there as for a model (the first ``transcripts`` with turns).
    A scripted run takes seconds, so its lines are written once it ends rather than episode by episode."""
    t0 = time.perf_counter()
    eps = run_agent(env_id, agent, episodes=episodes, samples_per_task=samples_per_task, seed=seed,
                    num_envs=num_envs, executor=executor, progress=progress, **env_kwargs)
    if episodes_out is not None:
        episodes_out.parent.mkdir(parents=True, exist_ok=True)
        episodes_out.write_text("".join(json.dumps(episode_line(e, i, transcript=i < transcripts)) + "\n"
                                        for i, e in enumerate(eps)), encoding="utf-8")
    return make_record(env_id, eps[0].task.split, eps, algorithm=agent, student=f"scripted:{agent}", seed=seed,
                       wall_time_s=time.perf_counter() - t0)
