"""SDPO: self-distillation from feedback and successful siblings.

Teacher: an EMA of the student's own network (rate ``algo.ema_rate``, 0.05), shown after the first
observation: a successful sibling rollout of the same task (another rollout of the batch, never the
episode itself) as its action trace, and the environment's feedback on this failed attempt (its textual
feedback, or where it gave none, the execution errors the turns recorded:
:func:`agentgym_opd.distill.attempt_feedback`, shared with VPD), then an instruction to solve the original
task correctly. Data: G on-policy rollouts per task (``needs_groups``).

Signal: per agent token, the divergence between the student (no context) and the teacher (with it) on
the student's exact tokens; top-M on the student's support is SDPO's own choice (``algo.top_m``).
A rollout with neither a successful sibling nor feedback has nothing to learn from and is masked out.
With ``algo.distill_weight = w < 1`` the loss is ``(1 - w) * L_GRPO + w * L_distill`` (GRPO's clipped,
group-normalised outcome term on the same rollouts; its ratio in the distribution sampled from, at the
rollout's temperature, as :mod:`algorithms.grpo`).

Why it works: failure feedback and a sibling's success turn an outcome reward into a dense, per-token
correction the student's own network can already express (it reads the hint), so even groups whose
rewards are all equal (no GRPO signal) still teach through their feedback.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from agentgym_opd.config import constrained
from agentgym_opd.algorithm import LossTerm, Step, agent_mask, weighted_sum
from agentgym_opd.distill import (AlignedTeacher, DistillConfig, DistillState, DistillationAlgorithm, SelfTeacher,
                                  TeacherInputs, actions_block, attempt_feedback, distill_metrics, episode_actions,
                                  successful_sibling, with_context)
from agentgym_opd.losses import clipped_policy_gradient_per_token, group_advantages
from agentgym_opd.rollout import RolloutBatch

INSTRUCTION = "Solve the original task correctly."


@dataclass
class SDPOConfig(DistillConfig):
    teacher: str = constrained("ema", choices=("frozen", "ema", "live"), help="which weights the self-teacher uses")
    ema_rate: float = constrained(0.05, gt=0, le=1, help="EMA step of the teacher after each update")
    use_feedback: bool = constrained(True, help="show the env's feedback on this attempt (failed rollouts)")
    use_sibling: bool = constrained(True, help="show a successful sibling rollout of the same task")
    distill_weight: float = constrained(1.0, ge=0, le=1, help="w in (1 - w) * GRPO + w * distillation")
    eps_low: float = constrained(0.2, ge=0, help="GRPO clip range (used when distill_weight < 1)")


@dataclass
class SDPOState(DistillState):
    """The distillation state plus GRPO's advantages when the loss mixes in the policy-gradient term."""

    advantages: torch.Tensor | None = None


class SDPO(DistillationAlgorithm):
    """Self-distillation: the EMA self-teacher sees feedback and a successful sibling."""

    Config = SDPOConfig
    needs_groups = True

    def __init__(self, config: Any, student: Any, teacher: Any = None, **kwargs: Any):
        super().__init__(config, student, teacher, **kwargs)
        self.self_teacher = SelfTeacher(student, self.config.teacher, self.config.ema_rate)

    def teacher_context(self, batch: RolloutBatch, row: int) -> str | None:
        episode = batch.episodes[row]
        parts = []
        sibling = successful_sibling(batch, row) if self.config.use_sibling else None
        if sibling is not None:
            parts.append("A successful attempt at this task. " + actions_block(episode_actions(batch.episodes[sibling])))
        feedback = attempt_feedback(episode) if self.config.use_feedback and not episode.success else None
        if feedback:
            parts.append("Feedback on your previous attempt: " + feedback)
        if not parts:
            return None
        return with_context(parts + [INSTRUCTION])

    def teacher_logits(self, inputs: TeacherInputs, width: int) -> torch.Tensor:
        return self.self_teacher.logits(inputs, width)

    def teacher_hidden(self, inputs: TeacherInputs, width: int) -> AlignedTeacher:
        return self.self_teacher.hidden(inputs, width)

    def prepare(self, batch: RolloutBatch) -> SDPOState:
        state = super().prepare(batch)
        advantages = group_advantages(batch.rewards.float(), batch.group_ids) if self.config.distill_weight < 1 else None
        return SDPOState(metrics=state.metrics, contexts=state.contexts, advantages=advantages)

    def token_weights(self, batch: RolloutBatch, state: SDPOState, step: Step) -> dict[str, LossTerm]:
        terms = super().token_weights(batch, state, step)
        if self.config.distill_weight < 1:  # the policy-gradient term learns from every agent token
            terms["pg"] = LossTerm(agent_mask(batch), self.config.aggregation, row_factor=state.advantages)
        return terms

    def compute_loss(self, batch: RolloutBatch, rows: slice, coef: dict[str, torch.Tensor], state: SDPOState,
                     step: Step) -> tuple[torch.Tensor, dict[str, float]]:
        """``(1 - w) * L_GRPO + w * L_distill`` (w = ``distill_weight``; w = 1: distillation only)."""
        terms = self.chunked_terms(batch, rows, state)
        if terms is not None:
            distill = weighted_sum(terms.per_token, coef["distill"])
            metrics = {"distill_loss": float(distill.detach()), "kl": float(weighted_sum(terms.kl, coef["distill"]))}
            student_logp = terms.student_logp
        else:
            per_token, mask, student_logits, teacher_logits, student_logp = self.distillation_terms(batch, rows, state)
            distill = weighted_sum(per_token, coef["distill"])
            metrics = distill_metrics(distill, student_logits, teacher_logits, mask, coef["distill"])
        w = self.config.distill_weight
        if w >= 1.0:
            return distill, metrics
        old = batch.behaviour_logprobs[rows][:, 1: student_logp.shape[1] + 1].to(student_logp.device)
        advantages = state.advantages[rows].to(student_logp.device)
        pg_token, parts = clipped_policy_gradient_per_token(student_logp, old, advantages, eps_low=self.config.eps_low)
        pg = weighted_sum(pg_token, coef["pg"])
        metrics["pg_loss"] = float(pg.detach())
        metrics.update({f"pg_{k}": float(weighted_sum(v, coef["pg"])) for k, v in parts.items()})
        return (1.0 - w) * pg + w * distill, metrics

    def after_update(self, metrics: dict[str, float], step: Step) -> None:
        self.self_teacher.after_update()

    def extra_state(self) -> dict[str, Any]:
        return {"self_teacher": self.self_teacher.state_dict()}

    def load_extra_state(self, state: dict[str, Any]) -> None:
        self.self_teacher.load_state_dict(state.get("self_teacher", {}))
