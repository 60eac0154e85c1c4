"""ALFWorld behind the `TextEnv` contract, loading each game through TextWorld directly.

Why TextWorld directly: ALFWorld's `AlfredTWEnv` wants its YAML config, a `traj_data.json` beside every
game and a batch of games; a `game.tw-pddl` file alone (PDDL problem, grammar and expert walkthrough) is
all TextWorld needs. Each game is registered with `textworld.gym.register_game` and made with
`textworld.gym.make`, wrapped in ALFWorld's own `AlfredDemangler` (readable object names such as
"apple 1") and `AlfredInfos`, and asked for `admissible_commands` and `won`. The game-independent logic
files `alfred.pddl` / `alfred.twl2` ship inside the alfworld wheel (`alfworld/data/`); `logic_files()`
names them for anyone regenerating games.

Task ids are the game folders relative to the split (`<task-type>-<objects>-<scene>/<trial>`), sorted.
`privileged["walkthrough"]` is the expert plan stored in the game file. "Nothing happens." (the engine's
answer to an action that does not apply) is an `invalid_action` error; output that is not one ALFWorld
command (several lines, no known verb) is a `parse_error` and never reaches the engine.

``demonstrations=PATH`` (a recorded-games file of `environments.alfworld.replay`, such as the one the ALFWorld
pair's build caches) adds each task's observable-expert actions as ``privileged["demonstration"]``: what SFT
clones where an env has one (`environments.alfworld.expert` searches from observations; the walkthrough does not).
"""

from __future__ import annotations

import ast
import json
import os
import re
from functools import lru_cache
from pathlib import Path

from agentgym_opd.core import StepOutcome, TextEnv, UnknownTaskError
from agentgym_opd.data import resolve_data_path
from agentgym_opd.types import StepError, Task
from environments.alfworld import SPLITS, TASK_TYPES

INSTALL_HINT = "pip install 'agentgym-opd[alfworld]'"
DOWNLOAD_HINT = "run `alfworld-download` (installed by pip install 'agentgym-opd[alfworld]') to fetch the games"
# the command verbs of ALFWorld's grammar (alfred.twl2 in the wheel); read from the file at first use
_FALLBACK_VERBS = ("go", "take", "put", "move", "open", "close", "clean", "heat", "cool", "use", "examine",
                   "look", "inventory", "slice", "help")
_TEMPLATE = re.compile(r'template :: "([a-z]+)')
_TASK_LINE = re.compile(r"Your task is to:\s*(.+)")
_PREFIX = re.compile(r"^(?:action\s*:|>)\s*", re.IGNORECASE)


def _import_textworld():
    try:
        import textworld
        import textworld.gym
        from alfworld.agents.environment.alfred_tw_env import AlfredDemangler, AlfredInfos
    except ImportError as exc:
        raise ImportError(f"ALFWorld is not installed: {INSTALL_HINT}") from exc
    from environments.alfworld import downward_pool, textworld_memo

    textworld_memo.install()  # TextWorld's PDDL translation and text parsing, memoised (why: that module)
    downward_pool.install()  # one process's fast-downward library copies, reused (why: that module)
    return textworld, AlfredDemangler, AlfredInfos


def logic_files() -> dict[str, Path]:
    """The ALFWorld logic files shipped in the alfworld wheel (domain PDDL and TextWorld grammar)."""
    import importlib.util

    spec = importlib.util.find_spec("alfworld")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(f"ALFWorld is not installed: {INSTALL_HINT}")
    data = Path(list(spec.submodule_search_locations)[0]) / "data"
    return {"pddl": data / "alfred.pddl", "grammar": data / "alfred.twl2"}


def default_alfworld_dir(split: str) -> Path:
    """alfworld-download's location: $ALFWORLD_DATA, else ~/.cache/alfworld."""
    base = os.environ.get("ALFWORLD_DATA") or os.path.expanduser("~/.cache/alfworld")
    return Path(base) / "json_2.1.1" / split


@lru_cache(maxsize=1)
def command_verbs() -> tuple[str, ...]:
    """First words of the command templates in ALFWorld's grammar: anything else cannot be a command."""
    try:
        verbs = set(_TEMPLATE.findall(logic_files()["grammar"].read_text()))
    except (ImportError, OSError):
        verbs = set()
    return tuple(sorted(verbs or _FALLBACK_VERBS))


def normalise_command(action: str) -> str | None:
    """The ALFWorld command an agent's text names (prefix, case and a final full stop dropped), or None when it is
    not one command (several lines, no known verb). Shared with `replay.ReplayEnv`, which must answer alike."""
    command = _PREFIX.sub("", action).strip().rstrip(".").lower()
    if "\n" in command or command.split(" ", 1)[0] not in command_verbs():
        return None
    return command


def parse_error_outcome(action: str) -> StepOutcome:
    """What the env answers to text that is not one command: a `parse_error`; the engine never sees it."""
    return StepOutcome(
        "Nothing happens.",
        error=StepError(
            "parse_error",
            f"'{action[:200]}' is not one ALFWorld command. Answer with exactly one command on one line, "
            "e.g. 'go to countertop 1', 'take apple 1 from countertop 1', 'open fridge 1', 'look'.",
        ),
    )


@lru_cache(maxsize=4)
def _recorded_demonstrations(path: str) -> dict[str, tuple[str, ...]]:
    """task id -> the observable expert's actions, from a recorded-games file (one JSON game per line)."""
    if not Path(path).is_file():
        raise FileNotFoundError(f"demonstrations={path!r}: no such recorded-games file (the ALFWorld pair's build "
                                "records one: evaluation.bench.alfworld_pair.recorded_train_games)")
    out = {}
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            if line.strip():
                game = json.loads(line)
                out[game["task_id"]] = tuple(game["privileged"].get("demonstration") or ())
    return out


