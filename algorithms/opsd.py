"""OPSD: on-policy self-distillation with privileged context.

Teacher: the student's own network shown the task's ``privileged`` context (the expert walkthrough, the
gold answer, the reference solution) after the first observation, with a short transition line. The
teacher is ``frozen`` (the initial weights: adapter off for LoRA), ``ema`` (a slow copy) or ``live``
(the current weights), by ``algo.teacher``. Data: the student's own rollouts. Signal: per agent token,
the divergence between the student (no context) and the self-teacher (with context) on the student's
exact tokens; with ``algo.top_m > 0`` the support is the teacher's top-M, renormalised over those M
entries (no tail bucket), as OPSD's paper and code do.

Why it can work without a stronger model: reading the answer is easier than finding it, so the same
network with the solution in view is a better policy on the student's own states, and the student
learns to act as if it knew. A task without privileged context cannot teach: its rows are masked out
(``masked_fraction``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from agentgym_opd.algorithm import Step
from agentgym_opd.config import constrained
from agentgym_opd.distill import (AlignedTeacher, DistillConfig, DistillationAlgorithm, SelfTeacher, TeacherInputs,
                                  privileged_text)
from agentgym_opd.rollout import RolloutBatch


@dataclass
class OPSDConfig(DistillConfig):
    teacher: str = constrained("frozen", choices=("frozen", "ema", "live"), help="which weights the self-teacher uses")
    ema_rate: float = constrained(0.05, gt=0, le=1, help="EMA step for teacher=ema")
    top_m_support: str = constrained("teacher", choices=("student", "teacher"), help="whose top-M ids hold the support")
    tail: bool = constrained(False, help="top-M: add a remaining-mass bucket (OPSD's paper: no, renormalise over M)")


class OPSD(DistillationAlgorithm):
    """On-policy self-distillation: the student's own network with privileged context is the teacher."""

    Config = OPSDConfig

    def __init__(self, config: Any, student: Any, teacher: Any = None, **kwargs: Any):
        super().__init__(config, student, teacher, **kwargs)
        self.self_teacher = SelfTeacher(student, self.config.teacher, self.config.ema_rate)

    def teacher_context(self, batch: RolloutBatch, row: int) -> str | None:
        return privileged_text(batch.episodes[row].task)

    def teacher_logits(self, inputs: TeacherInputs, width: int) -> torch.Tensor:
        return self.self_teacher.logits(inputs, width)

    def teacher_hidden(self, inputs: TeacherInputs, width: int) -> AlignedTeacher | None:
        return self.self_teacher.hidden(inputs, width)

    def after_update(self, metrics: dict[str, float], step: Step) -> None:
        self.self_teacher.after_update()

    def extra_state(self) -> dict[str, Any]:
        return {"self_teacher": self.self_teacher.state_dict()}

    def load_extra_state(self, state: dict[str, Any]) -> None:
        self.self_teacher.load_state_dict(state.get("self_teacher", {}))
