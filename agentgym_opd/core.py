"""`TextEnv`: the one environment contract every benchmark family implements.

A `TextEnv` is a `gymnasium.Env` whose observations and actions are text. One `step` is one agent turn,
so the step boundary *is* the turn boundary that turn-level methods (SAGE-OPD) segment on. The base
class owns everything that must be identical across benchmarks, so that a subclass only writes its
world logic:

* the `info` keys (`turn`, `error`, `feedback`, `success`, `score`, `admissible_actions`, and `task` at
  reset), present on every step;
* the generic checks of agent output (empty, over-long, not text) that become `parse_error`s instead of
  exceptions, so bad model output never crashes a rollout;
* the turn limit (`truncated`), the episode-end feedback, and the misuse errors for the caller (step
  before reset or after the episode ended, an unknown task id), which *do* raise.
* observations inside `observation_space` and gymnasium's types for reward and flags: repaired per step
  for envs whose text the project does not control, guaranteed by the env itself (`valid_outcomes`) for
  the embedded worlds, whose steps take microseconds and would pay for the repair in throughput.

Subclasses implement `task_ids`, `get_task`, `_start`, `_act` and, where they know them,
`admissible_actions`, `progress` and `episode_feedback`.
"""

from __future__ import annotations

import difflib
import re
import string
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
from gymnasium import spaces

from agentgym_opd.types import StepError, Task

# Printable ASCII, whitespace, Latin-1/Latin Extended letters and common typographic punctuation: wide
# enough for benchmark text (names with accents, curly quotes), narrow enough to be a real `spaces.Text`.
TEXT_CHARSET = (
    string.printable
    + "".join(chr(c) for c in range(0x00A0, 0x0250))
    + "".join(chr(c) for c in range(0x2010, 0x2028))
)
MAX_TEXT_CHARS = 65536
_OUTSIDE_CHARSET = re.compile("[^\t\n\x0b\x0c\r\x20-\x7e\u00a0-\u024f\u2010-\u2027]")

# A `bytes.translate` table that maps the ASCII control characters outside the charset to '?' and every
# other byte to itself. WHY: CPython's `bytes.translate` returns its input object itself when no byte
# changed, so `b.translate(_MARK_ASCII_CONTROLS) is b` tests "no control characters" in one C loop with no
# per-call table build: ~2.5x faster than `str.isprintable` (a Unicode-database lookup per character) or a
# regex scan. Where an interpreter returns a copy instead, the test fails and the exact regex path runs.
_MARK_ASCII_CONTROLS = bytes(c if 0x09 <= c <= 0x0D or 0x20 <= c <= 0x7E else ord("?") for c in range(256))
_NOT_TEXT = re.compile("[\x00-\x08\x0e-\x1f\x7f\ud800-\udfff]")

# How many accepted action texts an env remembers (see `TextEnv.step`): enough for every command of the
# worlds with admissible lists, small enough not to matter beside a vector of envs (~0.3 MB each when full).
ACCEPTED_ACTIONS_MAX = 4096


class EnvMisuseError(RuntimeError):
    """The caller used the env out of order (step before reset, step after the episode ended)."""


class ActionTypeError(EnvMisuseError, TypeError):
    """`step` was given something that is not text: a caller bug (a TypeError, and misuse for the steppers)."""


class UnknownTaskError(KeyError):
    """A task id that the split does not have; the message lists the closest ids."""

    def __init__(self, task_id: str, known: list[str]):
        close = difflib.get_close_matches(str(task_id), known, n=5, cutoff=0.5)
        hint = f" Close matches: {', '.join(close)}." if close else ""
        super().__init__(
            f"unknown task id {task_id!r} ({len(known)} tasks in this split; env.task_ids() lists them).{hint}"
        )

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0])


def fit_to_charset(text: str, max_chars: int = MAX_TEXT_CHARS) -> str:
    """Make `text` a member of the observation space: unknown characters become '?', length is capped."""
    if len(text) <= max_chars and text.isascii():
        ascii_bytes = text.encode()  # ASCII text: its UTF-8 bytes, the fastest encode path
        if ascii_bytes.translate(_MARK_ASCII_CONTROLS) is ascii_bytes:
            return text  # the common case, decided in C (see _MARK_ASCII_CONTROLS)
    if _OUTSIDE_CHARSET.search(text):
        text = _OUTSIDE_CHARSET.sub("?", text)
    if len(text) > max_chars:
        marker = "\n[... truncated]"
        text = text[: max_chars - len(marker)] + marker
    return text


