"""The uniform evaluation runner: any agent on any registered env split, fixed tasks and seeds, one record.

Which tasks: the split's task ids in their stable order; with `episodes` below the split size, an evenly
spaced subset (ids[i * n // episodes]), so every run of every algorithm sees the same tasks and the
sample spreads over task types that generators lay out in order. `samples_per_task` > 1 repeats each
task with distinct seeds (seed * 1000 + sample), which is what pass@k needs. Envs run side by side in a
`VectorTextEnv`; the agent acts on each env's own (observation, info).
"""

from __future__ import annotations

import subprocess
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

from tqdm import tqdm

from agentgym_opd.registry import make
from agentgym_opd.types import Episode, Turn
from agentgym_opd.vector import VectorTextEnv
from evaluation.agents import SCRIPTED_AGENTS, Agent
from evaluation.metrics import summarise
from evaluation.records import SCHEMA_VERSION, validate_record


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


def run_agent(
    env_id: str,
    agent_factory: Callable[[], Agent],
    task_ids: list[str] | None = None,
    *,
    episodes: int | None = None,
    samples_per_task: int = 1,
    seed: int = 0,
    num_envs: int = 8,
    progress: bool = True,
    **env_kwargs: Any,
) -> list[Episode]:
    """Play every selected task (x samples) to the end with one agent per env slot; episodes in task order."""
    probe = make(env_id, **env_kwargs)
    ids = task_ids if task_ids is not None else select_tasks(probe.task_ids(), episodes)
    jobs = [(tid, s) for tid in ids for s in range(samples_per_task)]
    vec = VectorTextEnv([probe] + [make(env_id, **env_kwargs) for _ in range(min(num_envs, len(jobs)) - 1)])
    agents = [agent_factory() for _ in vec.envs]
    results: dict[int, Episode] = {}
    bar = tqdm(total=len(jobs), desc=f"eval {env_id}", unit="ep", disable=not progress)
    slots: list[tuple[int, Episode, dict] | None] = [None] * vec.num_envs
    next_job = 0

    def start(slot: int) -> None:
        nonlocal next_job
        if next_job >= len(jobs):
            slots[slot] = None
            return
        job = next_job
        next_job += 1
        tid, sample = jobs[job]
        episode_seed = seed * 1000 + sample
        obs, info = vec.envs[slot].reset(seed=episode_seed, options={"task_id": tid})
        vec.active[slot] = True
        agents[slot].begin(info, episode_seed)
        slots[slot] = (job, Episode(info["task"], obs, metadata={"seed": episode_seed}), info)

    for slot in range(vec.num_envs):
        start(slot)
    while any(s is not None for s in slots):
        actions = []
        for slot, state in enumerate(slots):
            if state is None:
                actions.append(None)
                continue
            _, episode, info = state
            last_obs = episode.turns[-1].observation if episode.turns else episode.initial_observation
            actions.append(agents[slot].act(last_obs, info))
        for slot, res in enumerate(vec.step(actions)):
            if res is None:
                continue
            job, episode, _ = slots[slot]  # type: ignore[misc]
            episode.add(Turn(actions[slot], res.observation, res.reward, res.info["error"], res.info["feedback"],
                             res.terminated, res.truncated, info=res.info))
            slots[slot] = (job, episode, res.info)
            if res.done:
                results[job] = episode
                bar.update(1)
                start(slot)
    bar.close()
    return [results[j] for j in range(len(jobs))]


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
) -> dict[str, Any]:
    record = {
        "schema_version": SCHEMA_VERSION,
        "env_id": env_id,
        "split": split,
        "metrics": summarise(episodes),
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
    return validate_record(record)


def evaluate_scripted(env_id: str, agent: str, *, episodes: int | None = None, samples_per_task: int = 1,
                      seed: int = 0, num_envs: int = 8, progress: bool = True, **env_kwargs: Any) -> dict[str, Any]:
    """Evaluate a scripted agent ('walkthrough' or 'random') and return a validated result record."""
    if agent not in SCRIPTED_AGENTS:
        raise ValueError(f"unknown scripted agent {agent!r}; choose one of {sorted(SCRIPTED_AGENTS)}")
    t0 = time.perf_counter()
    eps = run_agent(env_id, SCRIPTED_AGENTS[agent], episodes=episodes, samples_per_task=samples_per_task, seed=seed,
                    num_envs=num_envs, progress=progress, **env_kwargs)
    split = eps[0].task.split
    return make_record(env_id, split, eps, algorithm=agent, student=f"scripted:{agent}", seed=seed,
                       wall_time_s=time.perf_counter() - t0)
