"""OPD: on-policy distillation from a separate, stronger teacher.

Teacher: a separate frozen model (``--teacher PATH``) sharing the student's tokenizer. Data: the student's
own rollouts (on-policy: the states the student reaches, not the expert's). Signal, per agent token t of
every turn of every rollout:

- the teacher re-scores the student's exact tokens given the same history (no extra context);
- ``loss_t = KL(p_S(. | h_t) || p_T(. | h_t))``, the per-token reverse KL (mode-seeking: the student
  moves its mass onto what the teacher would say, where the student itself went);
- over the full vocabulary, or top-M plus a tail bucket (``algo.top_m``), or the sampled-token estimator
  ``stopgrad(log p_S(y_t) - log p_T(y_t)) * log p_S(y_t)`` (``algo.estimator=sampled``).

The reward plays no part: the teacher's distribution is a dense, per-token signal, which is why OPD
needs far fewer rollouts than outcome-reward RL when a good teacher exists.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from agentgym_opd.distill import (AlignedTeacher, DistillConfig, DistillationAlgorithm, TeacherInputs,
                                  aligned_teacher_hidden, aligned_teacher_logits)
from agentgym_opd.rollout import RolloutBatch


@dataclass
class OPDConfig(DistillConfig):
    """OPD's knobs are the shared divergence knobs (reverse KL over the full vocabulary by default)."""


def check_same_tokenizer(student: Any, teacher: Any) -> None:
    """The teacher must score the student's token ids as the same tokens: refuse a different vocabulary."""
    s_vocab, t_vocab = student.tokenizer.get_vocab(), teacher.tokenizer.get_vocab()
    if s_vocab != t_vocab:
        differ = len(set(s_vocab.items()) ^ set(t_vocab.items()))
        raise ValueError(f"teacher and student tokenizers differ ({len(s_vocab)} vs {len(t_vocab)} tokens, "
                         f"{differ} entries differ): on-policy distillation re-scores the student's token ids, "
                         "so pick a teacher of the same model family (same tokenizer)")
    if not hasattr(teacher, "model"):  # a served teacher ships log-probs by id: the tokenizer check suffices
        return
    s_out = student.model.get_output_embeddings().weight.shape[0]
    t_out = teacher.model.get_output_embeddings().weight.shape[0]
    if s_out != t_out:
        raise ValueError(f"teacher logits have {t_out} entries, the student's {s_out}: same tokenizer, but the "
                         "output layers are padded differently; the divergence needs one vocabulary")


class OPD(DistillationAlgorithm):
    """On-policy distillation: a separate teacher re-scores the student's tokens; per-token reverse KL."""

    Config = OPDConfig
    needs_teacher = True

    def __init__(self, config: Any, student: Any, teacher: Any = None, **kwargs: Any):
        super().__init__(config, student, teacher, **kwargs)
        check_same_tokenizer(student, teacher)
        if hasattr(self.teacher, "model"):  # in process; else a served teacher (model.teacher_backend=vllm)
            self.teacher.model.eval().requires_grad_(False)

    def teacher_context(self, batch: RolloutBatch, row: int) -> str | None:
        return ""  # the same history, nothing more: the teacher is better by itself

    def teacher_logits(self, inputs: TeacherInputs, width: int) -> torch.Tensor:
        return aligned_teacher_logits(self.teacher.model, inputs, width)

    def teacher_hidden(self, inputs: TeacherInputs, width: int) -> AlignedTeacher | None:
        return aligned_teacher_hidden(self.teacher.model, inputs, width) if hasattr(self.teacher, "model") else None

    def teacher_scorer(self) -> Any:
        return None if hasattr(self.teacher, "model") else self.teacher  # a served teacher: its `score`
