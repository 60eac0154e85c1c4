"""Scripted agents: callables `(observation, info) -> action`, for rollouts before any policy exists.

Both are stateless across episodes (everything they need is in `info`: the `task` and the `turn`), so one
instance serves every env slot at once, and a restarted episode replays exactly the same actions.
"""

from __future__ import annotations

import random
import zlib
from typing import Any, Callable

Agent = Callable[[str, dict[str, Any]], str]


class WalkthroughAgent:
    """Replays `task.privileged["walkthrough"]`, one expert action per turn (an upper-bound baseline)."""

    def __init__(self, fallback: str = "look"):
        self.fallback = fallback  # sent once the walkthrough is exhausted (the env then decides the end)

    def __call__(self, observation: str, info: dict[str, Any]) -> str:
        task = info.get("task")
        if task is None:
            raise ValueError("WalkthroughAgent needs info['task'] (collect_episodes passes it on every turn)")
        walkthrough = task.privileged.get("walkthrough")
        if not walkthrough:
            raise ValueError(f"task {task.id!r} has no privileged['walkthrough'] to replay")
        turn = int(info.get("turn", 0))
        return walkthrough[turn] if turn < len(walkthrough) else self.fallback


class RandomAdmissibleAgent:
    """Picks uniformly among `info["admissible_actions"]` (or `fallback_actions` where the env lists none).

    The choice is seeded by (seed, task id, turn) rather than by one shared generator, so it does not depend
    on how episodes are interleaved across workers: the local and the Ray executor see the same actions.
    """

    def __init__(self, seed: int = 0, fallback_actions: tuple[str, ...] = ("look",)):
        if not fallback_actions:
            raise ValueError("fallback_actions must not be empty")
        self.seed = seed
        self.fallback_actions = tuple(fallback_actions)

    def __call__(self, observation: str, info: dict[str, Any]) -> str:
        actions = info.get("admissible_actions") or list(self.fallback_actions)
        task = info.get("task")
        key = f"{self.seed}|{task.id if task is not None else ''}|{info.get('turn', 0)}"
        rng = random.Random(zlib.crc32(key.encode()))
        return rng.choice(sorted(actions))
