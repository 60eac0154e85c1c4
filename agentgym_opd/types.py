"""Typed records shared by environments, rollouts, algorithms and evaluation.

Plain dataclasses, so that a trajectory can be built, inspected, pickled and written to JSON without
any model or environment in scope. The token view of an episode (ids, loss mask, turn index) lives on
`Episode` because every on-policy method needs exactly that: the student's own tokens, masked so that
only agent-generated tokens carry loss, with the turn each token belongs to (turn-level methods such as
SAGE-OPD weight whole turns).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

ErrorKind = Literal["invalid_action", "parse_error", "tool_error", "runtime_error", "timeout", "env_crash"]
ERROR_KINDS: tuple[str, ...] = get_args(ErrorKind)


@dataclass(frozen=True)
class Task:
    """One problem instance of an environment split.

    `privileged` holds what a self-teacher may see and the student never does. Keys, where the benchmark
    has them: `walkthrough` (list of expert actions, one per turn), `answer` (gold answer string or list
    of accepted strings), `solution` (reference code or gold call sequence as text), `evidence`
    (supporting passages).
    """

    id: str
    env_id: str
    split: str
    instruction: str
    privileged: dict[str, Any] = field(default_factory=dict)
    metadata: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Task":
        return cls(**data)


@dataclass(frozen=True)
class StepError:
    """The execution-error signal of one step: a closed `kind` and a `message` fit to show a model."""

    kind: ErrorKind
    message: str

    def __post_init__(self) -> None:
        if self.kind not in ERROR_KINDS:
            raise ValueError(f"unknown StepError kind {self.kind!r}; expected one of {', '.join(ERROR_KINDS)}")

    def __str__(self) -> str:
        return f"[{self.kind}] {self.message}"

    def to_dict(self) -> dict[str, str]:
        return {"kind": self.kind, "message": self.message}


@dataclass
class Turn:
    """One agent action and the environment's answer to it.

    `prompt` is the text (or a reference to it) the policy saw when it produced `action`; `action_token_ids`
    and `logprobs` are the sampled tokens and their behaviour log-probabilities (empty for scripted or human
    actions).
    """

    action: str
    observation: str
    reward: float = 0.0
    error: StepError | None = None
    feedback: str = ""
    terminated: bool = False
    truncated: bool = False
    prompt: str | list[dict[str, str]] | None = None
    action_token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def done(self) -> bool:
        return self.terminated or self.truncated


@dataclass
class Episode:
    """A whole interaction: the task, the first observation, and every turn.

    The token view (`input_ids`, `loss_mask`, `turn_index`) is filled by the rollout engine, which knows
    the tokenizer and chat template; it stays empty for episodes played without a model.
    """

    task: Task
    initial_observation: str
    turns: list[Turn] = field(default_factory=list)
    success: bool = False
    score: float = 0.0
    feedback: str = ""
    input_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    turn_index: list[int] = field(default_factory=list)
    # the chat messages of the first prompt and its token count: where the agent's tokens start, so a
    # teacher can re-render the prompt with extra context and re-score the very same tokens after it
    first_prompt: list[dict[str, str]] = field(default_factory=list)
    prompt_length: int | None = None
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def return_(self) -> float:
        return float(sum(t.reward for t in self.turns))

    @property
    def num_turns(self) -> int:
        return len(self.turns)

    @property
    def done(self) -> bool:
        return bool(self.turns) and self.turns[-1].done

    def errors(self) -> list[StepError]:
        return [t.error for t in self.turns if t.error is not None]

    def add(self, turn: Turn) -> None:
        """Append a turn and keep `success`/`score`/`feedback` in step with the env's latest info."""
        self.turns.append(turn)
        info = turn.info
        self.success = bool(info.get("success", self.success))
        self.score = float(info.get("score", self.score))
        if turn.feedback:
            self.feedback = turn.feedback

    def messages(self, system: str | None = None) -> list[dict[str, str]]:
        """Chat view: the task and each observation as `user`, each action as `assistant`."""
        msgs: list[dict[str, str]] = []
        if system:
            msgs.append({"role": "system", "content": system})
        msgs.append({"role": "user", "content": self.initial_observation})
        for turn in self.turns:
            msgs.append({"role": "assistant", "content": turn.action})
            if not turn.done:
                msgs.append({"role": "user", "content": turn.observation})
        return msgs

    def token_view(self) -> dict[str, list[int]]:
        """Token view for losses: ids, a mask that is 1 on agent-generated tokens only, and the turn index."""
        if not (len(self.input_ids) == len(self.loss_mask) == len(self.turn_index)):
            raise ValueError(
                "episode token view is inconsistent: input_ids, loss_mask and turn_index differ in length "
                f"({len(self.input_ids)}, {len(self.loss_mask)}, {len(self.turn_index)})"
            )
        return {"input_ids": self.input_ids, "loss_mask": self.loss_mask, "turn_index": self.turn_index}
