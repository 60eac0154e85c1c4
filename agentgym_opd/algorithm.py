"""The algorithm interface: a config dataclass, per-token weights, a loss; the base class owns the step.

Why this shape: the trainer loop (``agentgym_opd.trainer``) must run any registered algorithm, built-in or
a plugin's, without knowing its knobs, and two methods must differ only in what their papers say. So an
algorithm declares

- ``Config``: a dataclass validated from the run config's ``algo`` section (errors name ``algo.<key>``);
- ``needs_groups`` / ``needs_teacher``: what the trainer must provide (G rollouts per task, a teacher);
- ``prepare(batch)``: per-batch state decided once before any gradient (a judge's verdicts, retrieved
  experience, a reference's log-probs), returned as a :class:`BatchState`, never kept on the algorithm;
- ``token_weights(batch, state, step)``: one or more named :class:`LossTerm`s, each a ``[B, T-1]`` weight
  per token (default: the loss mask) and the aggregation that turns weighted per-token losses into the
  batch's loss;
- ``compute_loss(batch, rows, coef, state, step)``: the method section of its paper on ``rows``, as
  ``sum_t coef[term][t] * loss_term[t]`` (use :func:`weighted_sum`) plus additive metric contributions;
- optionally ``steps(state)`` (several optimiser steps per batch, e.g. VPD's E- and M-steps) and
  ``collect(...)`` (where the data comes from).

The base class owns the step: the weights are computed once per batch, turned into coefficients with the
batch-level normaliser of their aggregation (summed over ranks), so summing ``compute_loss`` over any
split of the rows into micro-batches and ranks gives exactly the batch-level loss and gradient. Then
backward (``world_size`` times the loss: data-parallel averaging divides by it again), gradient sync of
trainable parameters outside the wrapped student (LOPD's composer), one clip over every optimiser group,
the optimiser step and ``after_update``. A step whose weights carry no learning signal on any rank (every
row masked, every turn Skip, every advantage 0: :meth:`LossTerm.signal`) is skipped whole, the same way on
every rank and for any micro-batch size, and reported as ``update/skipped``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch

from agentgym_opd.rollout import RolloutBatch, RolloutEngine


SKIPPED = "update/skipped"  # 1: this update took no optimiser step (no learning signal anywhere)
SKIPPED_STEPS = "update/skipped_steps"  # planned steps skipped for lack of signal


@dataclass
class AlgorithmConfig:
    """No knobs: the base of every algorithm's config dataclass."""


@dataclass(frozen=True)
class Step:
    """One optimiser step of an update: a name a method dispatches on, and a learning-rate multiple."""

    name: str = "update"
    lr_scale: float = 1.0


@dataclass
class BatchState:
    """What ``prepare`` decided for one batch; ``metrics`` are logged with the update (rank-averaged)."""

    metrics: dict[str, float] = field(default_factory=dict)


@dataclass
class LossTerm:
    """Per-token weights ``[B, T-1]`` (shifted coordinates, as :func:`sequence_logits`) of one loss term.

    ``aggregation``: ``token_mean`` (``sum w l / sum w``), ``seq_mean_token_mean`` (mean over rows with
    weight of each row's ``sum_t w l / sum_t w``) or ``seq_mean_token_sum_norm`` (``sum w l / (B * T)``
    with ``T`` the batch's width). ``scale`` multiplies the term (a mix weight, a dual variable).
    """

    weights: torch.Tensor
    aggregation: str = "token_mean"
    scale: float = 1.0
    row_factor: torch.Tensor | None = None

    def signal(self) -> float:
        """How much this term can teach: ``sum |w|`` over its tokens, each row's share times ``|row_factor|``.

        ``row_factor [B]`` is a per-row multiplier the method applies to this term's per-token loss in
        ``compute_loss`` (GRPO's advantage): a row whose factor is 0 has a loss of 0 and no gradient. It
        never enters the coefficients; it only lets the base class see that such a batch teaches nothing."""
        w = self.weights.float().abs()
        if self.row_factor is not None:
            w = w * self.row_factor.float().abs().to(w.device)[:, None]
        return float(w.sum()) * abs(self.scale)


