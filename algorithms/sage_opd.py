"""SAGE-OPD: selective, turn-level on-policy distillation from a separate teacher.

Teacher: a separate frozen model (``--teacher PATH``, same tokenizer as the student), exactly as in
:mod:`algorithms.opd`; it re-scores the student's own tokens given the same history. What SAGE-OPD adds
is *which turns* of a multi-turn rollout the student learns from, and how much.

1. **Segment** each student episode into turns by the env's turn boundaries: every agent token carries
   its turn index (``RolloutBatch.turn_index``) and ``Episode.turns[k].error`` is the env's
   ``StepError`` of turn k.
2. **Label** every turn ``z_t`` in {Skip, Weak, Strong}, importance ``i_t`` in {0, alpha, 1}:

   - a turn whose env answer is an execution error (a ``StepError`` of any kind, including the rollout
     engine's ``parse_error``) is **Strong** at once: the environment has already said it went wrong,
     so the teacher is not asked;
   - every other turn is judged by the **teacher**: its own chat template renders the history up to and
     including the turn's action and the env's answer / feedback, and asks for exactly one of the labels.
     All such turns of the batch go to ONE greedy ``teacher.generate`` call (``algo.judge_max_new_tokens``
     tokens). The answer is read by :func:`parse_verdict` (case, punctuation, the first label word that
     occurs, synonyms in :data:`LABEL_SYNONYMS`). An unreadable verdict gets ``algo.default_label``.
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
   exactly OPD's loss. If every weight is 0 (all Skip, or zero confidence) there is no signal: ``Z = 0``
   and the loss is ``0 * sum(logits)`` (zero, with a graph, so backward and the optimiser step are
   well defined and move nothing but the weight decay).

Why it should help: OPD spends the same gradient on every token, including routine turns where student
and teacher already agree and turns where the teacher itself is unsure. Weighting the turns that went
wrong (execution errors first), the ones a teacher calls decisive, and the positions where the teacher is
confident concentrates the dense signal where it corrects behaviour.

NOTES (decisions where the brief was silent, and what remains)
--------------------------------------------------------------
- ``default_label = weak`` for unreadable verdicts and, under ``judge=errors_only``, for non-error turns:
  an unreadable answer is no evidence either way, so the turn is kept at half weight (``alpha``) rather
  than dropped (Skip, losing signal) or promoted (Strong, trusting noise). With errors_only this makes
  error turns weigh ``1/alpha`` times a normal turn: the error-first selection without a judge.
- Label meanings given to the judge: Strong = a mistake or a decisive step the agent must get right;
  Weak = acceptable but could be better; Skip = correct and routine, nothing to learn.
- The verdict parser takes the first label word (or synonym, or a word starting with a label such as
  "strongly") that is not directly preceded by a negation ("not", "no", "never", "isn't"...).
- The judge sees the first observation and the last ``judge_history_turns`` turns before the judged one
  (older ones are elided with a count), trimmed further until the prompt fits ``judge_max_prompt_tokens``.
- Verdicts are computed once per batch (one generate call in :meth:`SAGEOPD.update`, cached by batch
  identity; a direct ``compute_loss`` call labels its batch on first use). ``Z`` is computed per
  micro-batch, since the confidence needs the teacher logits that ``compute_loss`` builds per micro-batch;
  with one micro-batch per step (the usual small-run case) it is the batch-level Z of the formula.
- ``use_confidence=False`` sets ``c_t = 1`` (an ablation: labels only).
- Logged per step: ``share_skip/weak/strong`` (of turns), ``turns_judged`` / ``turns_error_forced`` /
  ``turns_defaulted`` (counts), ``mean_confidence`` (mean c_t over turns), ``normalizer`` (Z), ``kl``
  (unweighted reverse KL, comparable with OPD's), ``distill_loss``.
- Measured (household/train, 4 tasks; student = tiny after 15 SFT steps, greedy 0/4; teacher = tiny after
  100 SFT steps, greedy 4/4; 10 steps, 4 tasks/step, max_turns 10, max_new_tokens 12, AdamW lr 1e-3;
  seeds 0/1/2): greedy success 0/4 -> 0/4 for both sage_opd and opd on every seed. KL(student||teacher)
  on the rollouts, step 1 -> step 10: sage_opd 2.79->1.35, 3.00->1.38, 2.79->1.68; opd 2.79->1.54,
  3.00->1.19, 2.79->1.64 (mean over the 10 steps: 2.11 vs 2.11). No measurable difference: the warm
  student's turns are ~98% execution errors, so almost every turn is Strong by the error rule and SAGE
  reduces to OPD times the teacher's confidence (~0.9). The tiny teacher never answers with a label (it
  replies with actions, e.g. "go to desk 1"), so every judged turn was defaulted to Weak. At lr 3e-3 both
  methods diverged (seed 0: KL 2.79 -> 3.60 sage_opd, -> 3.97 opd).
- Remains: a measurement where the method can differ (a warmer student with a mix of error and clean
  turns, a teacher that can judge, e.g. SmolLM2-135M-Instruct, and a longer budget).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Sequence

import torch

from agentgym_opd.config import constrained
from agentgym_opd.distill import reverse_kl_per_token
from agentgym_opd.losses import aggregate_token_loss
from agentgym_opd.policy.base import SamplingParams
from agentgym_opd.rollout import RolloutBatch
from agentgym_opd.types import Episode
from algorithms.opd import OPD, OPDConfig

LABELS: tuple[str, ...] = ("skip", "weak", "strong")

# Words a judge may use for each label (lower case). Checked in the order they occur in the answer.
LABEL_SYNONYMS: dict[str, str] = {
    **{w: "skip" for w in ("skip", "ignore", "none", "fine", "ok", "okay", "correct", "routine", "trivial")},
    **{w: "weak" for w in ("weak", "minor", "moderate", "medium", "low", "partial", "slight", "somewhat")},
    **{w: "strong" for w in ("strong", "critical", "major", "high", "severe", "important", "crucial", "decisive",
                             "wrong", "mistake", "error", "incorrect", "bad")},
}
NEGATIONS = frozenset({"not", "no", "never", "isnt", "nor", "without", "t"})  # "t": the tail of isn't, wasn't...

JUDGE_SYSTEM = ("You review one turn of an agent acting in a text environment and decide how much the agent "
                "should learn from it. Reply with exactly one word: Skip, Weak or Strong.")
JUDGE_QUESTION = ("How much should the agent learn from turn {k}?\n"
                  "Strong: a mistake, or a decisive step it must get right.\n"
                  "Weak: acceptable, but it could be better.\n"
                  "Skip: correct and routine, nothing to learn.\n"
                  "Answer with one word: Skip, Weak or Strong.")


@dataclass
class SAGEOPDConfig(OPDConfig):
    """OPD's divergence knobs plus the turn selection."""

    alpha: float = constrained(0.5, ge=0, le=1, help="importance of a Weak turn (Skip = 0, Strong = 1)")
    judge: str = constrained("teacher", choices=("teacher", "errors_only"),
                             help="who labels non-error turns: the teacher, or nobody (they get default_label)")
    default_label: str = constrained("weak", choices=LABELS,
                                     help="label of an unreadable verdict, and of non-error turns under errors_only")
    judge_max_new_tokens: int = constrained(4, ge=1, help="tokens the teacher may spend on a verdict (greedy)")
    judge_history_turns: int = constrained(6, ge=0, help="earlier turns shown to the judge before the judged one")
    judge_max_prompt_tokens: int = constrained(1536, ge=64, help="longest judge prompt; older history is dropped first")
    use_confidence: bool = constrained(True, help="multiply by the teacher's mean top-1 probability (False: c_t = 1)")


