"""Shared, pure loss functions for every algorithm (GRPO, OPD, OPSD, SDPO, LOPD, SAGE-OPD, VPD).

Why one module: the difference between two algorithms should be which of these they call and on which
tokens, never a private re-implementation of a KL. Everything here is a pure torch function of tensors:
no model, no tokenizer, no config object.

Conventions used throughout
---------------------------
- Shapes: ``B`` sequences, ``T`` token positions (padded), ``V`` vocabulary, ``M`` kept top-M entries.
- ``mask`` is ``[B, T]``, bool or float. 1 (True) marks a token that carries loss (the agent's own
  tokens); a float mask is a per-token *weight* (SAGE-OPD's turn weights), so "masked mean" means
  ``sum(w * x) / sum(w)``. Positions with weight 0 never contribute, even when ``x`` there is NaN/inf
  (padding may hold garbage).
- "Teacher" inputs (teacher logits, reference log-probs, old log-probs) are detached inside every
  function: gradients reach only the student's tensors, whatever the caller passes.
- Logits or log-probs are both accepted where a distribution is expected: ``log_softmax`` of log-probs is
  the identity, so functions normalise internally. Logits must be finite (use a large negative number,
  not ``-inf``, to ban a vocabulary entry); the top-M tail is floored so it is always finite.
- Divergences are returned per token (``[B, T]``, zero where the mask is 0) so that algorithms can weight
  tokens or turns before aggregating with :func:`aggregate_token_loss`.

Divergence convention (named ``"trl_gkd"``; see :func:`generalized_jsd`)
-----------------------------------------------------------------------
``m = beta * p_T + (1 - beta) * p_S`` and ``JSD_beta = beta * KL(p_T || m) + (1 - beta) * KL(p_S || m)``.
That formula is exactly 0 at ``beta = 0`` and ``beta = 1`` (m collapses onto one side). TRL's GKD
convention, used by default, substitutes the limits of the normalised divergence there:
``beta = 0 -> forward KL(p_T || p_S)`` and ``beta = 1 -> reverse KL(p_S || p_T)``. Pass
``jsd_convention="raw"`` for the literal formula.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F

Aggregation = Literal["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"]
AGGREGATIONS: tuple[str, ...] = ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm")
DivergenceKind = Literal["reverse_kl", "forward_kl", "jsd"]
DIVERGENCE_KINDS: tuple[str, ...] = ("reverse_kl", "forward_kl", "jsd")
JSDConvention = Literal["trl_gkd", "raw"]
TopMSupport = Literal["student", "teacher"]


# ----------------------------------------------------------------------------------------------------
# Masked aggregation
# ----------------------------------------------------------------------------------------------------


def _weights(mask: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor:
    """The mask as float weights of ``like``'s shape (all ones when no mask is given)."""
    if mask is None:
        return torch.ones_like(like)
    try:
        shape = torch.broadcast_shapes(mask.shape, like.shape)
    except RuntimeError:
        shape = None
    if shape != like.shape:
        raise ValueError(f"mask shape {tuple(mask.shape)} does not match values shape {tuple(like.shape)}")
    return mask.to(like.dtype).expand_as(like)


