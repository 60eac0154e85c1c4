"""GRPO: outcome reward, group-normalised advantages, clipped ratio, optional k3 KL to a reference.

Teacher: none. Data: G on-policy rollouts of each task (``needs_groups``). Signal, per rollout i of a group:

- reward ``R_i`` = the episode's return (the env's outcome reward; household pays 1 on success);
- advantage ``A_i = (R_i - mean_g R) / (std_g R + eps)`` (``scale_by_std=False``: Dr. GRPO's ``R_i - mean``),
  given to every agent token of rollout i; context tokens (prompt, observations) carry no loss;
- ``rho_t = exp(log pi(y_t) - log pi_old(y_t))`` against the behaviour log-probs recorded at sampling time,
  both in the distribution sampled from, ``softmax(logits / T)`` at the rollout's temperature
  (``RolloutBatch.logprob_temperature``; TRL's and verl's convention), so rho starts at 1;
  ``loss_t = -min(rho_t A_i, clip(rho_t, 1 - eps_low, 1 + eps_high) A_i)``;
- plus ``kl_coef * k3(pi || pi_ref)`` per token, where the reference is the adapter-off network when the
  student is LoRA (free: same weights, no copy) and otherwise a frozen copy of the initial student, made
  only when ``kl_coef > 0`` (the default is 0, as in most recent GRPO recipes).

A group whose rewards are all equal has advantage 0 and teaches nothing; ``zero_advantage_fraction``
reports how much of the batch that was, the first thing to look at when GRPO does not move.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

import torch

from agentgym_opd.algorithm import Algorithm, BatchState, LossTerm, Step, sequence_logprobs, weighted_sum
from agentgym_opd.config import constrained
from agentgym_opd.losses import clipped_policy_gradient_per_token, group_advantages, k3_kl
from agentgym_opd.rollout import RolloutBatch


@dataclass
class GRPOConfig:
    """Knobs of GRPO (defaults as in the GRPO/DAPO papers' common setting)."""

    eps_low: float = constrained(0.2, ge=0, help="lower clip range of the ratio")
    eps_high: float | None = constrained(None, help="upper clip range; None = eps_low (DAPO clip-higher: 0.28)")
    scale_by_std: bool = constrained(True, help="divide advantages by the group std (False = Dr. GRPO)")
    aggregation: str = constrained("token_mean", choices=("token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"))
    kl_coef: float = constrained(0.0, ge=0, help="weight of the k3 KL to the reference")
    reference: str = constrained("auto", choices=("auto", "adapter_off", "frozen_copy"),
                                 help="KL reference: auto = adapter_off for LoRA students, else frozen_copy")


@dataclass
class GRPOState(BatchState):
    """The batch's group-normalised advantages, one per row."""

    advantages: torch.Tensor = field(default_factory=lambda: torch.zeros(0))


class GRPO(Algorithm):
    """Group-relative policy optimisation: outcome reward, group-normalised advantage, clipped ratio."""

    Config = GRPOConfig
    needs_groups = True

    def __init__(self, config: Any, student: Any, teacher: Any = None, **kwargs: Any):
        super().__init__(config, student, teacher, **kwargs)
        self._reference: Any = None
        if self.config.kl_coef > 0:
            kind = self.config.reference
            if kind == "auto":
                kind = "adapter_off" if getattr(student, "is_lora", False) else "frozen_copy"
            if kind == "adapter_off" and not getattr(student, "is_lora", False):
                raise ValueError("algo.reference=adapter_off needs a LoRA student (model.lora_rank > 0)")
            if kind == "frozen_copy":
                self._reference = copy.deepcopy(self.model).eval().requires_grad_(False)

    def _reference_logprobs(self, batch: RolloutBatch, rows: slice) -> torch.Tensor:
        """The reference's log-probs at the rollout's temperature (as the policy's in the KL term)."""
        temperature = batch.logprob_temperature
        with torch.no_grad():
            if self._reference is not None:
                return sequence_logprobs(self._reference, batch, rows, temperature)[0]
            with self.student.adapter_disabled():
                return sequence_logprobs(self.model, batch, rows, temperature)[0]

    def prepare(self, batch: RolloutBatch) -> GRPOState:
        advantages = group_advantages(batch.rewards.float(), batch.group_ids, scale_by_std=self.config.scale_by_std)
        return GRPOState(metrics={"advantage_abs_mean": float(advantages.abs().mean()),
                                  "zero_advantage_fraction": float((advantages.abs() < 1e-8).float().mean())},
                         advantages=advantages)

    def token_weights(self, batch: RolloutBatch, state: GRPOState, step: Step) -> dict[str, LossTerm]:
        """Every agent token (the aggregation's normaliser counts them all); without the KL term a row of
        advantage 0 has a loss of 0, so a batch whose advantages are all 0 teaches nothing (no step)."""
        terms = super().token_weights(batch, state, step)
        if self.config.kl_coef == 0:
            terms["loss"].row_factor = state.advantages
        return terms

    def compute_loss(self, batch: RolloutBatch, rows: slice, coef: dict[str, torch.Tensor], state: GRPOState,
                     step: Step) -> tuple[torch.Tensor, dict[str, float]]:
        logp, mask = sequence_logprobs(self.model, batch, rows, batch.logprob_temperature)  # the sampler's T
        logp_old = batch.behaviour_logprobs[rows][:, 1: 1 + logp.shape[1]].to(logp.device)
        per_token, parts = clipped_policy_gradient_per_token(logp, logp_old, state.advantages[rows].to(logp.device),
                                                             eps_low=self.config.eps_low, eps_high=self.config.eps_high)
        c = coef["loss"]
        loss = weighted_sum(per_token, c)
        metrics = {"pg_loss": float(loss.detach()), **{k: float(weighted_sum(v, c)) for k, v in parts.items()}}
        if self.config.kl_coef > 0:
            kl = weighted_sum(k3_kl(logp, self._reference_logprobs(batch, rows), mask), c)
            loss = loss + self.config.kl_coef * kl
            metrics["kl"] = float(kl.detach())
        return loss, metrics

    def extra_state(self) -> dict[str, Any]:
        return {"reference": self._reference.state_dict()} if self._reference is not None else {}

    def load_extra_state(self, state: dict[str, Any]) -> None:
        if self._reference is not None and "reference" in state:
            self._reference.load_state_dict(state["reference"])
