"""SAGE-OPD: selective, turn-level on-policy distillation from a separate teacher.

Teacher: a separate frozen model (``--teacher PATH``), exactly as in :mod:`algorithms.opd`; it re-scores the
student's own tokens given the same history (a teacher of another tokenizer: its own tokens of the student's
text, on merged spans, and its turn confidence is its mean top-1 probability over its own tokens of the turn).
What SAGE-OPD adds is *which turns* of a multi-turn rollout the student learns from, and how much.

1. **Segment** each student episode into turns by the env's turn boundaries: every agent token carries
   its turn index (``RolloutBatch.turn_index``) and ``Episode.turns[k].error`` is the env's
   ``StepError`` of turn k.
2. **Label** every turn ``z_t`` in {Skip, Weak, Strong}, importance ``i_t`` in {0, alpha, 1}:

   - a turn whose env answer is an execution error of the agent (``invalid_action``, ``parse_error``,
     ``tool_error``, ``runtime_error``) is **Strong** at once: the environment has already said it went
     wrong, so the teacher is not asked;
   - every other turn is judged by the **teacher**: its own chat template renders the history up to and
     including the turn's action and the env's answer / feedback, and asks for exactly one of the labels.
     All such turns of the batch go to ONE greedy ``teacher.generate`` call (``algo.judge_max_new_tokens``
     tokens). The answer is read by :func:`algorithms.sage_judge.parse_verdict` (after any ``</think>``;
     case, punctuation, the first label word that occurs). An unreadable verdict gets ``algo.default_label``.
     The judge (prompt, transcript, verdict parsing) lives in :mod:`algorithms.sage_judge`.
   - ``algo.judge=teacher_scored`` asks the same question and takes the label whose first token the teacher
     finds likeliest (its answer constrained to the three words): a verdict for every turn from a teacher too
     small to answer in words.
   - ``algo.judge=errors_only`` skips the judge call: non-error turns get ``algo.default_label``
     (a tiny teacher's verdicts are noise; this keeps the error-first selection and the confidence).
3. **Confidence** ``c_t = (1/|a_t|) sum_i max_v p_T(v | h_t, a_{t,<i})``: the teacher's mean top-1
   probability over the turn's student tokens, from the same aligned logits the divergence uses.
4. **Selective weight** ``s_t = i_t * c_t``, detached (a weight, never optimised).
5. **Loss** ``L = Z * sum_t s_t * L_OPD(turn t)``, ``L_OPD(turn t)`` the sum of the per-token OPD
   divergence over the turn's tokens (:func:`agentgym_opd.distill.distillation_per_token`, reverse KL by
   default). ``Z = N / sum_tokens s_turn(token)`` with ``N`` the number of agent tokens: the weighted
   token count then equals standard OPD's, so with ``aggregation=token_mean`` the loss is the
   ``s``-weighted token mean ``sum s*l / sum s`` and a batch of all-Strong, fully confident turns gives
   exactly OPD's loss. The weights and Z are decided for the whole batch before micro-batching (one
   no-grad teacher pass gives the confidences), so the step does not depend on how the batch is cut.

Why it should help: OPD spends the same gradient on every token, including routine turns where student
and teacher already agree and turns where the teacher itself is unsure. Weighting the turns that went
wrong (execution errors first), the ones a teacher calls decisive, and the positions where the teacher is
confident concentrates the dense signal where it corrects behaviour.

Decisions: an unreadable verdict gets ``algo.default_label`` (Weak: no evidence either way), and the share
of such turns is logged (``judge_defaulted_share``) with a warning above ``algo.defaulted_warn_share``;
faults of the environment (``env_crash``, ``timeout``) are not the agent's error, so those turns are
judged like clean ones; the judge's chat template is rendered with thinking off
(``algo.judge_thinking``) and its answer read after any ``</think>``.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Sequence

import torch

from agentgym_opd.algorithm import LossTerm, Step, agent_mask
from agentgym_opd.config import constrained
from agentgym_opd.distill import AlignedTeacher, DistillState, TeacherInputs, aligned_teacher_scores
from agentgym_opd.policy.hf import chunk_positions, output_head
from agentgym_opd.rollout import RolloutBatch
from algorithms.opd import OPD, OPDConfig
from algorithms.sage_judge import (AGENT_ERRORS, JUDGE_QUESTION, JUDGE_SYSTEM, LABELS,  # noqa: F401 (re-exported)
                                   NEGATIONS, TurnVerdicts, agent_error, error_first_verdicts, judge_prompt,
                                   judge_template, judge_turns, parse_verdict, transcript)


@dataclass
class SAGEOPDConfig(OPDConfig):
    """OPD's divergence knobs plus the turn selection."""

    alpha: float = constrained(0.5, ge=0, le=1, help="importance of a Weak turn (Skip = 0, Strong = 1)")
    judge: str = constrained("teacher", choices=("teacher", "teacher_scored", "errors_only"), help=(
        "who labels non-error turns: the teacher's answer in words, the teacher's likeliest label word "
        "(teacher_scored: its answer constrained to Skip/Weak/Strong), or nobody (they get default_label)"))
    default_label: str = constrained("weak", choices=LABELS,
                                     help="label of an unreadable verdict, and of non-error turns under errors_only")
    judge_max_new_tokens: int = constrained(16, ge=1, help="tokens the teacher may spend on a verdict (greedy)")
    judge_thinking: bool = constrained(False, help="render the judge prompt with the template's thinking mode on")
    defaulted_warn_share: float = constrained(0.2, ge=0, le=1,
                                              help="warn when more than this share of judged turns gets default_label")
    judge_history_turns: int = constrained(6, ge=0, help="earlier turns shown to the judge before the judged one")
    judge_max_prompt_tokens: int = constrained(1536, ge=64, help="longest judge prompt; older history is dropped first")
    use_confidence: bool = constrained(True, help="multiply by the teacher's mean top-1 probability (False: c_t = 1)")


