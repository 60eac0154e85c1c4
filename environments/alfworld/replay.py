"""Recorded ALFWorld games, replayed without TextWorld: what building training data from 300 games can afford.

Loading an ALFWorld game costs 1-2 s (TextWorld compiles it) and a step 0.1 s, so playing every train game
once per context kind, per mistake variant and per model of a pair would spend most of a build in the engine.
A game is deterministic, so each game is played once in the real env along each action sequence the data
needs (the observable expert's, the walkthrough), and `ReplayEnv` answers from the record:

* an action the record has in this state: the recorded observation, reward and end;
* a command the state does not admit (the record keeps the admissible list of every state it passed): ALFWorld's
  own answer, "Nothing happens.", as an `invalid_action` error, the state unchanged (the engine never changes
  state on a rejected command, `tests/test_alfworld_pair.py` checks it against TextWorld);
* output that is not one command: the same `parse_error` `AlfWorldEnv` gives;
* an admissible command the record never took: a `ReplayMiss` (the record cannot know its outcome: play it
  in the real env first).

So a `RolloutEngine` over a `ReplayEnv` makes token for token the batch it makes over `AlfWorldEnv` (tested),
at the cost of tokenising.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable

from agentgym_opd.core import StepOutcome, TextEnv, UnknownTaskError
from agentgym_opd.types import StepError, Task


class ReplayMiss(KeyError):
    """An admissible command the record never took: its outcome is unknown without the real game."""

    def __str__(self) -> str:
        return str(self.args[0])


@dataclass
class RecordedStep:
    observation: str
    won: bool
    admissible: list[str]  # of the state this step leads to


@dataclass
class RecordedGame:
    """One game's start and the outcome of every action sequence played on it (a tree keyed by the path)."""

    task_id: str
    env_id: str
    split: str
    instruction: str
    privileged: dict[str, Any]
    metadata: dict[str, str]
    first_observation: str
    first_admissible: list[str]
    steps: dict[str, RecordedStep] = field(default_factory=dict)  # "\n".join(accepted actions so far) -> outcome

    def task(self) -> Task:
        return Task(self.task_id, self.env_id, self.split, self.instruction, dict(self.privileged), dict(self.metadata))

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "RecordedGame":
        steps = {k: RecordedStep(**v) for k, v in data.pop("steps").items()}
        return cls(**data, steps=steps)


def path_key(actions: Iterable[str]) -> str:
    return "\n".join(actions)


class RecordingEnv:
    """A real ALFWorld env that records every accepted step into `games` as it is played (anything that plays an
    env, such as the observable expert's `play`, records through it)."""

    def __init__(self, env: Any, games: dict[str, RecordedGame] | None = None,
                 extra_privileged: dict[str, dict[str, Any]] | None = None):
        self.env, self.games = env, games if games is not None else {}
        self.extra_privileged = extra_privileged or {}
        self.max_turns = env.max_turns
        self._game: RecordedGame | None = None
        self._path: list[str] = []

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        obs, info = self.env.reset(seed=seed, options=options)
        task = info["task"]
        if task.id not in self.games:
            privileged = {**task.privileged, **self.extra_privileged.get(task.id, {})}
            self.games[task.id] = RecordedGame(task.id, task.env_id, task.split, task.instruction, privileged,
                                               dict(task.metadata), obs, list(info["admissible_actions"] or []))
        self._game, self._path = self.games[task.id], []
        return obs, info

    def step(self, action: str):
        obs, reward, terminated, truncated, info = self.env.step(action)
        if info["error"] is None and self._game is not None:
            from environments.alfworld.env import normalise_command

            self._path.append(normalise_command(action) or action)
            self._game.steps.setdefault(path_key(self._path), RecordedStep(
                obs, bool(info["success"]), list(info["admissible_actions"] or [])))
        return obs, reward, terminated, truncated, info


def record_game(env: Any, task_id: str, sequences: Iterable[list[str]], *,
                games: dict[str, RecordedGame] | None = None) -> RecordedGame:
    """Play each action sequence on ``env`` (an `AlfWorldEnv`) from the start of ``task_id`` and record the
    outcomes (into ``games`` when given). A sequence stops at its first rejected command or its episode's end."""
    recorder = RecordingEnv(env, games)
    played = False
    for actions in sequences:
        recorder.reset(options={"task_id": task_id})
        played = True
        for action in actions:
            _, _, terminated, truncated, step = recorder.step(action)
            if step["error"] is not None or terminated or truncated:
                break
    if not played:
        raise ValueError(f"record_game({task_id!r}) needs at least one action sequence")
    return recorder.games[task_id]


def save_games(games: Iterable[RecordedGame], path: Path) -> None:
    """One JSON line per game, written to a temporary file and renamed (a killed writer leaves no half file)."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        for game in games:
            fh.write(json.dumps(game.to_json()) + "\n")
    tmp.replace(path)


def load_games(path: Path) -> list[RecordedGame]:
    with open(path, encoding="utf-8") as fh:
        return [RecordedGame.from_json(json.loads(line)) for line in fh if line.strip()]


class ReplayEnv(TextEnv):
    """ALFWorld games answered from their records (see the module docstring); `AlfWorldEnv`'s protocol."""

    description = "recorded ALFWorld games (no TextWorld)"

    def __init__(self, games: Iterable[RecordedGame], *, max_turns: int = 50, env_id: str = "alfworld/train", **kwargs):
        self.games = {g.task_id: g for g in games}
        split = next(iter(self.games.values())).split if self.games else "train"
        super().__init__(split, max_turns=max_turns, env_id=env_id, **kwargs)
        self._game: RecordedGame | None = None
        self._path: list[str] = []
        self._admissible: list[str] = []
        self._won = False

    def task_ids(self) -> list[str]:
        return sorted(self.games)

    def get_task(self, task_id: str) -> Task:
        if task_id not in self.games:
            raise UnknownTaskError(task_id, self.task_ids())
        return self.games[task_id].task()

    def _start(self, task: Task) -> str:
        self._game = self.games[task.id]
        self._path, self._won = [], False
        self._admissible = list(self._game.first_admissible)
        return self._game.first_observation

    def _act(self, action: str) -> StepOutcome:
        from environments.alfworld.env import normalise_command, parse_error_outcome

        command = normalise_command(action)
        if command is None:
            return parse_error_outcome(action)
        recorded = self._game.steps.get(path_key([*self._path, command])) if self._game else None
        if recorded is None:
            if command in self._admissible:
                raise ReplayMiss(f"{self._game.task_id if self._game else '?'}: the record has no outcome for the "
                                 f"admissible command {command!r} after {self._path}; play it in AlfWorldEnv first")
            error = StepError("invalid_action", f"'{command}' is not possible here. Admissible commands now: "
                              + ", ".join(self._admissible[:40]))
            return StepOutcome("Nothing happens.", reward=0.0, terminated=False, error=error)
        self._path.append(command)
        self._admissible = list(recorded.admissible)
        self._won = recorded.won
        return StepOutcome(recorded.observation, reward=1.0 if self._won else 0.0, terminated=self._won)

    def admissible_actions(self) -> list[str] | None:
        return list(self._admissible)

    def progress(self) -> tuple[bool, float]:
        return self._won, 1.0 if self._won else 0.0
