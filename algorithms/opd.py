"""OPD: on-policy distillation from a separate, stronger teacher.

Teacher: a separate frozen model (``--teacher PATH``). With the student's tokenizer it scores the student's
very ids (below); with another tokenizer the run takes the cross-tokenizer path by itself and says so
(:mod:`agentgym_opd.cross_tokenizer`: the teacher re-reads the student's exact text in its own tokens and the
divergence is taken on merged spans; what is exact and what approximated is written there). Several teachers
(``--teacher NAME=PATH`` repeated) split the batch by a routing rule (:mod:`agentgym_opd.teachers`). Data: the student's
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

import contextlib
import sys
from dataclasses import dataclass
from typing import Any, Iterator

import torch

from agentgym_opd.algorithm import Step
from agentgym_opd.distill import (AlignedTeacher, DistillConfig, DistillationAlgorithm, DistillState, TeacherInputs,
                                  aligned_teacher_hidden, aligned_teacher_logits)
from agentgym_opd.config import constrained
from agentgym_opd.cross_tokenizer import MODES, CrossTokenizerTeacher, needs_cross_tokenizer
from agentgym_opd.rollout import RolloutBatch
from agentgym_opd.teachers import TeacherSet, routed_loss, token_shares


@dataclass
class OPDConfig(DistillConfig):
    """OPD's knobs are the shared divergence knobs (reverse KL over the full vocabulary by default), and when a
    teacher of another tokenizer is scored on merged spans."""

    cross_tokenizer: str = constrained("auto", choices=MODES, help=(
        "auto = a teacher with another tokenizer re-scores the student's text on merged spans, the same "
        "tokenizer scores its ids; always = merged spans even for the same tokenizer; off = refuse another tokenizer"))


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
    supports_teacher_set = True  # model.teachers: several teachers, each task routed to one

    def __init__(self, config: Any, student: Any, teacher: Any = None, **kwargs: Any):
        super().__init__(config, student, teacher, **kwargs)
        self.teacher_set = teacher if isinstance(teacher, TeacherSet) else None
        members = self.teacher_set.teachers if self.teacher_set is not None else {"": teacher}
        self.cross_teachers = {name: self.teacher_path(name, member) for name, member in members.items()}
        self.cross = self.cross_teachers.get("")  # None: the same-tokenizer path

    def teacher_path(self, name: str, teacher: Any) -> CrossTokenizerTeacher | None:
        """The cross-tokenizer wrapper of a teacher whose tokenizer differs (said on stderr), or None after the
        same-tokenizer checks."""
        if needs_cross_tokenizer(self.student, teacher, self.config.cross_tokenizer):
            cross = CrossTokenizerTeacher(self.student, teacher, self.config)
            print(f"{type(self).__name__.lower()}: teacher{' ' + name if name else ''}: {cross.describe()}",
                  file=sys.stderr, flush=True)
        else:
            check_same_tokenizer(self.student, teacher)
            cross = None
        if hasattr(teacher, "model"):  # in process; else a served teacher (model.teacher_backend=vllm)
            teacher.model.eval().requires_grad_(False)
        return cross

    @contextlib.contextmanager
    def routed_to(self, name: str) -> Iterator[None]:
        """Within the block this is a single-teacher OPD whose teacher is ``name`` of the set (and its path)."""
        saved = self.teacher, self.cross, self.teacher_set
        members = self.teacher_set.teachers  # type: ignore[union-attr]
        self.teacher, self.cross = members[name], self.cross_teachers[name]
        self.teacher_set = None
        try:
            yield
        finally:
            self.teacher, self.cross, self.teacher_set = saved

    def prepare(self, batch: RolloutBatch) -> DistillState:
        state = super().prepare(batch)
        if self.teacher_set is not None:
            state.metrics.update(token_shares(batch, self.teacher_set.route(batch.episodes), self.teacher_set.names(),
                                              self.dist))
        return state

    def compute_loss(self, batch: RolloutBatch, rows: slice, coef: dict[str, torch.Tensor], state: DistillState,
                     step: Step) -> tuple[torch.Tensor, dict[str, float]]:
        if self.teacher_set is not None:
            return routed_loss(self, batch, rows, coef, state, step)
        if self.cross is not None:
            return self.cross.compute_loss(self.model, batch, rows, coef["distill"], state.contexts[rows])
        return super().compute_loss(batch, rows, coef, state, step)

    def teacher_context(self, batch: RolloutBatch, row: int) -> str | None:
        return ""  # the same history, nothing more: the teacher is better by itself

    def teacher_logits(self, inputs: TeacherInputs, width: int) -> torch.Tensor:
        return aligned_teacher_logits(self.teacher.model, inputs, width)

    def teacher_hidden(self, inputs: TeacherInputs, width: int) -> AlignedTeacher | None:
        return aligned_teacher_hidden(self.teacher.model, inputs, width) if hasattr(self.teacher, "model") else None

    def teacher_scorer(self) -> Any:
        return None if hasattr(self.teacher, "model") else self.teacher  # a served teacher: its `score`