# ----------------------------------------------------------------------------------------------------
# Verdicts: parsing the judge's answer, and the labels of a batch
# ----------------------------------------------------------------------------------------------------


def parse_verdict(text: str | None) -> str | None:
    """The first label the answer names (``"skip"``, ``"weak"``, ``"strong"``), or None if it names none.

    Robust to case, punctuation and markup ("**STRONG**.", "label: weak", "z=Skip"), to synonyms
    (:data:`LABEL_SYNONYMS`) and inflections ("strongly", "skipped"); a word right after a negation
    ("not strong") does not count.
    """
    if not text:
        return None
    words = re.findall(r"[a-z]+", text.lower())
    for position, word in enumerate(words):
        if position > 0 and words[position - 1] in NEGATIONS:
            continue
        label = LABEL_SYNONYMS.get(word) or next((lab for lab in LABELS if word.startswith(lab)), None)
        if label is not None:
            return label
    return None


@dataclass
class TurnVerdicts:
    """Per row, per turn: the label, where it came from (``error`` / ``judge`` / ``default``) and the
    judge's raw answer (None where it was not asked)."""

    labels: list[list[str]]
    sources: list[list[str]]
    raw: list[list[str | None]]

    def counts(self) -> dict[str, float]:
        """The step's label statistics: label shares over turns, and how each label was decided."""
        flat = [label for row in self.labels for label in row]
        sources = [s for row in self.sources for s in row]
        n = max(len(flat), 1)
        return {**{f"share_{label}": flat.count(label) / n for label in LABELS},
                "turns_judged": float(sources.count("judge")), "turns_error_forced": float(sources.count("error")),
                "turns_defaulted": float(sources.count("default"))}