def micro_batch(model: Any, batch: RolloutBatch,
                rows: Sequence[int] | slice) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(ids [b, T], attention [b, T], mask [b, T-1])`` of the given rows on the model's device, without the
    all-padding columns of this micro-batch (``T`` is its longest real sequence). ``mask[t]`` is 1 exactly
    where ids[t+1] is an agent-generated token: the shift lives here, once, because getting it wrong by one
    token is the classic silent bug of token-level losses."""
    device = next(model.parameters()).device
    attention = batch.attention_mask[rows]
    width = int(attention.sum(dim=1).max())
    return (batch.input_ids[rows][:, :width].to(device), attention[:, :width].to(device),
            batch.loss_mask[rows][:, 1:width].to(device).float())


def sequence_logits(model: Any, batch: RolloutBatch, rows: Sequence[int] | slice) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Next-token logits of the given rows under ``model``, their sampled-token log-probs, and the loss mask.

    Returns ``(logits [b, T-1, V], logp [b, T-1], mask [b, T-1])``: position t holds the distribution of
    ids[t+1] given ids[:t+1] (coordinates of :func:`micro_batch`).
    """
    from agentgym_opd.losses import token_logprobs

    ids, attention, mask = micro_batch(model, batch, rows)
    logits = model(input_ids=ids, attention_mask=attention, use_cache=False).logits.float()[:, :-1]
    return logits, token_logprobs(logits, ids[:, 1:]), mask


