"""The policy protocol: everything an algorithm or the rollout engine needs from a language model.

Two operations only. `generate` samples continuations and returns the *behaviour* log-probs of the
sampled tokens (importance ratios and on-policy checks need them). `score` re-reads given continuations
under given contexts and returns per-token log-probs, optionally the top-M alternatives and the mass
outside them (the "tail bucket" of top-M distillation losses). Keeping the contract this small is what
lets HF, vLLM or a future backend be swapped under the same trainer.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, ContextManager, Literal, Protocol, Sequence, runtime_checkable

import torch


@dataclass
class SamplingParams:
    """How to sample. `temperature=0` means greedy. `top_k=0` and `top_p=1` disable those filters."""

    max_new_tokens: int = 64
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    stop: list[str] = field(default_factory=list)
    seed: int | None = None

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")


@dataclass
class Generation:
    """One sampled continuation: decoded text, its token ids and one behaviour log-prob per token.

    `finish_reason` is "stop" when an EOS/end-of-turn token or a stop string ended it, "length" when it
    hit `max_new_tokens`. The ids include the terminating end-of-turn token when one was sampled, since
    that token was sampled by the policy and carries loss like any other.
    """

    text: str
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: Literal["stop", "length"]


@dataclass
class TokenScores:
    """Per-token scores of one continuation (T tokens).

    `tail_logprob` is log(1 - sum(top-M probs)), computed as log(-expm1(logsumexp(top_logprobs))) so it
    stays finite and accurate when the top-M mass is close to 1.
    """

    logprobs: torch.Tensor
    top_ids: torch.Tensor | None = None
    top_logprobs: torch.Tensor | None = None
    tail_logprob: torch.Tensor | None = None


def tail_logprob(top_logprobs: torch.Tensor) -> torch.Tensor:
    """Log of the probability mass outside the top-M entries (last dim), clamped away from log(0)."""
    top_mass_log = torch.logsumexp(top_logprobs, dim=-1).clamp(max=-1e-7)
    return torch.log(-torch.expm1(top_mass_log))


@runtime_checkable
class Policy(Protocol):
    tokenizer: Any

    def apply_chat_template(self, messages: list[dict[str, str]], add_generation_prompt: bool = True) -> list[int]: ...

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]: ...

    def score(
        self,
        contexts: Sequence[Sequence[int]],
        continuations: Sequence[Sequence[int]],
        top_m: int = 0,
        grad: bool = False,
    ) -> list[TokenScores]: ...

    def adapter_disabled(self) -> ContextManager[None]: ...


def null_context() -> ContextManager[None]:
    return contextlib.nullcontext()
