"""The algorithm interface: one config dataclass and one update step over a batch of episodes.

Why this shape: the trainer loop (``agentgym_opd.trainer``) must run any registered algorithm, built-in or
a plugin's, without knowing its knobs. So an algorithm declares

- ``Config``: a dataclass validated from the run config's ``algo`` section (errors name ``algo.<key>``);
- ``needs_groups`` / ``needs_teacher``: what the trainer must provide (G rollouts per task, a teacher);
- ``compute_loss(batch, rows)``: the method section of its paper, as a scalar loss plus metrics;
- optionally ``collect(...)``: where its training data comes from (default: the student's own on-policy
  rollouts; SFT overrides it with teacher-forced expert episodes).

The base class owns the mechanics every method shares, so each algorithm file shows only what differs:
micro-batching (each micro-batch's loss is weighted by its share of the batch's rows, so the gradient is
the same as one big batch for per-sequence losses, and close to it for token means), gradient clipping,
the optimiser step, and the state (optimiser + ``extra_state``) a checkpoint needs.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Sequence

import torch

from agentgym_opd.rollout import RolloutBatch, RolloutEngine


@dataclass
class AlgorithmConfig:
    """No knobs: the base of every algorithm's config dataclass."""


def sequence_logits(model: Any, batch: RolloutBatch, rows: Sequence[int] | slice) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Next-token logits of the given rows under ``model``, their sampled-token log-probs, and the loss mask.

    Returns ``(logits [b, T-1, V], logp [b, T-1], mask [b, T-1])``: position t holds the distribution of
    ids[t+1] given ids[:t+1], and the mask is 1 exactly where ids[t+1] is an agent-generated token. The
    shift lives here, once, because getting it wrong by one token is the classic silent bug of token-level
    losses. ``T`` is the longest real sequence of these rows (all-padding columns are dropped).
    """
    from agentgym_opd.losses import token_logprobs

    device = next(model.parameters()).device
    ids = batch.input_ids[rows].to(device)
    attention = batch.attention_mask[rows].to(device)
    width = int(attention.sum(dim=1).max())  # drop all-padding columns of this micro-batch
    ids, attention = ids[:, :width], attention[:, :width]
    logits = model(input_ids=ids, attention_mask=attention, use_cache=False).logits.float()[:, :-1]
    logp = token_logprobs(logits, ids[:, 1:])
    mask = batch.loss_mask[rows][:, 1:width].to(device).float()
    return logits, logp, mask


def sequence_logprobs(model: Any, batch: RolloutBatch, rows: Sequence[int] | slice) -> tuple[torch.Tensor, torch.Tensor]:
    """``(logp [b, T-1], mask [b, T-1])`` of :func:`sequence_logits`, for losses that need no full vocabulary."""
    _, logp, mask = sequence_logits(model, batch, rows)
    return logp, mask


class Algorithm:
    """Base class of registered algorithms (see the module docstring)."""

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
    def compute_loss(self, batch: RolloutBatch, rows: slice) -> tuple[torch.Tensor, dict[str, float]]:
        """The method's loss on ``batch[rows]`` (a differentiable scalar) and its detached metrics."""
        raise NotImplementedError

    def collect(self, engine: RolloutEngine, envs: Sequence[Any], tasks: Sequence[str], *, group_size: int,
                seed: int) -> RolloutBatch:
        """The batch one update trains on. Default: the current student's own rollouts (on-policy)."""
        return engine.collect(envs, tasks, group_size=group_size, seed=seed)

    def after_update(self) -> None:
        """Called after each optimiser step (an EMA teacher moves here)."""

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

    def update(self, batch: RolloutBatch) -> dict[str, float]:
        """One optimiser step on ``batch``; returns the metrics averaged over micro-batches like the loss.

        Micro-batch ``m`` of a token-mean loss is weighted by its share of the batch's loss tokens (of the
        rows, for per-sequence aggregations), so the step is the full batch's gradient whatever
        ``micro_batch_size`` is, and, under torchrun (``self.dist`` set by the Trainer), the global batch's
        across ranks: :func:`agentgym_opd.distributed.distributed_update` is the one implementation."""
        from agentgym_opd.distributed import distributed_update

        return distributed_update(self, batch, self.dist)

    def state_dict(self) -> dict[str, Any]:
        return {"config": dataclasses.asdict(self.config), "optimizer": self.optimizer.state_dict(),
                "extra": self.extra_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.load_extra_state(state.get("extra", {}))