def transcript(episode: Episode, turn: int, history_turns: int) -> str:
    """The judge's view of turn ``turn``: the first observation, recent earlier turns, then the turn itself."""
    first = episode.initial_observation
    start = max(0, turn - history_turns)
    lines = [f"Task and first observation:\n{first}"]
    if start > 0:
        lines.append(f"({start} earlier turns omitted)")
    for k in range(start, turn + 1):
        step = episode.turns[k]
        lines.append(f"Turn {k + 1} action: {step.action.strip()}")
        lines.append(f"Environment: {step.observation.strip()}")
        if step.error is not None and step.error.message.strip() not in step.observation:
            lines.append(f"Error: {step.error}")
        if step.feedback and step.feedback.strip() != step.observation.strip():
            lines.append(f"Feedback: {step.feedback.strip()}")
    return "\n".join(lines)


def judge_prompt(teacher: Any, episode: Episode, turn: int, history_turns: int, max_tokens: int) -> list[int]:
    """Teacher chat-template ids asking for the verdict on ``turn``; history trimmed until it fits."""
    for shown in range(history_turns, -1, -1):
        body = transcript(episode, turn, shown) + "\n\n" + JUDGE_QUESTION.format(k=turn + 1)
        messages = [{"role": "system", "content": JUDGE_SYSTEM}, {"role": "user", "content": body}]
        ids = list(teacher.apply_chat_template(messages, add_generation_prompt=True))
        if len(ids) <= max_tokens:
            return ids
    # even the turn alone is too long: keep the template's end (question + assistant header) intact
    return ids[:1] + ids[len(ids) - max_tokens + 1:]


def error_first_verdicts(episodes: Sequence[Episode], default_label: str) -> TurnVerdicts:
    """Execution-error turns are Strong; every other turn provisionally gets ``default_label``."""
    labels, sources, raw = [], [], []
    for episode in episodes:
        labels.append(["strong" if t.error is not None else default_label for t in episode.turns])
        sources.append(["error" if t.error is not None else "default" for t in episode.turns])
        raw.append([None] * len(episode.turns))
    return TurnVerdicts(labels, sources, raw)


def judge_turns(teacher: Any, episodes: Sequence[Episode], config: SAGEOPDConfig) -> TurnVerdicts:
    """Label every turn of ``episodes``: errors first, then one batched greedy judge call for the rest."""
    verdicts = error_first_verdicts(episodes, config.default_label)
    if config.judge == "errors_only":
        return verdicts
    asked = [(row, k) for row, episode in enumerate(episodes) for k, t in enumerate(episode.turns) if t.error is None]
    if not asked:
        return verdicts
    prompts = [judge_prompt(teacher, episodes[row], k, config.judge_history_turns, config.judge_max_prompt_tokens)
               for row, k in asked]
    answers = teacher.generate(prompts, SamplingParams(max_new_tokens=config.judge_max_new_tokens, temperature=0.0))
    for (row, k), answer in zip(asked, answers):
        label = parse_verdict(answer.text)
        verdicts.raw[row][k] = answer.text
        if label is not None:
            verdicts.labels[row][k], verdicts.sources[row][k] = label, "judge"
    return verdicts


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
        logits = teacher_logits.detach().float()
        top1 = torch.exp(logits.amax(dim=-1) - torch.logsumexp(logits, dim=-1))
        on = ((mask > 0) & (turn_of >= 0)).float()
        index = turn_of.clamp(min=0)
        width = int(index.max()) + 1 if index.numel() else 1
        sums = torch.zeros((turn_of.shape[0], width), device=logits.device).scatter_add_(1, index, top1 * on)
        counts = torch.zeros_like(sums).scatter_add_(1, index, on)
        turn_mean = torch.where(counts > 0, sums / counts.clamp(min=1), torch.zeros_like(sums))
        return turn_mean.gather(1, index) * on, turn_mean, counts > 0


