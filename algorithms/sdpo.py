"""SDPO: self-distillation from feedback and successful siblings.

Teacher: an EMA of the student's own network (rate ``algo.ema_rate``, 0.05), shown after the first
observation: a successful sibling rollout of the same task from the same group (another rollout, never
the episode itself) as its action trace, and the environment's textual feedback on this attempt, then an
instruction to solve the original task correctly. Data: G on-policy rollouts per task (``needs_groups``).

Signal: per agent token, the divergence between the student (no context) and the teacher (with it) on
the student's exact tokens; top-M on the student's support is SDPO's own choice (``algo.top_m``).
A rollout with neither a successful sibling nor feedback has nothing to learn from and is masked out.
With ``algo.distill_weight = w < 1`` the loss is ``(1 - w) * L_GRPO + w * L_distill`` (GRPO's clipped,
group-normalised outcome term on the same rollouts).

Why it works: failure feedback and a sibling's success turn an outcome reward into a dense, per-token
correction the student's own network can already express (it reads the hint), so even groups whose
rewards are all equal (no GRPO signal) still teach through their feedback.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from agentgym_opd.config import constrained
from agentgym_opd.distill import (DistillConfig, DistillationAlgorithm, SelfTeacher, TeacherInputs, actions_block,
                                  episode_actions, with_context)
from agentgym_opd.losses import aggregate_token_loss, clipped_policy_gradient_loss, group_advantages
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


def successful_sibling(batch: RolloutBatch, row: int) -> int | None:
    """Another row of the same group that succeeded (the highest-return one), or None."""
    group = int(batch.group_ids[row])
    best = None
    for other, episode in enumerate(batch.episodes):
        if other != row and int(batch.group_ids[other]) == group and episode.success:
            if best is None or episode.return_ > batch.episodes[best].return_:
                best = other
    return best


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
        if self.config.use_feedback and not episode.success and episode.feedback:
            parts.append("Feedback on your previous attempt: " + episode.feedback)
        if not parts:
            return None
        return with_context(parts + [INSTRUCTION])

    def teacher_logits(self, inputs: TeacherInputs, width: int) -> torch.Tensor:
        return self.self_teacher.logits(inputs, width)

    def compute_loss(self, batch: RolloutBatch, rows: slice) -> tuple[torch.Tensor, dict[str, float]]:
        per_token, mask, student_logits, teacher_logits, student_logp = self.distillation_terms(batch, rows)
        w = self.config.distill_weight
        distill = aggregate_token_loss(per_token, mask, self.config.aggregation) if mask.sum() > 0 \
            else student_logits.sum() * 0.0  # type: ignore[arg-type]
        kept = float((mask.sum(dim=1) > 0).float().mean())
        metrics = {"distill_loss": float(distill.detach()), "masked_fraction": 1.0 - kept}
        if mask.sum() > 0:
            from agentgym_opd.distill import reverse_kl_per_token

            metrics["kl"] = float(reverse_kl_per_token(student_logits, teacher_logits, mask).sum() / mask.sum())
        if w >= 1.0:
            return distill, metrics
        agent_mask = batch.loss_mask[rows][:, 1: student_logp.shape[1] + 1].to(student_logp.device).float()
        advantages = group_advantages(batch.rewards.float(), batch.group_ids)[rows].to(student_logp.device)
        old = batch.behaviour_logprobs[rows][:, 1: student_logp.shape[1] + 1].to(student_logp.device)
        pg, _ = clipped_policy_gradient_loss(student_logp, old, advantages, agent_mask, eps_low=self.config.eps_low,
                                             aggregation=self.config.aggregation)  # type: ignore[arg-type]
        metrics["pg_loss"] = float(pg.detach())
        return (1.0 - w) * pg + w * distill, metrics

    def after_update(self) -> None:
        self.self_teacher.after_update()

    def extra_state(self) -> dict[str, Any]:
        return {"self_teacher": self.self_teacher.state_dict()}

    def load_extra_state(self, state: dict[str, Any]) -> None:
        self.self_teacher.load_state_dict(state.get("self_teacher", {}))