@lru_cache(maxsize=8)
def _list_games(split_dir: str) -> tuple[str, ...]:
    root = Path(split_dir)
    return tuple(sorted(str(p.parent.relative_to(root)) for p in root.glob("*/*/game.tw-pddl")))


class AlfWorldEnv(TextEnv):
    """ALFWorld games of one split, optionally restricted to some task types."""

    description = "ALFWorld household tasks (TextWorld engine)"

    def __init__(
        self,
        split: str = "valid_unseen",
        *,
        task_types: tuple[str, ...] | list[str] | None = None,
        data_root: str | os.PathLike | None = None,
        max_turns: int = 50,
        env_id: str | None = None,
        demonstrations: str | os.PathLike | None = None,
        **kwargs,
    ):
        if split not in SPLITS:
            raise ValueError(f"split must be one of {', '.join(SPLITS)}, got {split!r}")
        super().__init__(split, max_turns=max_turns, env_id=env_id or f"alfworld/{split}", **kwargs)
        self._tw, self._demangler, self._infos_wrapper = _import_textworld()
        self.split_dir = resolve_data_path(
            f"alfworld/json_2.1.1/{split}", data_root=data_root, fallback=default_alfworld_dir(split),
            how_to_get=DOWNLOAD_HINT,
        )
        unknown = [t for t in (task_types or ()) if t not in TASK_TYPES and t not in TASK_TYPES.values()]
        if unknown:
            raise ValueError(f"unknown ALFWorld task types {unknown}; known: {', '.join(TASK_TYPES)}")
        self.task_types = tuple(TASK_TYPES.get(t, t) for t in task_types) if task_types else None
        # recorded games (`environments.alfworld.replay`, e.g. the ALFWorld pair's cache) whose observable expert's
        # actions become each task's privileged["demonstration"]: what SFT clones where the env has one
        self.demonstrations = _recorded_demonstrations(str(demonstrations)) if demonstrations else {}
        self._request_infos = self._tw.EnvInfos(won=True, admissible_commands=True, extras=["gamefile"])
        self._tw_env = None
        self._tw_game: str | None = None
        self._admissible: list[str] = []
        self._won = False

    # ------------------------------------------------------------------ tasks
    def task_ids(self) -> list[str]:
        games = _list_games(str(self.split_dir))
        if self.task_types:
            games = tuple(g for g in games if g.split("-", 1)[0] in self.task_types)
        return list(games)

    def get_task(self, task_id: str) -> Task:
        path = self.split_dir / task_id / "game.tw-pddl"
        if task_id not in set(self.task_ids()) or not path.is_file():
            raise UnknownTaskError(task_id, self.task_ids())
        with open(path) as f:
            game = json.load(f)
        walkthrough = game.get("walkthrough", [])
        demonstration = self.demonstrations.get(task_id)
        if isinstance(walkthrough, str):  # stored as the repr of a Python list
            walkthrough = ast.literal_eval(walkthrough)
        task_type = task_id.split("-", 1)[0]
        return Task(
            id=task_id,
            env_id=self.env_id,
            split=self.split,
            instruction="",  # filled from the intro text at reset; the game file has no plain-text goal
            privileged={"walkthrough": list(walkthrough), **({"demonstration": list(demonstration)} if demonstration else {})},
            metadata={"task_type": task_type, "gamefile": str(path), "solvable": str(game.get("solvable"))},
        )

    # ------------------------------------------------------------------ episode
    def _make_game_env(self, gamefile: str):
        if self._tw_game == gamefile and self._tw_env is not None:
            return self._tw_env
        self._close_game()
        env_id = self._tw.gym.register_game(
            gamefile, request_infos=self._request_infos, max_episode_steps=self.max_turns + 1,
            wrappers=[self._demangler, self._infos_wrapper],
        )
        self._tw_env, self._tw_game = self._tw.gym.make(env_id), gamefile
        return self._tw_env

    def _start(self, task: Task) -> str:
        env = self._make_game_env(task.metadata["gamefile"])
        obs, infos = env.reset()
        self._absorb(infos)
        match = _TASK_LINE.search(obs)
        if match:  # Task is frozen: rebuild it with the goal sentence the game announces
            self.task = Task(task.id, task.env_id, task.split, match.group(1).strip(), task.privileged, task.metadata)
        return obs

    def reset(self, *, seed=None, options=None):
        obs, info = super().reset(seed=seed, options=options)
        info["task"] = self.task  # the Task with the goal sentence `_start` read from the intro
        return obs, info

    def _absorb(self, infos: dict) -> None:
        self._admissible = list(infos.get("admissible_commands") or [])
        self._won = bool(infos.get("won"))

    def _act(self, action: str) -> StepOutcome:
        command = normalise_command(action)
        if command is None:
            return parse_error_outcome(action)
        obs, score, done, infos = self._tw_env.step(command)
        self._absorb(infos)
        error = None
        if obs.strip() == "Nothing happens.":
            error = StepError(
                "invalid_action",
                f"'{command}' is not possible here. Admissible commands now: " + ", ".join(self._admissible[:40]),
            )
        # ALFWorld has no losing state: the episode ends on success, or at the turn limit (the base class)
        return StepOutcome(obs, reward=1.0 if self._won else 0.0, terminated=self._won, error=error)

    def admissible_actions(self) -> list[str] | None:
        return list(self._admissible)

    def progress(self) -> tuple[bool, float]:
        return self._won, 1.0 if self._won else 0.0

    def _close_game(self) -> None:
        env, self._tw_env, self._tw_game = self._tw_env, None, None
        if env is not None:
            env.close()

    def close(self) -> None:
        if getattr(self, "_tw_env", None) is not None:
            self._close_game()