def opd_scale_normalizer(weights: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``Z = N / sum(weights)`` over agent tokens (N = their count); 0 when every weight is 0 (no signal)."""
    total = (weights * (mask > 0)).sum()
    return torch.where(total > 0, (mask > 0).sum() / total.clamp(min=1e-12), torch.zeros_like(total))


def selective_loss(per_token: torch.Tensor, weights: torch.Tensor, mask: torch.Tensor,
                   aggregation: str = "token_mean") -> tuple[torch.Tensor, torch.Tensor]:
    """``Z * sum_t s_t L_OPD(turn t)`` at OPD's scale: the per-token loss times ``Z * s`` (detached),
    aggregated as OPD aggregates it. Returns ``(loss, Z)``; ``token_mean`` gives ``sum(s l) / sum(s)``."""
    weights = weights.detach()
    z = opd_scale_normalizer(weights, mask)
    return aggregate_token_loss(per_token * (z * weights), mask, aggregation), z  # type: ignore[arg-type]


# ----------------------------------------------------------------------------------------------------
# The algorithm
# ----------------------------------------------------------------------------------------------------


class SAGEOPD(OPD):
    """OPD whose tokens are weighted per turn: error-first Skip/Weak/Strong labels times teacher confidence."""

    Config = SAGEOPDConfig
    needs_teacher = True

    def __init__(self, config: Any, student: Any, teacher: Any = None, **kwargs: Any):
        super().__init__(config, student, teacher, **kwargs)
        self._verdicts: tuple[RolloutBatch, TurnVerdicts] | None = None

    def verdicts(self, batch: RolloutBatch) -> TurnVerdicts:
        """The batch's turn labels, decided once (one judge call) and reused by every micro-batch."""
        if self._verdicts is None or self._verdicts[0] is not batch:
            self._verdicts = (batch, judge_turns(self.teacher, batch.episodes, self.config))
        return self._verdicts[1]

    def update(self, batch: RolloutBatch) -> dict[str, float]:
        verdicts = self.verdicts(batch)
        metrics = super().update(batch)
        metrics.update(verdicts.counts())
        self._verdicts = None  # the next batch is new; do not keep this one alive
        return metrics

    def turn_weights(self, batch: RolloutBatch, rows: slice, turn_of: torch.Tensor, mask: torch.Tensor,
                     teacher_logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(s [b, T], c_t of the micro-batch's turns [n_turns])`` for ``rows``."""
        labels = self.verdicts(batch).labels[rows]
        importance = token_importance(turn_of, mask, [[label_importance(lab, self.config.alpha) for lab in row]
                                                      for row in labels])
        token_conf, turn_conf, present = turn_confidence(teacher_logits, turn_of, mask)
        if not self.config.use_confidence:
            token_conf = (mask > 0).float() * (turn_of >= 0).float()
        return importance * token_conf, turn_conf[present]

    def compute_loss(self, batch: RolloutBatch, rows: slice) -> tuple[torch.Tensor, dict[str, float]]:
        per_token, mask, student_logits, teacher_logits, _ = self.distillation_terms(batch, rows)
        turn_of = batch.turn_index[rows][:, 1: mask.shape[1] + 1].to(mask.device)
        weights, confidences = self.turn_weights(batch, rows, turn_of, mask, teacher_logits)
        loss, z = selective_loss(per_token, weights, mask, self.config.aggregation)
        metrics = {"mean_confidence": float(confidences.mean()) if confidences.numel() else 0.0,
                   "normalizer": float(z), "weighted_token_share": float((weights > 0).sum() / mask.sum().clamp(min=1))}
        if float(z) == 0.0:  # every weight 0: no signal, but keep a graph so backward is well defined
            return student_logits.sum() * 0.0, {**metrics, "distill_loss": 0.0, "kl": 0.0}
        kl = reverse_kl_per_token(student_logits, teacher_logits, mask)
        return loss, {**metrics, "distill_loss": float(loss.detach()), "kl": float(kl.sum() / mask.sum())}