def sequence_logprobs(model: Any, batch: RolloutBatch, rows: Sequence[int] | slice,
                      temperature: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """``(logp [b, T-1], mask [b, T-1])`` of :func:`sequence_logits`, for losses that need no full vocabulary:
    computed a chunk of positions at a time (:func:`token_logprobs_of`), never as ``[b, T, V]``.
    ``temperature``: of ``softmax(logits / temperature)``; an importance ratio against the behaviour
    log-probs passes ``batch.logprob_temperature``."""
    ids, attention, mask = micro_batch(model, batch, rows)
    return token_logprobs_of(model, ids, attention, temperature=temperature, positions=mask > 0), mask


def token_logprobs_of(model: Any, ids: torch.Tensor, attention: torch.Tensor, chunk: int | None = None,
                      temperature: float = 1.0, positions: torch.Tensor | None = None) -> torch.Tensor:
    """``[b, W-1]``: log-prob of ``ids[:, t+1]`` given ``ids[:, :t+1]`` under ``softmax(logits / temperature)``,
    differentiable. The body runs once and the output head a chunk of positions at a time (also in the
    backward), so the only vocabulary-sized tensor is one chunk's (``chunk`` positions; default from the
    vocabulary's size); a model whose hidden states cannot be reached
    (:func:`agentgym_opd.policy.hf.can_chunk`) takes its full forward instead. ``positions`` ``[b, W-1]``: only
    these go through the head (packed into one row; zeros elsewhere), as in
    :func:`agentgym_opd.distill.chunked_distillation_terms`."""
    from agentgym_opd.losses import token_logprobs
    from agentgym_opd.policy.hf import (can_chunk, chosen_positions, chunked_token_scores, final_hidden_states,
                                        pack_positions, unpack_positions)

    if not can_chunk(model):
        logits = model(input_ids=ids, attention_mask=attention, use_cache=False).logits.float()[:, :-1]
        return token_logprobs(logits if temperature == 1.0 else logits / temperature, ids[:, 1:])
    hidden, targets = final_hidden_states(model, ids, attention)[:, :-1], ids[:, 1:]
    where = chosen_positions(positions)
    packed = chunked_token_scores(model, pack_positions(hidden, where), pack_positions(targets, where), chunk=chunk,
                                  temperature=temperature).logprobs
    return unpack_positions(packed, where, targets.shape)


def agent_mask(batch: RolloutBatch) -> torch.Tensor:
    """The batch's loss mask in shifted coordinates ``[B, T-1]`` (1 where ids[t+1] is an agent token)."""
    return batch.loss_mask[:, 1:].float()


def fit_width(coef: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``coef [b, W]`` cut or zero-padded to ``like``'s width and moved to its device (micro-batches drop
    their all-padding columns; the dropped columns carry weight 0)."""
    width = like.shape[-1]
    coef = coef[..., :width] if coef.shape[-1] >= width else torch.nn.functional.pad(coef, (0, width - coef.shape[-1]))
    return coef.to(device=like.device, dtype=like.dtype)


def weighted_sum(per_token: torch.Tensor, coef: torch.Tensor) -> torch.Tensor:
    """``sum coef * per_token`` with positions of coefficient 0 exactly 0 (padding may hold NaN)."""
    coef = fit_width(coef, per_token)
    return torch.where(coef != 0, per_token * coef, torch.zeros((), dtype=per_token.dtype, device=per_token.device)).sum()


def term_statistics(terms: dict[str, LossTerm], ctx: Any) -> tuple[dict[str, float], float]:
    """Each term's batch-level normaliser (``sum w``, rows with weight, or ``B * T``) and the batch's total
    learning signal (the terms' :meth:`LossTerm.signal`), both summed over ranks in ONE collective, so every
    rank reaches the same normalisers and the same skip decision."""
    from agentgym_opd import distributed as D

    local, widths = [], []
    for term in terms.values():
        w = term.weights.float()
        local += [float(w.sum()), float((w.sum(dim=1) > 0).sum()), float(w.shape[0]), term.signal()]
        widths.append(float(w.shape[1]))
    summed = D.all_reduce_sum_list(local, ctx)
    widths = D.all_reduce_max_list(widths, ctx)
    out = {}
    for k, (name, term) in enumerate(terms.items()):
        total, rows, batch, _ = summed[4 * k: 4 * k + 4]
        if term.aggregation == "token_mean":
            out[name] = total
        elif term.aggregation == "seq_mean_token_mean":
            out[name] = rows
        elif term.aggregation == "seq_mean_token_sum_norm":
            out[name] = batch * widths[k]
        else:
            raise ValueError(f"loss term {name!r}: unknown aggregation {term.aggregation!r}")
    return out, sum(summed[4 * k + 3] for k in range(len(terms)))


def term_normalisers(terms: dict[str, LossTerm], ctx: Any) -> dict[str, float]:
    """Each term's batch-level normaliser, summed over ranks (see :func:`term_statistics`)."""
    return term_statistics(terms, ctx)[0]


def term_coefficients(term: LossTerm, normaliser: float) -> torch.Tensor:
    """``[B, T-1]`` coefficients whose sum against a per-token loss is the term's batch-level loss."""
    w = term.weights.float()
    if normaliser <= 0:  # no weight anywhere: the term is 0
        return torch.zeros_like(w)
    if term.aggregation == "seq_mean_token_mean":
        w = w / w.sum(dim=1, keepdim=True).clamp(min=1e-30)
    return w * (term.scale / normaliser)


class Algorithm:
    """Base of registered algorithms (see the module docstring)."""

    Config: type = AlgorithmConfig
    needs_groups: bool = False
    needs_teacher: bool = False

    def __init__(self, config: Any, student: Any, teacher: Any = None, *,
                 optimizer: torch.optim.Optimizer | None = None, grad_clip: float | None = 1.0,
                 micro_batch_size: int = 8, work_dir: str | None = None):
        if config is None:
            config = self.Config()
        elif isinstance(config, dict):
            from agentgym_opd.config import dataclass_from_dict

            config = dataclass_from_dict(self.Config, config, path="algo")
        elif not isinstance(config, self.Config):
            raise TypeError(f"{type(self).__name__} expects a {self.Config.__name__} (or a dict), got {type(config).__name__}")
        if self.needs_teacher and teacher is None:
            raise ValueError(f"{type(self).__name__} needs a teacher model: pass --teacher PATH")
        if micro_batch_size < 1:
            raise ValueError(f"micro_batch_size must be >= 1, got {micro_batch_size}")
        self.config = config
        self.student = student
        self.teacher = teacher
        self.grad_clip = grad_clip
        self.micro_batch_size = micro_batch_size
        self.work_dir = work_dir  # the run's output folder, for state an algorithm keeps on disk (e.g. a bank)
        from agentgym_opd.distributed import DistContext

        self.dist = DistContext()  # one process; the Trainer sets the torchrun context
        self.optimizer = optimizer or torch.optim.AdamW(self.trainable_parameters(), lr=1e-5)

    # ------------------------------------------------------------------ what subclasses write
    def prepare(self, batch: RolloutBatch) -> BatchState:
        """Per-batch decisions made once, before micro-batching (default: none)."""
        return BatchState()

    def steps(self, state: BatchState) -> list[Step]:
        """The optimiser steps this batch gets (default: one). An empty list skips the update."""
        return [Step()]

    def begin_step(self, batch: RolloutBatch, state: BatchState, step: Step) -> None:
        """Called before each step's weights (a method whose weights depend on the current parameters)."""

    def token_weights(self, batch: RolloutBatch, state: BatchState, step: Step) -> dict[str, LossTerm]:
        """The loss terms' per-token weights. Default: one term, the loss mask, aggregated per config."""
        aggregation = getattr(self.config, "aggregation", "token_mean")
        return {"loss": LossTerm(agent_mask(batch), aggregation)}

    def compute_loss(self, batch: RolloutBatch, rows: slice, coef: dict[str, torch.Tensor], state: BatchState,
                     step: Step) -> tuple[torch.Tensor, dict[str, float]]:
        """``rows``' share of the batch loss (``weighted_sum`` of each term against ``coef[term]``) and
        additive metric contributions (weight a per-token metric by a term's coefficients: the sums over
        micro-batches are then its batch-level weighted mean)."""
        raise NotImplementedError

    def collect(self, engine: RolloutEngine, envs: Sequence[Any], tasks: Sequence[str], *, group_size: int,
                seed: int) -> RolloutBatch:
        """The batch one update trains on. Default: the current student's own rollouts (on-policy)."""
        return engine.collect(envs, tasks, group_size=group_size, seed=seed)

    def after_update(self, metrics: dict[str, float], step: Step) -> None:
        """Called after each optimiser step with its global metrics (an EMA teacher, a dual variable move here)."""

    def extra_state(self) -> dict[str, Any]:
        """Algorithm state beyond the optimiser that a resume needs (an EMA teacher, a dual variable)."""
        return {}

    def load_extra_state(self, state: dict[str, Any]) -> None:
        """Inverse of :meth:`extra_state`."""

    # ------------------------------------------------------------------ shared mechanics
    @property
    def model(self) -> Any:
        """The student's trainable network (``HFPolicy.model``; or the object itself for a bare module)."""
        return getattr(self.student, "model", self.student)

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        params = [p for p in self.model.parameters() if p.requires_grad]
        if not params:
            raise ValueError("the student has no trainable parameters")
        return params

    def optimised_parameters(self) -> list[torch.nn.Parameter]:
        """Every parameter of every optimiser group (the student's and, e.g., LOPD's composer)."""
        return [p for group in self.optimizer.param_groups for p in group["params"]]

    def coefficients(self, batch: RolloutBatch, state: BatchState, step: Step) -> dict[str, torch.Tensor]:
        return self.weigh(batch, state, step)[0]

    def weigh(self, batch: RolloutBatch, state: BatchState, step: Step) -> tuple[dict[str, torch.Tensor], bool]:
        """The terms' coefficients, and whether the batch (over every rank) can teach anything at all."""
        terms = self.token_weights(batch, state, step)
        norms, signal = term_statistics(terms, self.dist)
        return {name: term_coefficients(term, norms[name]) for name, term in terms.items()}, signal > 0

    def loss(self, batch: RolloutBatch, state: BatchState | None = None, step: Step | None = None) -> tuple[torch.Tensor, dict[str, float]]:
        """The batch-level loss and metrics in one pass, without an optimiser step (for inspection)."""
        state = self.prepare(batch) if state is None else state
        step = step or self.steps(state)[0]
        self.begin_step(batch, state, step)
        coef = self.coefficients(batch, state, step)
        return self.compute_loss(batch, slice(0, len(batch)), coef, state, step)

    def update(self, batch: RolloutBatch) -> dict[str, float]:
        """All of this batch's optimiser steps; returns the global metrics of the last step of each kind."""
        from agentgym_opd import distributed as D

        if len(batch) == 0:
            raise ValueError("update: empty batch")
        state = self.prepare(batch)
        metrics: dict[str, float] = D.all_reduce_mean(state.metrics, self.dist) if state.metrics else {}
        taken = skipped = 0
        for step in self.steps(state):
            self.begin_step(batch, state, step)
            step_metrics = self.optimizer_step(batch, state, step)
            if step_metrics.get(SKIPPED):
                skipped += 1
            else:
                taken += 1
                self.after_update(step_metrics, step)
            metrics.update(step_metrics)
        metrics[SKIPPED] = 0.0 if taken else 1.0  # the trainer ticks its scheduler only after a step
        metrics.setdefault("loss", 0.0)  # an empty plan (VPD with nothing to learn) has no step metrics
        metrics[SKIPPED_STEPS] = float(skipped)
        return metrics

    def optimizer_step(self, batch: RolloutBatch, state: BatchState, step: Step) -> dict[str, float]:
        """One step: coefficients once, micro-batched backward, sync, clip every group, optimiser step.

        A batch with no learning signal on any rank (every row masked, every turn Skip, every advantage 0)
        takes NO step: its loss and gradients are 0, but AdamW's momentum and weight decay would still move
        the weights. No forward runs, no optimiser state changes and ``after_update`` is not called (an EMA
        teacher, a dual variable stay put); the metrics say ``update/skipped``."""
        from agentgym_opd import distributed as D

        ctx = self.dist
        coef, signal = self.weigh(batch, state, step)
        if not signal:
            return {"loss": 0.0, SKIPPED: 1.0}
        total = len(batch)
        chunks = [slice(s, min(s + self.micro_batch_size, total)) for s in range(0, total, self.micro_batch_size)]
        model = self.model
        model.train()
        self.optimizer.zero_grad(set_to_none=True)
        sums: dict[str, float] = {"loss": 0.0}
        for index, rows in enumerate(chunks):
            with D.gradient_sync(model, index == len(chunks) - 1):
                loss, parts = self.compute_loss(batch, rows, {k: v[rows] for k, v in coef.items()}, state, step)
                finite = D.all_reduce_sum(float(bool(torch.isfinite(loss.detach()).all())), ctx)
                if finite < ctx.world_size:
                    raise FloatingPointError(f"{type(self).__name__}: non-finite loss on {ctx.world_size - int(finite)}"
                                             f" rank(s) (this rank: {float(loss)}, metrics {parts})")
                (loss * ctx.world_size).backward()
            sums["loss"] += float(loss.detach())
            for key, value in parts.items():
                sums[key] = sums.get(key, 0.0) + float(value)
        D.finish_gradient_sync(model)
        D.sync_extra_gradients(self.optimised_parameters(), model, ctx)
        metrics = D.all_reduce_sum_metrics(sums, ctx)
        if self.grad_clip is not None:
            metrics["grad_norm"] = D.clip_grad_norm(self.optimised_parameters(), self.grad_clip)
        lrs = [group["lr"] for group in self.optimizer.param_groups]
        try:
            for group in self.optimizer.param_groups:
                group["lr"] = group["lr"] * step.lr_scale
            self.optimizer.step()
        finally:  # the next step (and the trainer's scheduler) see the learning rate as it was
            for group, lr in zip(self.optimizer.param_groups, lrs):
                group["lr"] = lr
        model.eval()
        return metrics

    def state_dict(self) -> dict[str, Any]:
        return {"config": dataclasses.asdict(self.config), "optimizer": self.optimizer.state_dict(),
                "extra": self.extra_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.load_extra_state(state.get("extra", {}))
