"""`collect_episodes`: play a list of tasks over the env slots of either executor, one `Episode` per task.

Why a scheduler and not fixed waves: episodes end at different turns, so a slot that finishes takes the
next task at once instead of idling until the slowest episode of its wave is done.

Crash semantics: when a slot reports an `env_crash` (or `timeout`) result, that attempt is thrown away
and the task goes back to the *front* of the queue, to be replayed from its first turn on a fresh actor,
up to `max_attempts` attempts in all. The caller still gets exactly one `Episode` per requested entry:
the first attempt that ended normally, or (when every attempt crashed) the last attempt, ending with its
crash turn. Every crash is recorded in `Episode.metadata["crashes"]`, and `metadata["attempts"]` says
how many attempts were started, so a crashed-and-replayed episode is never mistaken for a clean one and
never counted twice.
"""

from __future__ import annotations

from collections import deque
from typing import Any, Sequence

from agentgym_opd.executors.agents import Agent
from agentgym_opd.executors.factory import reset_slots
from agentgym_opd.types import Episode, Turn

_LOST_FLAGS = ("env_crashed", "env_timed_out")


def collect_episodes(vec: Any, agent: Agent, task_ids: Sequence[str], *, seed: int = 0,
                     max_attempts: int = 3) -> list[Episode]:
    """Run every task in `task_ids` (duplicates allowed: each entry is its own episode) and return the
    episodes in the same order. Entry k is reset with `seed + k` and `options={"task_id": task_ids[k]}`;
    the agent sees `info["task"]` on every turn."""
    if max_attempts < 1:
        raise ValueError(f"max_attempts must be at least 1, got {max_attempts}")
    entries = list(task_ids)
    queue = deque(range(len(entries)))
    attempts = [0] * len(entries)
    crashes: list[list[dict[str, Any]]] = [[] for _ in entries]
    finished: dict[int, Episode] = {}
    n = vec.num_envs
    slot_entry: list[int | None] = [None] * n
    slot_episode: list[Episode | None] = [None] * n
    slot_view: list[tuple[str, dict[str, Any]] | None] = [None] * n

    while queue or any(e is not None for e in slot_entry):
        free = [i for i in range(n) if slot_entry[i] is None]
        starting = [(i, queue.popleft()) for i in free[: len(queue)]]
        if starting:
            resets = reset_slots(
                vec, [i for i, _ in starting], [seed + k for _, k in starting],
                [{"task_id": entries[k]} for _, k in starting],
            )
            for (i, k), (obs, info) in zip(starting, resets):
                attempts[k] += 1
                slot_entry[i] = k
                slot_episode[i] = Episode(task=info["task"], initial_observation=obs)
                slot_view[i] = (obs, dict(info))

        actions: list[str | None] = [None] * n
        for i in range(n):
            if slot_entry[i] is not None:
                obs, info = slot_view[i]
                actions[i] = agent(obs, info)
        results = vec.step(actions)

        for i, res in enumerate(results):
            if res is None:
                continue
            k, episode = slot_entry[i], slot_episode[i]
            turn = Turn(
                action=actions[i], observation=res.observation, reward=res.reward, error=res.info.get("error"),
                feedback=res.info.get("feedback", ""), terminated=res.terminated, truncated=res.truncated,
                info={key: v for key, v in res.info.items() if key != "task"},
            )
            if any(res.info.get(flag) for flag in _LOST_FLAGS):
                crashes[k].append({"attempt": attempts[k], "env_index": i, "turn": res.info.get("turn"),
                                   "kind": turn.error.kind if turn.error else "env_crash",
                                   "message": res.observation})
                if attempts[k] < max_attempts:
                    queue.appendleft(k)  # replay from the first turn, before any new task
                    slot_entry[i] = slot_episode[i] = slot_view[i] = None
                    continue
            episode.add(turn)
            if res.done:
                episode.metadata.update({
                    "attempts": attempts[k], "crashes": crashes[k], "env_index": i, "seed": seed + k,
                    "gave_up": bool(crashes[k]) and any(res.info.get(flag) for flag in _LOST_FLAGS),
                })
                finished[k] = episode
                slot_entry[i] = slot_episode[i] = slot_view[i] = None
            else:
                slot_view[i] = (res.observation, {**res.info, "task": episode.task})

    return [finished[k] for k in range(len(entries))]