def _zero_outside(values: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """``values * weights`` with masked-out positions forced to exactly 0 (so NaN padding cannot leak)."""
    return torch.where(weights != 0, values * weights, torch.zeros((), dtype=values.dtype, device=values.device))


def masked_sum(values: torch.Tensor, mask: torch.Tensor | None, dim: int | tuple[int, ...] | None = None) -> torch.Tensor:
    """``sum(mask * values)`` over ``dim`` (all dims when None); masked-out entries count as 0."""
    weighted = _zero_outside(values, _weights(mask, values))
    return weighted.sum() if dim is None else weighted.sum(dim=dim)


def masked_mean(values: torch.Tensor, mask: torch.Tensor | None, dim: int | tuple[int, ...] | None = None) -> torch.Tensor:
    """``sum(mask * values) / sum(mask)`` over ``dim``.

    An all-masked slice gives 0 rather than NaN: a batch where an algorithm masks every sample (SDPO with
    no feedback and no successful sibling) must produce a zero loss, not poison the optimiser.
    """
    weights = _weights(mask, values)
    numer = _zero_outside(values, weights)
    numer = numer.sum() if dim is None else numer.sum(dim=dim)
    denom = weights.sum() if dim is None else weights.sum(dim=dim)
    return torch.where(denom > 0, numer / denom.clamp(min=1e-12), torch.zeros_like(numer))


def per_sequence_mean(values: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Token-mean of each sequence: ``[B, T] -> [B]``; a sequence with no loss tokens gives 0."""
    return masked_mean(values, mask, dim=-1)


def aggregate_token_loss(
    per_token: torch.Tensor,
    mask: torch.Tensor | None,
    mode: Aggregation = "token_mean",
    max_len: int | None = None,
) -> torch.Tensor:
    """Reduce a ``[B, T]`` per-token loss to a scalar.

    - ``"token_mean"``: ``sum_{b,t} m*l / sum_{b,t} m`` (DAPO; every token of the batch weighs the same).
    - ``"seq_mean_token_mean"``: ``(1/B') sum_b [sum_t m*l / sum_t m]`` over the ``B'`` sequences that have
      at least one loss token (original GRPO; short sequences' tokens weigh more).
    - ``"seq_mean_token_sum_norm"``: ``sum_{b,t} m*l / (B * max_len)`` (Dr. GRPO; a constant normaliser,
      so no length bias). ``max_len`` defaults to ``T``; pass the generation budget to make the
      normaliser independent of the batch's padding.
    """
    if per_token.dim() != 2:
        raise ValueError(f"per-token loss must be [B, T], got shape {tuple(per_token.shape)}")
    if mode == "token_mean":
        return masked_mean(per_token, mask)
    if mode == "seq_mean_token_mean":
        weights = _weights(mask, per_token)
        has_tokens = (weights.sum(dim=-1) > 0).to(per_token.dtype)
        seq_means = per_sequence_mean(per_token, mask)
        return (seq_means * has_tokens).sum() / has_tokens.sum().clamp(min=1.0)
    if mode == "seq_mean_token_sum_norm":
        batch, width = per_token.shape
        norm = batch * (width if max_len is None else max_len)
        if norm <= 0:
            raise ValueError(f"seq_mean_token_sum_norm needs B * max_len > 0, got B={batch}, max_len={max_len}")
        return masked_sum(per_token, mask) / norm
    raise ValueError(f"unknown aggregation {mode!r}; expected one of {', '.join(AGGREGATIONS)}")


# ----------------------------------------------------------------------------------------------------
# Token log-probs and importance weights
# ----------------------------------------------------------------------------------------------------


class _GatheredLogProbs(torch.autograd.Function):
    """``log_softmax(logits)[..., ids]`` with a hand-written backward that needs ONE ``[..., V]`` buffer.

    Why: with a 150k vocabulary, autograd's own graph for ``gather(logits) - logsumexp(logits)`` builds
    the gradient from two full-vocabulary tensors (a scattered zeros tensor and the logsumexp term) and
    sums them. Here the backward writes ``-softmax(x) * sum_i g_i`` into one buffer and scatter-adds ``g``
    into it in place, so the only ``[..., V]`` allocation is the gradient itself. Forward saves just
    ``logits`` (already alive in the caller), ``ids`` and the ``[...]`` log-normaliser. Not twice
    differentiable (no loss here needs that).
    """

    @staticmethod
    def forward(ctx, logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        log_norm = torch.logsumexp(logits, dim=-1, keepdim=True)
        ctx.save_for_backward(logits, ids, log_norm)
        return logits.gather(-1, ids) - log_norm

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out: torch.Tensor):  # type: ignore[override]
        logits, ids, log_norm = ctx.saved_tensors
        grad = torch.sub(logits, log_norm).exp_()
        grad.mul_(-grad_out.sum(dim=-1, keepdim=True))
        grad.scatter_add_(-1, ids, grad_out)
        return grad, None


def gathered_logprobs(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """``log p(ids)`` under ``softmax(logits)``: ``logits [..., V]``, ``ids [..., K] -> [..., K]``.

    Memory-lean in both directions (see :class:`_GatheredLogProbs`); the basis of the top-M student side
    and of :func:`token_logprobs`.
    """
    if logits.shape[:-1] != ids.shape[:-1]:
        raise ValueError(f"logits {tuple(logits.shape)} and ids {tuple(ids.shape)} disagree on the leading dims")
    ids = ids.long()
    if logits.requires_grad:
        return _GatheredLogProbs.apply(logits, ids)
    return logits.gather(-1, ids) - torch.logsumexp(logits, dim=-1, keepdim=True)


def token_logprobs(logits: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
    """``log p(y_t)`` of the given tokens: ``logits [B, T, V]``, ``token_ids [B, T] -> [B, T]``.

    Computed by :func:`gathered_logprobs` rather than gathering from ``log_softmax`` so that no second
    ``[B, T, V]`` tensor is kept for, or built in, the backward pass.
    """
    if logits.shape[:-1] != token_ids.shape:
        raise ValueError(f"logits {tuple(logits.shape)} and token ids {tuple(token_ids.shape)} disagree on [B, T]")
    return gathered_logprobs(logits, token_ids.unsqueeze(-1)).squeeze(-1)


def truncated_importance_weight(logp: torch.Tensor, logp_old: torch.Tensor, cap: float) -> torch.Tensor:
    """``min(exp(logp - logp_old), cap)``, detached: a per-token weight for slightly stale rollouts.

    Detached because it is a correction factor (truncated importance sampling), not something to
    optimise; the cap bounds the variance a very off-policy token can inject.
    """
    if cap <= 0:
        raise ValueError(f"importance-weight cap must be > 0, got {cap}")
    return torch.exp(logp.detach() - logp_old.detach()).clamp(max=cap)


# ----------------------------------------------------------------------------------------------------
# GRPO: group-normalised advantages, clipped policy-gradient loss, k3 KL
# ----------------------------------------------------------------------------------------------------


def group_advantages(
    rewards: torch.Tensor,
    group_ids: torch.Tensor | None = None,
    *,
    scale_by_std: bool = True,
    eps: float = 1e-6,
    unbiased: bool = True,
) -> torch.Tensor:
    """Group-normalised advantages ``A_i = (R_i - mean_g R) / (std_g R + eps)``.

    ``rewards`` is ``[num_groups, G]`` (groups along dim 0), or flat ``[N]`` with ``group_ids [N]`` (any
    integer labels; groups may differ in size). ``scale_by_std=False`` gives Dr. GRPO's
    ``A_i = R_i - mean_g R``. ``unbiased`` selects Bessel's correction (torch.std's default, as in TRL);
    a group of one rollout has std 0 and advantage 0. Returns the same shape as ``rewards``; detached,
    since rewards are data.
    """
    rewards = rewards.detach()
    if not rewards.is_floating_point():
        rewards = rewards.float()
    if group_ids is None:
        if rewards.dim() != 2:
            raise ValueError(
                f"rewards without group_ids must be [num_groups, G], got shape {tuple(rewards.shape)}; "
                "pass group_ids for a flat reward vector"
            )
        mean = rewards.mean(dim=1, keepdim=True)
        centred = rewards - mean
        if not scale_by_std:
            return centred
        size = rewards.shape[1]
        denom = max(size - 1, 1) if unbiased else size
        std = (centred.pow(2).sum(dim=1, keepdim=True) / denom).sqrt()
        return centred / (std + eps)

    if rewards.dim() != 1 or group_ids.shape != rewards.shape:
        raise ValueError(
            f"flat rewards [N] need group_ids [N]; got rewards {tuple(rewards.shape)}, group_ids {tuple(group_ids.shape)}"
        )
    _, inverse = torch.unique(group_ids, return_inverse=True)
    num_groups = int(inverse.max().item()) + 1 if inverse.numel() else 0
    counts = torch.zeros(num_groups, dtype=rewards.dtype, device=rewards.device).index_add_(
        0, inverse, torch.ones_like(rewards)
    )
    sums = torch.zeros(num_groups, dtype=rewards.dtype, device=rewards.device).index_add_(0, inverse, rewards)
    centred = rewards - (sums / counts)[inverse]
    if not scale_by_std:
        return centred
    sq = torch.zeros(num_groups, dtype=rewards.dtype, device=rewards.device).index_add_(0, inverse, centred.pow(2))
    denom = (counts - 1).clamp(min=1) if unbiased else counts
    std = (sq / denom).sqrt()
    return centred / (std[inverse] + eps)


@dataclass(frozen=True)
class PolicyLossStats:
    """Diagnostics of one clipped policy-gradient loss, as detached 0-dim tensors (no device sync).

    ``clip_fraction``: share of loss tokens where the clipped term is the active one (the ratio left the
    trust region in the direction the advantage pushes). ``mean_ratio``: masked mean of ``rho``.
    ``approx_kl``: masked mean of ``logp_old - logp`` (a cheap drift monitor).
    """

    clip_fraction: torch.Tensor
    mean_ratio: torch.Tensor
    approx_kl: torch.Tensor

    def as_dict(self) -> dict[str, float]:
        return {name: float(getattr(self, name)) for name in ("clip_fraction", "mean_ratio", "approx_kl")}


def clipped_policy_gradient_loss(
    logp: torch.Tensor,
    logp_old: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor | None,
    *,
    eps_low: float = 0.2,
    eps_high: float | None = None,
    aggregation: Aggregation = "token_mean",
    max_len: int | None = None,
) -> tuple[torch.Tensor, PolicyLossStats]:
    """PPO/GRPO clipped surrogate.

    ``rho_t = exp(logp_t - logp_old_t)``;
    ``loss_t = -min(rho_t A_t, clip(rho_t, 1 - eps_low, 1 + eps_high) A_t)``, aggregated by
    :func:`aggregate_token_loss`. ``logp``, ``logp_old`` and ``mask`` are ``[B, T]`` (log-probs of the
    sampled tokens); ``advantages`` is ``[B]`` (one per sequence, GRPO) or ``[B, T]`` (per token, e.g. the
    sampled-token distillation advantage). ``eps_high`` defaults to ``eps_low`` (symmetric); DAPO's
    clip-higher uses a larger ``eps_high``. ``logp_old`` and ``advantages`` are detached.
    """
    per_token, parts = clipped_policy_gradient_per_token(logp, logp_old, advantages, eps_low=eps_low, eps_high=eps_high)
    loss = aggregate_token_loss(per_token, mask, aggregation, max_len=max_len)
    stats = PolicyLossStats(**{name: masked_mean(value, mask) for name, value in parts.items()})
    return loss, stats


def clipped_policy_gradient_per_token(
    logp: torch.Tensor, logp_old: torch.Tensor, advantages: torch.Tensor, *, eps_low: float = 0.2,
    eps_high: float | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The clipped surrogate per token ``[B, T]`` (not aggregated), and the detached per-token diagnostics
    ``clip_fraction`` (1 where the clipped term is active), ``mean_ratio`` (rho) and ``approx_kl``
    (``logp_old - logp``), for a caller that weights tokens itself."""
    if eps_low < 0 or (eps_high is not None and eps_high < 0):
        raise ValueError(f"clip ranges must be >= 0, got eps_low={eps_low}, eps_high={eps_high}")
    eps_high = eps_low if eps_high is None else eps_high
    if logp.shape != logp_old.shape:
        raise ValueError(f"logp {tuple(logp.shape)} and logp_old {tuple(logp_old.shape)} must match")
    advantages = advantages.detach()
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(-1)
    log_ratio = logp - logp_old.detach()
    ratio = torch.exp(log_ratio)
    unclipped = ratio * advantages
    clipped = ratio.clamp(1.0 - eps_low, 1.0 + eps_high) * advantages
    per_token = -torch.minimum(unclipped, clipped)
    with torch.no_grad():
        parts = {"clip_fraction": (clipped < unclipped).to(per_token.dtype), "mean_ratio": ratio.detach(),
                 "approx_kl": -log_ratio.detach()}
    return per_token, parts


def k3_kl(logp: torch.Tensor, ref_logp: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Schulman's k3 estimator of KL(pi || pi_ref) per sampled token: ``exp(d) - d - 1``, ``d = ref - logp``.

    Unbiased, always >= 0, and low-variance for tokens sampled from ``pi``. ``[B, T] -> [B, T]``; zero
    where ``mask`` is 0. The reference is detached.
    """
    delta = ref_logp.detach() - logp
    per_token = torch.exp(delta) - delta - 1.0
    return per_token if mask is None else _zero_outside(per_token, _weights(mask, per_token))


# ----------------------------------------------------------------------------------------------------
# Divergences between two distributions given as log-probs over the last dimension
# ----------------------------------------------------------------------------------------------------


def _kl_from_logprobs(logp_p: torch.Tensor, logp_q: torch.Tensor) -> torch.Tensor:
    """``KL(p || q) = sum_v p(v) (log p(v) - log q(v))`` over the last dim."""
    return (logp_p.exp() * (logp_p - logp_q)).sum(dim=-1)


def generalized_jsd(
    student_logp: torch.Tensor,
    teacher_logp: torch.Tensor,
    beta: float,
    convention: JSDConvention = "trl_gkd",
) -> torch.Tensor:
    """Generalised Jensen-Shannon divergence over the last dim (normalised log-probs in, ``[...]`` out).

    ``m = beta p_T + (1 - beta) p_S``; ``JSD = beta KL(p_T || m) + (1 - beta) KL(p_S || m)``; ``log m``
    is formed with ``logaddexp`` (no probabilities summed in linear space). With ``convention="trl_gkd"``
    the endpoints are the KL limits (``beta=0``: forward KL(p_T||p_S); ``beta=1``: reverse KL(p_S||p_T));
    with ``"raw"`` they are the literal formula's 0.
    """
    if not 0.0 <= beta <= 1.0:
        raise ValueError(f"JSD beta must lie in [0, 1], got {beta}")
    if convention not in ("trl_gkd", "raw"):
        raise ValueError(f"unknown JSD convention {convention!r}; expected 'trl_gkd' or 'raw'")
    if convention == "trl_gkd" and beta == 0.0:
        return _kl_from_logprobs(teacher_logp, student_logp)
    if convention == "trl_gkd" and beta == 1.0:
        return _kl_from_logprobs(student_logp, teacher_logp)
    if beta == 0.0:
        log_m = student_logp
    elif beta == 1.0:
        log_m = teacher_logp
    else:
        log_m = torch.logaddexp(teacher_logp + math.log(beta), student_logp + math.log1p(-beta))
    return beta * _kl_from_logprobs(teacher_logp, log_m) + (1.0 - beta) * _kl_from_logprobs(student_logp, log_m)


def divergence_from_logprobs(
    student_logp: torch.Tensor,
    teacher_logp: torch.Tensor,
    kind: DivergenceKind = "reverse_kl",
    *,
    beta: float = 0.5,
    jsd_convention: JSDConvention = "trl_gkd",
) -> torch.Tensor:
    """One divergence between two normalised distributions over the last dim; the building block of the
    full-vocabulary and the top-M losses (which differ only in what the last dim holds).

    ``reverse_kl``: KL(p_S || p_T) (mode-seeking; OPD/LOPD). ``forward_kl``: KL(p_T || p_S)
    (mass-covering). ``jsd``: :func:`generalized_jsd` with ``beta``.
    """
    if kind == "reverse_kl":
        return _kl_from_logprobs(student_logp, teacher_logp)
    if kind == "forward_kl":
        return _kl_from_logprobs(teacher_logp, student_logp)
    if kind == "jsd":
        return generalized_jsd(student_logp, teacher_logp, beta, jsd_convention)
    raise ValueError(f"unknown divergence kind {kind!r}; expected one of {', '.join(DIVERGENCE_KINDS)}")


def _finish_per_token(values: torch.Tensor, mask: torch.Tensor | None, clip: float | None) -> torch.Tensor:
    """Apply the optional per-token clip (``min(value, clip)``; gradient 0 above it) and the mask."""
    if clip is not None:
        if clip <= 0:
            raise ValueError(f"per-token divergence clip must be > 0, got {clip}")
        values = values.clamp(max=clip)
    return values if mask is None else _zero_outside(values, _weights(mask, values))


def full_vocab_divergence(
    student_logits: torch.Tensor,
    teacher_logits: torch.Tensor,
    mask: torch.Tensor | None = None,
    kind: DivergenceKind = "reverse_kl",
    *,
    beta: float = 0.5,
    jsd_convention: JSDConvention = "trl_gkd",
    clip: float | None = None,
) -> torch.Tensor:
    """Per-token divergence over the FULL vocabulary: ``[B, T, V]`` logits (or log-probs) -> ``[B, T]``.

    Exact, but the teacher costs V numbers per token (150k vocabularies: ~600 KB per token in fp32);
    :func:`topm_divergence` is the M+1-number alternative. The teacher side is detached.
    """
    if student_logits.shape != teacher_logits.shape:
        raise ValueError(f"student {tuple(student_logits.shape)} and teacher {tuple(teacher_logits.shape)} logits must match")
    student_logp = F.log_softmax(student_logits, dim=-1)
    teacher_logp = F.log_softmax(teacher_logits.detach(), dim=-1)
    values = divergence_from_logprobs(student_logp, teacher_logp, kind, beta=beta, jsd_convention=jsd_convention)
    return _finish_per_token(values, mask, clip)


# ----------------------------------------------------------------------------------------------------
# Top-M plus a tail bucket: the teacher as M+1 numbers per token
# ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TopM:
    """A distribution's compact form: M token ids, their log-probs, and the log of the remaining mass.

    ``ids [B, T, M]`` (long), ``logprobs [B, T, M]``, ``tail [B, T]`` = ``log(1 - sum_M p)``. This is what
    a teacher (a separate server, a cached scoring pass) ships per token: M+1 numbers, not V.
    """

    ids: torch.Tensor
    logprobs: torch.Tensor
    tail: torch.Tensor

    def __post_init__(self) -> None:
        if self.ids.shape != self.logprobs.shape or self.ids.dim() != 3:
            raise ValueError(
                f"TopM ids {tuple(self.ids.shape)} and logprobs {tuple(self.logprobs.shape)} must both be [B, T, M]"
            )
        if self.tail.shape != self.ids.shape[:-1]:
            raise ValueError(f"TopM tail must be [B, T] = {tuple(self.ids.shape[:-1])}, got {tuple(self.tail.shape)}")

    @property
    def m(self) -> int:
        return self.ids.shape[-1]

    def detach(self) -> "TopM":
        return TopM(self.ids.detach(), self.logprobs.detach(), self.tail.detach())

    def numel_per_token(self) -> int:
        """Values stored per token apart from the ids (M log-probs + 1 tail): the memory claim."""
        return self.m + 1


def tail_logprob(topm_logprobs: torch.Tensor) -> torch.Tensor:
    """``log(1 - sum_M p)`` from the M log-probs, stably: ``log(-expm1(logsumexp(logp_M)))``.

    Why this form: when the M entries hold almost all the mass, ``sum p`` rounds to 1 in linear space and
    ``1 - sum p`` to 0, but ``logsumexp(logp_M)`` is a small negative number that floats resolve finely,
    and ``-expm1`` of it recovers the remaining mass to full relative precision. The kept log-mass is
    capped at ``-sqrt(finfo.tiny)`` (~1e-19 in fp32/bf16): where rounding puts it at or above 0 (M = V,
    or a fully peaked teacher) the tail is ``log(1e-19)`` instead of ``log(0) = -inf``, whose gradient
    would be infinite. ``[..., M] -> [...]``.
    """
    floor = math.sqrt(torch.finfo(topm_logprobs.dtype).tiny)
    kept = torch.logsumexp(topm_logprobs, dim=-1).clamp(max=-floor)
    return torch.log(-torch.expm1(kept))


def _normalised_logprobs(logits: torch.Tensor) -> torch.Tensor:
    return logits - torch.logsumexp(logits, dim=-1, keepdim=True)


@torch.no_grad()
def teacher_topm(teacher_logits: torch.Tensor, m: int) -> TopM:
    """The teacher's own top-M (OPSD's support) from its logits or log-probs ``[B, T, V]``."""
    if not 0 < m <= teacher_logits.shape[-1]:
        raise ValueError(f"top-M needs 0 < M <= V = {teacher_logits.shape[-1]}, got M={m}")
    logp = _normalised_logprobs(teacher_logits.detach())
    values, ids = logp.topk(m, dim=-1)
    return TopM(ids=ids, logprobs=values, tail=tail_logprob(values))


def gather_topm(teacher_logits: torch.Tensor, ids: torch.Tensor, *, keep_grad: bool = False) -> TopM:
    """The teacher's log-probs at GIVEN ids (e.g. the student's top-M, SDPO's support) plus its tail.

    ``teacher_logits [B, T, V]`` (logits or log-probs) and ``ids [B, T, M]``: the teacher's scoring pass
    calls this with the ids the student chose, and ships the resulting M+1 numbers.
    """
    if teacher_logits.shape[:-1] != ids.shape[:-1]:
        raise ValueError(f"teacher logits {tuple(teacher_logits.shape)} and ids {tuple(ids.shape)} disagree on [B, T]")
    logits = teacher_logits if keep_grad else teacher_logits.detach()
    picked = logits.gather(-1, ids.long()) - torch.logsumexp(logits, dim=-1, keepdim=True)
    return TopM(ids=ids.long(), logprobs=picked, tail=tail_logprob(picked))


@torch.no_grad()
def student_topm_ids(student_logits: torch.Tensor, m: int) -> torch.Tensor:
    """The student's top-M token ids ``[B, T, M]`` (no gradient: choosing the support is not optimised)."""
    if not 0 < m <= student_logits.shape[-1]:
        raise ValueError(f"top-M needs 0 < M <= V = {student_logits.shape[-1]}, got M={m}")
    return student_logits.detach().topk(m, dim=-1).indices


def topm_divergence(
    student_logits: torch.Tensor,
    teacher: TopM,
    mask: torch.Tensor | None = None,
    kind: DivergenceKind = "reverse_kl",
    *,
    tail: bool = True,
    beta: float = 0.5,
    jsd_convention: JSDConvention = "trl_gkd",
    clip: float | None = None,
    teacher_grad: bool = False,
) -> torch.Tensor:
    """Per-token divergence on the teacher's ids: student ``[B, T, V]`` logits + teacher :class:`TopM`.

    The student's log-probs are gathered at ``teacher.ids`` by :func:`gathered_logprobs` (whose backward
    allocates only the logits' gradient: no other full-vocabulary tensor exists on this path). With
    ``tail=True`` both sides get one extra bucket, ``log(1 - sum_M p)``, and the divergence runs over M+1
    entries (SDPO's form); with ``tail=False`` both sides are renormalised over the M entries (OPSD's). Gradients flow into
    ``student_logits`` only. Returns ``[B, T]``, zero where ``mask`` is 0.
    """
    if student_logits.shape[:-1] != teacher.ids.shape[:-1]:
        raise ValueError(
            f"student logits {tuple(student_logits.shape)} and teacher ids {tuple(teacher.ids.shape)} disagree on [B, T]"
        )
    teacher = teacher if teacher_grad else teacher.detach()
    student_m = gathered_logprobs(student_logits, teacher.ids)
    if tail:
        student_support = torch.cat([student_m, tail_logprob(student_m).unsqueeze(-1)], dim=-1)
        teacher_support = torch.cat([teacher.logprobs, teacher.tail.unsqueeze(-1)], dim=-1)
    else:
        student_support = _normalised_logprobs(student_m)
        teacher_support = _normalised_logprobs(teacher.logprobs)
    values = divergence_from_logprobs(student_support, teacher_support, kind, beta=beta, jsd_convention=jsd_convention)
    return _finish_per_token(values, mask, clip)


def topm_distillation(
    student_logits: torch.Tensor,
    teacher_logits: torch.Tensor,
    m: int,
    mask: torch.Tensor | None = None,
    kind: DivergenceKind = "reverse_kl",
    *,
    support: TopMSupport = "student",
    tail: bool = True,
    beta: float = 0.5,
    jsd_convention: JSDConvention = "trl_gkd",
    clip: float | None = None,
    teacher_grad: bool = False,
) -> torch.Tensor:
    """Convenience for callers holding both full logits (an in-process self-teacher): build the teacher's
    :class:`TopM` on the chosen ``support`` (``"student"``: the student's top-M, SDPO; ``"teacher"``: the
    teacher's top-M, OPSD) and call :func:`topm_divergence`. ``teacher_grad=True`` lets gradients reach
    the teacher's logits too (LOPD trains its teacher's latent context through them)."""
    if support == "student":
        record = gather_topm(teacher_logits, student_topm_ids(student_logits, m), keep_grad=teacher_grad)
    elif support == "teacher":
        record = teacher_topm(teacher_logits, m)
    else:
        raise ValueError(f"unknown top-M support {support!r}; expected 'student' or 'teacher'")
    return topm_divergence(student_logits, record, mask, kind, tail=tail, beta=beta, jsd_convention=jsd_convention, clip=clip,
                           teacher_grad=teacher_grad)


# ----------------------------------------------------------------------------------------------------
# Sampled-token estimator (no vocabulary sums)
# ----------------------------------------------------------------------------------------------------


def sampled_token_log_ratio(student_logp: torch.Tensor, teacher_logp: torch.Tensor) -> torch.Tensor:
    """``r_t = log p_S(y_t) - log p_T(y_t)`` on the sampled tokens ``[B, T]``, detached.

    Its expectation under the student is the per-token reverse KL; it is a signal, never differentiated.
    """
    return student_logp.detach() - teacher_logp.detach()


def sampled_token_advantages(
    student_logp: torch.Tensor, teacher_logp: torch.Tensor, mask: torch.Tensor | None = None
) -> torch.Tensor:
    """Per-token advantage ``-r_t`` for :func:`clipped_policy_gradient_loss` ("distillation as RL")."""
    advantages = -sampled_token_log_ratio(student_logp, teacher_logp)
    return advantages if mask is None else _zero_outside(advantages, _weights(mask, advantages))


def sampled_token_surrogate(
    student_logp: torch.Tensor,
    teacher_logp: torch.Tensor,
    mask: torch.Tensor | None = None,
    clip: float | None = None,
) -> torch.Tensor:
    """Per-token surrogate ``stopgrad(r_t) * log p_S(y_t)``; its gradient ``r_t * grad log p_S(y_t)`` is the
    score-function estimate of the reverse-KL gradient. ``clip`` bounds ``|r_t|`` (a few off tokens with a
    huge log-ratio otherwise dominate). ``[B, T] -> [B, T]``."""
    ratio = sampled_token_log_ratio(student_logp, teacher_logp)
    if clip is not None:
        if clip <= 0:
            raise ValueError(f"log-ratio clip must be > 0, got {clip}")
        ratio = ratio.clamp(-clip, clip)
    per_token = ratio * student_logp
    return per_token if mask is None else _zero_outside(per_token, _weights(mask, per_token))


# ----------------------------------------------------------------------------------------------------
# BCO: binary classifier optimisation on unpaired chosen / rejected sequences (VPD's E-step)
# ----------------------------------------------------------------------------------------------------


def bco_implicit_reward(
    policy_logp: torch.Tensor, ref_logp: torch.Tensor, mask: torch.Tensor | None, beta: float
) -> torch.Tensor:
    """``r = beta * sum_t mask_t (log q(y_t) - log pi_ref(y_t))`` per sequence: ``[B, T] -> [B]``.

    The reference (the frozen student snapshot in VPD) is detached.
    """
    return beta * masked_sum(policy_logp - ref_logp.detach(), mask, dim=-1)


def bco_row_losses(rewards: torch.Tensor, chosen: torch.Tensor, delta: float | torch.Tensor) -> torch.Tensor:
    """Per sequence: ``-log sigmoid(r - delta)`` where ``chosen``, ``-log sigmoid(-(r - delta))`` elsewhere
    (``delta`` detached). The building block of :func:`bco_loss`, for callers that weight sequences."""
    delta_t = torch.as_tensor(delta, dtype=rewards.dtype, device=rewards.device).detach()
    return torch.where(chosen.to(rewards.device), -F.logsigmoid(rewards - delta_t), -F.logsigmoid(-(rewards - delta_t)))


@dataclass(frozen=True)
class BCOStats:
    """Detached diagnostics of one BCO loss: mean rewards of each side and the delta used."""

    chosen_reward: torch.Tensor
    rejected_reward: torch.Tensor
    delta: float


def bco_loss(
    chosen_rewards: torch.Tensor, rejected_rewards: torch.Tensor, delta: float | torch.Tensor
) -> tuple[torch.Tensor, BCOStats]:
    """Unpaired BCO: ``-log sigmoid(r_c - delta)`` per chosen and ``-log sigmoid(-(r_r - delta))`` per
    rejected sequence, averaged over all the sequences together (TRL's former BCOTrainer reduced the same
    way, so each sequence weighs the same whichever side it is on). Either side may be empty; both empty
    is a caller error. ``delta`` (the running mean of past rewards) is detached.
    """
    if chosen_rewards.numel() + rejected_rewards.numel() == 0:
        raise ValueError("bco_loss needs at least one chosen or one rejected sequence")
    delta_t = torch.as_tensor(delta, dtype=chosen_rewards.dtype, device=chosen_rewards.device).detach()
    chosen_terms = bco_row_losses(chosen_rewards, torch.ones_like(chosen_rewards, dtype=torch.bool), delta_t)
    rejected_terms = bco_row_losses(rejected_rewards, torch.zeros_like(rejected_rewards, dtype=torch.bool), delta_t)
    loss = torch.cat([chosen_terms.reshape(-1), rejected_terms.reshape(-1)]).mean()
    nan = torch.tensor(float("nan"))
    stats = BCOStats(
        chosen_reward=chosen_rewards.detach().mean() if chosen_rewards.numel() else nan,
        rejected_reward=rejected_rewards.detach().mean() if rejected_rewards.numel() else nan,
        delta=float(delta_t),
    )
    return loss, stats


class RunningMean:
    """Mean of every value seen so far (BCO's ``delta``), exact and mergeable, with a state dict.

    ``momentum=None`` is the cumulative mean over all updates (TRL's running-moments behaviour);
    a float ``momentum`` in (0, 1] makes it an exponential moving average of batch means, for when the
    reward scale drifts as the teacher improves. The state dict makes resumed runs identical.
    """

    def __init__(self, momentum: float | None = None) -> None:
        if momentum is not None and not 0.0 < momentum <= 1.0:
            raise ValueError(f"RunningMean momentum must be in (0, 1] or None, got {momentum}")
        self.momentum = momentum
        self.mean = 0.0
        self.count = 0

    def update(self, values: torch.Tensor | list[float] | float) -> float:
        """Fold a batch of values in; returns the new mean. An empty batch changes nothing."""
        batch = torch.as_tensor(values, dtype=torch.float64).detach().reshape(-1)
        if batch.numel() == 0:
            return self.mean
        batch_mean = float(batch.mean())
        if self.momentum is None or self.count == 0:
            total = self.count + batch.numel()
            self.mean += (batch_mean - self.mean) * batch.numel() / total
            self.count = total
        else:
            self.mean += self.momentum * (batch_mean - self.mean)
            self.count += batch.numel()
        return self.mean

    def state_dict(self) -> dict[str, float | int | None]:
        return {"mean": self.mean, "count": self.count, "momentum": self.momentum}

    def load_state_dict(self, state: dict) -> None:
        self.mean = float(state["mean"])
        self.count = int(state["count"])
        self.momentum = state.get("momentum", self.momentum)

    def __repr__(self) -> str:
        return f"RunningMean(mean={self.mean:.6g}, count={self.count}, momentum={self.momentum})"
