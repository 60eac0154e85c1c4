"""Scripted agents: reference points that need no model.

`WalkthroughAgent` replays the task's privileged expert walkthrough (an oracle: it measures the env and
its scorer, and is the upper bound a distilled student chases); `RandomAdmissibleAgent` picks uniformly
among the admissible actions (the floor). Both act on one env's (observation, info) at a time.
"""

from __future__ import annotations

import random
from typing import Any, Protocol


class Agent(Protocol):
    name: str

    def begin(self, info: dict[str, Any], seed: int) -> None: ...

    def act(self, observation: str, info: dict[str, Any]) -> str: ...


class WalkthroughAgent:
    name = "walkthrough"

    def begin(self, info: dict[str, Any], seed: int) -> None:
        walkthrough = info["task"].privileged.get("walkthrough")
        if not walkthrough:
            raise ValueError(f"task {info['task'].id} has no privileged walkthrough to replay")
        self._steps = list(walkthrough)
        self._i = 0

    def act(self, observation: str, info: dict[str, Any]) -> str:
        step = self._steps[self._i] if self._i < len(self._steps) else self._steps[-1]
        self._i += 1
        return step


class RandomAdmissibleAgent:
    name = "random"

    def begin(self, info: dict[str, Any], seed: int) -> None:
        self._rng = random.Random(seed)

    def act(self, observation: str, info: dict[str, Any]) -> str:
        admissible = info.get("admissible_actions")
        if not admissible:
            raise ValueError("the random agent needs an env that lists admissible actions")
        return self._rng.choice(admissible)


SCRIPTED_AGENTS = {"walkthrough": WalkthroughAgent, "random": RandomAdmissibleAgent}