# ----------------------------------------------------------------------------------------------------
# The weights and the loss: pure functions of tensors
# ----------------------------------------------------------------------------------------------------


def label_importance(label: str, alpha: float) -> float:
    """``i_t``: Skip -> 0, Weak -> alpha, Strong -> 1."""
    return {"skip": 0.0, "weak": float(alpha), "strong": 1.0}[label]


def token_importance(turn_of: torch.Tensor, mask: torch.Tensor, turn_weights: Sequence[Sequence[float]]) -> torch.Tensor:
    """Each agent token gets its turn's weight: ``turn_of [b, T]`` (turn index, -1 off turns), ``mask [b, T]``,
    ``turn_weights[row][k]``. Zero off the mask."""
    width = max([len(w) for w in turn_weights] + [1])
    table = torch.zeros((len(turn_weights), width), dtype=torch.float32, device=turn_of.device)
    for row, weights in enumerate(turn_weights):
        if weights:
            table[row, : len(weights)] = torch.tensor(list(weights), dtype=torch.float32)
    on = (mask > 0) & (turn_of >= 0)
    lengths = torch.tensor([len(w) for w in turn_weights], device=turn_of.device)
    if bool((turn_of >= lengths[:, None])[on].any()):
        raise ValueError("a token's turn index has no weight: the verdicts do not match the batch's turns")
    return torch.where(on, table.gather(1, turn_of.clamp(0, width - 1)), torch.zeros((), device=turn_of.device))


def turn_confidence(teacher_logits: torch.Tensor, turn_of: torch.Tensor,
                    mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Teacher confidence per turn, broadcast to its tokens.

    ``c_t`` = mean over the turn's masked tokens of ``max_v p_T(v)`` (computed as ``exp(max - logsumexp)``,
    so no second ``[b, T, V]`` tensor). Returns ``(token_confidence [b, T], turn_mean [b, K], present [b, K])``,
    detached; ``present`` marks the turns that have masked tokens (``turn_mean`` is 0 elsewhere).
    """
    with torch.no_grad():
        return confidence_per_turn(top1_probability(teacher_logits.detach().float()), turn_of, mask)


def top1_probability(logits: torch.Tensor) -> torch.Tensor:
    """``max_v p(v)`` per position of ``[b, T, V]`` logits, as ``exp(max - logsumexp)``."""
    return torch.exp(logits.amax(dim=-1) - torch.logsumexp(logits, dim=-1))


def chunked_top1_probability(teacher: AlignedTeacher) -> torch.Tensor:
    """:func:`top1_probability` of an aligned teacher, made a chunk of positions at a time (no ``[b, T, V]``)."""
    b, length = teacher.hidden.shape[:2]
    step = chunk_positions(b, output_head(teacher.network).weight.shape[0])
    return torch.cat([top1_probability(teacher.logits(start, min(start + step, length)))
                      for start in range(0, length, step)], dim=1)


def confidence_per_turn(top1: torch.Tensor, turn_of: torch.Tensor,
                        mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`turn_confidence` from the per-position top-1 probabilities ``[b, T]``."""
    with torch.no_grad():
        on = ((mask > 0) & (turn_of >= 0)).float()
        index = turn_of.clamp(min=0)
        width = int(index.max()) + 1 if index.numel() else 1
        sums = torch.zeros((turn_of.shape[0], width), device=top1.device).scatter_add_(1, index, top1 * on)
        counts = torch.zeros_like(sums).scatter_add_(1, index, on)
        turn_mean = torch.where(counts > 0, sums / counts.clamp(min=1), torch.zeros_like(sums))
        return turn_mean.gather(1, index) * on, turn_mean, counts > 0