@dataclass(slots=True)
class StepOutcome:
    """What a subclass's `_act` returns for one turn; the base class turns it into gymnasium's 5-tuple
    (fitting the observation and converting the reward and flag, unless the env sets `valid_outcomes`)."""

    observation: str
    reward: float = 0.0
    terminated: bool = False
    error: StepError | None = None
    feedback: str = ""


def _validated(outcome: StepOutcome) -> StepOutcome:
    """`outcome` made a valid gymnasium value, for envs that do not guarantee it (`TextEnv.valid_outcomes`)."""
    return StepOutcome(fit_to_charset(outcome.observation), float(outcome.reward), bool(outcome.terminated),
                       outcome.error, outcome.feedback)


class TextEnv(gym.Env[str, str]):
    """Base class of all agentgym-opd environments (see the module docstring for the contract)."""

    metadata = {"render_modes": ["ansi", "human"]}
    description = "a text environment"
    # True where the env's own code guarantees that what `_start` and `_act` return is already a valid
    # gymnasium value: every observation a member of `observation_space` (all text built from the env's own
    # vocabulary, anything echoed from the agent escaped), every reward a float, every `terminated` a bool.
    # The base class then passes outcomes through as they are; otherwise it fits each observation with
    # `fit_to_charset` and converts the reward and flag, which is right for wrapped benchmarks whose text
    # and types it does not control. tests/test_env_text_guarantee.py holds every env that sets it to it.
    valid_outcomes = False

    def __init__(
        self,
        split: str = "train",
        *,
        max_turns: int = 30,
        max_action_chars: int = 4096,
        env_id: str | None = None,
        render_mode: str | None = None,
    ):
        if max_turns < 1:
            raise ValueError(f"max_turns must be at least 1, got {max_turns}")
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(f"render_mode must be one of {self.metadata['render_modes']}, got {render_mode!r}")
        self.split = split
        self.max_turns = max_turns
        self.max_action_chars = max_action_chars
        self.env_id = env_id or f"{type(self).__name__}/{split}"
        self.render_mode = render_mode
        self.observation_space = spaces.Text(max_length=MAX_TEXT_CHARS, min_length=0, charset=TEXT_CHARSET)
        self.action_space = spaces.Text(max_length=max_action_chars, min_length=1, charset=TEXT_CHARSET)
        self.task: Task | None = None
        self.turn = 0
        self.done = True  # no episode in progress until reset()
        self.last_observation = ""
        self.error_log: list[StepError] = []
        # Action texts this env has already checked and found plain (see `step`); valid for the env's life,
        # because the checks depend only on the text and `max_action_chars`.
        self._accepted_actions: set[str] = set()
        self.valid_outcomes = self.valid_outcomes  # an instance attribute: a faster read on the hot path

    # ----------------------------------------------------------------- subclass hooks
    def task_ids(self) -> list[str]:
        """The split's task ids in a stable order (evaluation iterates over it)."""
        raise NotImplementedError

    def get_task(self, task_id: str) -> Task:
        """The `Task` with this id; raise `UnknownTaskError` for an id the split lacks."""
        raise NotImplementedError

    def _start(self, task: Task) -> str:
        """Set up the world for `task` and return the first observation."""
        raise NotImplementedError

    def _act(self, action: str) -> StepOutcome:
        """Apply one agent action (already checked to be non-empty text of bounded length)."""
        raise NotImplementedError

    def admissible_actions(self) -> list[str] | None:
        """The actions valid in the current state, or None where the env cannot enumerate them."""
        return None

    def progress(self) -> tuple[bool, float]:
        """(success, score) of the episode so far; score in the benchmark's own units."""
        return False, 0.0

    def episode_feedback(self) -> str:
        """Textual diagnostics shown when the episode ends (what went wrong), for feedback-driven methods."""
        success, _ = self.progress()
        if success:
            return f"Task completed in {self.turn} turns."
        lines = ["Task not completed" + (" within the turn limit." if self.turn >= self.max_turns else ".")]
        if self.error_log:
            lines.append(f"{len(self.error_log)} of {self.turn} actions failed; the last error: {self.error_log[-1]}")
        return " ".join(lines)

    # ----------------------------------------------------------------- gymnasium API
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        options = options or {}
        if "task_id" in options:
            task = self.get_task(options["task_id"])
        else:
            ids = self.task_ids()
            if not ids:
                raise RuntimeError(f"{self.env_id}: the split {self.split!r} has no tasks")
            task = self.get_task(ids[int(self.np_random.integers(len(ids)))])
        self.task = task
        self.turn = 0
        self.done = False
        self.error_log = []
        obs = self._start(task)
        if not self.valid_outcomes:
            obs = fit_to_charset(obs)
        self.last_observation = obs
        success, score = self.progress()
        info = {
            "task": task,
            "turn": 0,
            "error": None,
            "feedback": "",
            "success": success,
            "score": score,
            "admissible_actions": self.admissible_actions(),
        }
        return obs, info

    def step(self, action: str):
        # The hot path, kept short because every rollout turn of every env runs it (benchmarks/bench_envs.py
        # measures its cost against the raw world logic). An action text this env has accepted before skips
        # the text checks (one set lookup instead of `_check_action`'s scans of the text), and agents repeat
        # their commands: the same "go to cabinet 1" in every episode of a task, in every sibling of a GRPO
        # group. Anything else, misuse included, goes through `_check_action`. Envs that guarantee their own
        # outcomes (`valid_outcomes`) skip the per-step repair of the observation, reward and flag.
        try:
            known = action in self._accepted_actions and not self.done
        except TypeError:  # an unhashable action, e.g. a list: not text
            known = False
        if known:
            error = None
        else:
            error, action = self._check_action(action)  # raises on misuse; odd text becomes a parse error
        turn = self.turn = self.turn + 1
        if error is None:
            outcome = self._act(action)
            if not self.valid_outcomes:
                outcome = _validated(outcome)
            error = outcome.error
        else:
            outcome = StepOutcome(fit_to_charset(self._error_observation(error)), error=error)
        if error is not None:
            self.error_log.append(error)
        terminated = outcome.terminated
        done = self.done = terminated or turn >= self.max_turns
        success, score = self.progress()
        feedback = outcome.feedback
        if done and not feedback:
            feedback = self.episode_feedback()
        obs = self.last_observation = outcome.observation
        info = {
            "turn": turn,
            "error": error,
            "feedback": feedback,
            "success": success,
            "score": score,
            "admissible_actions": None if done else self.admissible_actions(),
        }
        if self.render_mode == "human":
            print(obs)
        return obs, outcome.reward, terminated, done and not terminated, info

    def render(self):
        if self.render_mode == "ansi":
            return self.last_observation
        if self.render_mode == "human":
            print(self.last_observation)
        return None

    # ----------------------------------------------------------------- helpers
    def _check_action(self, action: Any) -> tuple[StepError | None, str]:
        """What `step` does with an action it has not accepted before: misuse raises, odd text becomes a parse
        error; returns (the error or None, the text stripped). Plain text that needs no stripping is
        remembered, so the next step with the same text skips these checks."""
        if self.task is None:
            raise EnvMisuseError(f"{self.env_id}: call reset() before step()")
        if self.done:
            raise EnvMisuseError(f"{self.env_id}: the episode is over (turn {self.turn}); call reset() to start a new one")
        if not isinstance(action, str):
            raise ActionTypeError(f"{self.env_id}: an action is a str, got {type(action).__name__}")
        stripped = action.strip()
        if len(action) > self.max_action_chars:
            return StepError(
                "parse_error",
                f"The action is {len(action)} characters long; the limit is {self.max_action_chars}. "
                "Answer with a single short action.",
            ), stripped
        if not stripped:
            return StepError("parse_error", "The action is empty. Answer with exactly one action."), stripped
        # isprintable() is False for every control character and lone surrogate, so it clears most text in one
        # C loop; the regex then decides the rest (newlines and tabs are allowed, other controls are not)
        if not action.isprintable() and _NOT_TEXT.search(action):
            return StepError(
                "parse_error",
                "The action contains control characters or invalid Unicode (not UTF-8 text). Answer in plain text.",
            ), stripped
        if stripped == action and type(action) is str:
            if len(self._accepted_actions) >= ACCEPTED_ACTIONS_MAX:
                self._accepted_actions.clear()  # a long run of one-off texts: start remembering afresh
            self._accepted_actions.add(action)
        return None, stripped

    def _error_observation(self, error: StepError) -> str:
        """Observation for an action the base class rejected; subclasses may add state (e.g. the admissible list)."""
        return error.message
