"""What the bank stores: an `Experience`, a successful episode reduced to task plus action-result trace."""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from typing import Any

from agentgym_opd.types import Episode

MAX_OBSERVATION_CHARS = 200  # a trace is a reminder of what worked, not a transcript


@dataclass
class Experience:
    env_id: str
    task_id: str
    instruction: str
    trace: list[tuple[str, str]]  # (action, short observation) per turn
    score: float = 1.0
    metadata: dict[str, Any] = field(default_factory=dict)
    id: int | None = None
    created: float | None = None

    def trace_hash(self) -> str:
        """Dedup key: the instruction and the trace after case/whitespace normalisation."""
        norm = lambda s: re.sub(r"\s+", " ", s.strip().lower())  # noqa: E731
        payload = json.dumps([norm(self.instruction), [[norm(a), norm(o)] for a, o in self.trace]])
        return hashlib.sha256(payload.encode()).hexdigest()

    def as_text(self) -> str:
        """The experience as plain text, for text-context methods (e.g. OPSD with retrieved episodes)."""
        steps = "\n".join(f"> {action}\n{obs}" for action, obs in self.trace)
        return f"Task: {self.instruction}\n{steps}"


def _short(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= MAX_OBSERVATION_CHARS else text[: MAX_OBSERVATION_CHARS - 3] + "..."


def trace_from_episode(episode: Episode) -> Experience:
    """Compact an episode into an `Experience` (keeps every action, shortens each observation)."""
    task = episode.task
    return Experience(
        env_id=task.env_id,
        task_id=task.id,
        instruction=task.instruction,
        trace=[(turn.action, _short(turn.observation)) for turn in episode.turns],
        score=float(episode.score),
        metadata={"success": bool(episode.success), "num_turns": episode.num_turns},
    )