def turn_weights(verdicts: TurnVerdicts, alpha: float) -> list[list[float]]:
    """``i_t`` of every turn of every row."""
    return [[label_importance(label, alpha) for label in row] for row in verdicts.labels]


# ----------------------------------------------------------------------------------------------------
# The algorithm
# ----------------------------------------------------------------------------------------------------


@dataclass
class SAGEState(DistillState):
    """The batch's turn verdicts and the per-token selective weights ``s_t = i_t * c_t`` ``[B, T-1]``."""

    verdicts: TurnVerdicts | None = None
    weights: torch.Tensor | None = None


class SAGEOPD(OPD):
    """OPD whose tokens are weighted per turn: error-first Skip/Weak/Strong labels times teacher confidence."""

    Config = SAGEOPDConfig
    needs_teacher = True
    supports_teacher_set = False  # the judge and the confidence pass take one teacher

    def prepare(self, batch: RolloutBatch) -> SAGEState:
        """Label every turn (one judge call) and weigh every token (one no-grad teacher pass)."""
        base = super().prepare(batch)
        state = SAGEState(metrics=base.metrics, contexts=base.contexts)
        state.verdicts = judge_turns(self.teacher, batch.episodes, self.config)
        importance = turn_weights(state.verdicts, self.config.alpha)
        mask = agent_mask(batch)
        turn_of = batch.turn_index[:, 1:]
        weights = torch.zeros_like(mask)
        confidences = []
        for start in range(0, len(batch), self.micro_batch_size):
            rows = slice(start, min(start + self.micro_batch_size, len(batch)))
            width = int(batch.attention_mask[rows].sum(dim=1).max())
            on, turns = mask[rows][:, : width - 1], turn_of[rows][:, : width - 1]
            tokens = token_importance(turns, on, importance[rows])
            if self.config.use_confidence:
                top1 = (self.cross.turn_confidence(batch, rows, state.contexts[rows], width) if self.cross is not None
                        else self.teacher_top1(self.teacher_view(batch, rows, state), width))
                token_conf, turn_conf, present = confidence_per_turn(top1.cpu(), turns, on)
                confidences.append(turn_conf[present])
                tokens = tokens * token_conf
            weights[rows, : width - 1] = tokens
        state.weights = weights
        state.metrics.update(state.verdicts.counts())
        state.metrics["mean_confidence"] = float(torch.cat(confidences).mean()) if confidences else 1.0
        state.metrics["weighted_token_share"] = float((weights > 0).sum() / mask.sum().clamp(min=1))
        share = state.metrics["judge_defaulted_share"]
        if share > self.config.defaulted_warn_share:
            warnings.warn(f"SAGE-OPD: {share:.0%} of the judged turns got no readable verdict and defaulted to "
                          f"{self.config.default_label!r}: the teacher is not answering Skip/Weak/Strong (check "
                          "algo.judge_max_new_tokens, algo.judge_thinking, or use algo.judge=errors_only)",
                          stacklevel=2)
        return state

    def teacher_top1(self, view: TeacherInputs, width: int) -> torch.Tensor:
        """``max_v p_T(v)`` at each student position ``[b, width - 1]``: from the in-process teacher a chunk
        of positions at a time, or from a served teacher's own top-1 log-prob."""
        teacher = self.teacher_hidden(view, width)
        if teacher is not None:
            return chunked_top1_probability(teacher)
        scorer = self.teacher_scorer()
        if scorer is not None:
            _, top = aligned_teacher_scores(scorer, view, width, top_m=1)
            return top.logprobs[..., 0].exp()
        return top1_probability(self.teacher_logits(view, width))

    def token_weights(self, batch: RolloutBatch, state: SAGEState, step: Step) -> dict[str, LossTerm]:
        return {"distill": LossTerm(state.weights * self.kept_rows(state)[:, None], self.config.aggregation)}
