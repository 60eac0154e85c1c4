"""The policy protocol: everything an algorithm or the rollout engine needs from a language model.

Two operations. `generate` samples continuations and returns the *behaviour* log-probs of the sampled
tokens (importance ratios and on-policy checks need them), taken in the distribution the tokens were
sampled from, ``log_softmax(logits / T)``; a backend says which temperature T that was through an optional
``logprob_temperature(params)`` (absent: 1), and the rollout engine records it on the batch. `score` re-reads given continuations under
given contexts and returns per-token log-probs, optionally the top-M alternatives and the mass outside
them (the "tail bucket" of top-M distillation losses). `score` is also the teacher's whole interface: an
in-process HF teacher and a served vLLM teacher implement the same contract (see `Policy.score`), so a
distillation method never knows which one it talks to. Keeping the contract this small is what lets HF,
vLLM or a future backend be swapped under the same trainer.

A backend may also offer `session()` (see `DecodeSession`): generation that keeps each row's KV cache
between calls, so a multi-turn rollout appends the observation and the next turn instead of re-encoding
the history. The rollout engine uses it where present and falls back to `generate` (whose prefix cache,
for vLLM, serves the same purpose).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, ContextManager, Literal, Protocol, Sequence, runtime_checkable

import torch

from agentgym_opd.losses import tail_logprob  # noqa: F401 - one definition, re-exported for backends


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
        *,
        support_ids: Sequence[torch.Tensor] | None = None,
    ) -> list[TokenScores]:
        """Score each continuation under its context: the teacher's contract, for every backend.

        Inputs: ``contexts[i]`` and ``continuations[i]`` are token ids (``contexts[i]`` non-empty). The ids
        are scored exactly as given, never decoded or re-tokenised, so a teacher sees the student's very
        sampled tokens.

        Returns one :class:`TokenScores` per row, for the ``T_i = len(continuations[i])`` positions, each
        position t meaning "the distribution of ``continuations[i][t]`` given ``contexts[i] +
        continuations[i][:t]``", at temperature 1 (the raw model distribution: no temperature, top-k or
        top-p filter, whatever the sampler used):

        - ``logprobs [T_i]`` float32: log-prob of the given token at each position;
        - ``top_m > 0``: ``top_ids [T_i, M]`` (long) and ``top_logprobs [T_i, M]`` (float32, descending),
          the model's own M most likely tokens, and ``tail_logprob [T_i]`` = ``log(1 - sum exp(top_logprobs))``
          computed stably as in :func:`agentgym_opd.losses.tail_logprob` (finite even when the M tokens
          hold all the mass);
        - ``support_ids`` given (one ``[T_i, M]`` long tensor per row, e.g. the student's top-M ids, the
          support SDPO uses): ``top_ids`` are exactly those ids (same order), ``top_logprobs`` the model's
          log-probs at them and ``tail_logprob`` the mass outside them; ``top_m`` is then ignored. A
          backend that cannot score arbitrary ids (a server returning only its own top-k) raises
          ``NotImplementedError`` saying to use the teacher's support (``algo.top_m_support=teacher``);
        - ``top_m == 0`` and no ``support_ids``: ``logprobs`` only (the other fields None).

        Memory: a backend never holds ``[T, V]`` logits for a whole sequence; the HF backend runs the body
        once and the final norm + ``lm_head`` + log-softmax + top-k in chunks of positions, discarding each
        chunk's vocabulary-sized tensors. ``grad=True`` (in-process backends only) makes the returned
        tensors differentiable with respect to the policy's parameters; a served backend raises
        ``NotImplementedError``. Results may live on the policy's device.

        Agreement between backends (the served-teacher test): ``logprobs``, ``top_logprobs`` and
        ``tail_logprob`` within 1e-4 of the HF backend's in float32; ``top_ids`` equal except where
        log-probs tie within that tolerance.
        """
        ...

    def adapter_disabled(self) -> ContextManager[None]: ...


class DecodeSession(Protocol):
    """Generation that keeps each row's KV cache between calls (a multi-turn rollout's fast path).

    A session holds rows identified by caller keys. ``generate(keys, sequences, params, seeds)`` is
    `Policy.generate` where ``sequences[i]`` is the row's *whole* token sequence so far: the session
    checks that it extends what the row already holds (the previous sequence plus what was sampled for
    it) and feeds only the new ids; a key it has not seen starts a new row. ``release(keys)`` frees rows
    whose episodes ended. The tokens and log-probs are exactly those `generate` would return for the same
    sequences and seeds.
    """

    def generate(self, keys: Sequence[int], sequences: Sequence[Sequence[int]], params: SamplingParams,
                 seeds: Sequence[int | None] | None = None) -> list[Generation]: ...

    def release(self, keys: Sequence[int]) -> None: ...


def null_context() -> ContextManager[None]:
    return contextlib.nullcontext()
