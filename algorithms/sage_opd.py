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
     tokens). The answer is read by :func:`parse_verdict` (after any ``</think>``; case, punctuation, the
     first label word that occurs). An unreadable verdict gets ``algo.default_label``.
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

import re
import warnings
from dataclasses import dataclass
from typing import Any, Sequence

import torch

from agentgym_opd.algorithm import LossTerm, Step, agent_mask
from agentgym_opd.config import constrained
from agentgym_opd.distill import AlignedTeacher, DistillState, TeacherInputs, aligned_teacher_scores
from agentgym_opd.policy.hf import chunk_positions, output_head
from agentgym_opd.policy.base import SamplingParams
from agentgym_opd.rollout import RolloutBatch
from agentgym_opd.types import Episode
from algorithms.opd import OPD, OPDConfig

LABELS: tuple[str, ...] = ("skip", "weak", "strong")

AGENT_ERRORS = frozenset({"invalid_action", "parse_error", "tool_error", "runtime_error"})  # not env faults
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
    judge_max_new_tokens: int = constrained(16, ge=1, help="tokens the teacher may spend on a verdict (greedy)")
    judge_thinking: bool = constrained(False, help="render the judge prompt with the template's thinking mode on")
    defaulted_warn_share: float = constrained(0.2, ge=0, le=1,
                                              help="warn when more than this share of judged turns gets default_label")
    judge_history_turns: int = constrained(6, ge=0, help="earlier turns shown to the judge before the judged one")
    judge_max_prompt_tokens: int = constrained(1536, ge=64, help="longest judge prompt; older history is dropped first")
    use_confidence: bool = constrained(True, help="multiply by the teacher's mean top-1 probability (False: c_t = 1)")


# ----------------------------------------------------------------------------------------------------
# Verdicts: parsing the judge's answer, and the labels of a batch
# ----------------------------------------------------------------------------------------------------


def parse_verdict(text: str | None) -> str | None:
    """The first label the answer names (``"skip"``, ``"weak"``, ``"strong"``), or None if it names none.

    Only the text after the last ``</think>`` counts (a thinking teacher's reasoning is not its verdict; an
    unfinished ``<think>`` is no verdict). Robust to case, punctuation and markup ("**STRONG**.",
    "label: weak") and inflections ("strongly", "skipped"); a word right after a negation ("not strong")
    does not count. No synonyms: filler such as "Okay" or "fine" is not a verdict.
    """
    if not text:
        return None
    if "</think>" in text:
        text = text.rsplit("</think>", 1)[1]
    elif "<think>" in text:
        return None
    words = re.findall(r"[a-z]+", text.lower())
    for position, word in enumerate(words):
        if position > 0 and words[position - 1] in NEGATIONS:
            continue
        label = next((lab for lab in LABELS if word.startswith(lab)), None)
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
        asked = sum(1 for row in self.raw for answer in row if answer is not None)
        defaulted = sum(1 for row_raw, row_src in zip(self.raw, self.sources)
                        for answer, src in zip(row_raw, row_src) if answer is not None and src == "default")
        return {**{f"share_{label}": flat.count(label) / n for label in LABELS},
                "turns_judged": float(sources.count("judge")), "turns_error_forced": float(sources.count("error")),
                "turns_defaulted": float(sources.count("default")),
                "judge_defaulted_share": defaulted / asked if asked else 0.0}


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


def judge_template(teacher: Any, messages: list[dict[str, str]], thinking: bool) -> list[int]:
    """The teacher's chat-template ids for the judge, with the template's thinking mode set (Qwen3-style
    ``enable_thinking``; templates without it ignore the flag)."""
    tokenizer = getattr(teacher, "tokenizer", None)
    if tokenizer is not None and hasattr(teacher, "encode") and getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True,
                                             enable_thinking=thinking)
        return list(teacher.encode(text))
    return list(teacher.apply_chat_template(messages, add_generation_prompt=True))


def judge_prompt(teacher: Any, episode: Episode, turn: int, history_turns: int, max_tokens: int,
                 thinking: bool = False) -> list[int]:
    """Teacher chat-template ids asking for the verdict on ``turn``; history trimmed until it fits."""
    for shown in range(history_turns, -1, -1):
        body = transcript(episode, turn, shown) + "\n\n" + JUDGE_QUESTION.format(k=turn + 1)
        messages = [{"role": "system", "content": JUDGE_SYSTEM}, {"role": "user", "content": body}]
        ids = judge_template(teacher, messages, thinking)
        if len(ids) <= max_tokens:
            return ids
    # even the turn alone is too long: keep the template's end (question + assistant header) intact
    return ids[:1] + ids[len(ids) - max_tokens + 1:]


def agent_error(turn: Any) -> bool:
    """True when the turn's env answer is an execution error of the agent (an env fault is not)."""
    return turn.error is not None and turn.error.kind in AGENT_ERRORS


def error_first_verdicts(episodes: Sequence[Episode], default_label: str) -> TurnVerdicts:
    """Turns with an agent execution error are Strong; every other turn provisionally gets ``default_label``."""
    labels, sources, raw = [], [], []
    for episode in episodes:
        labels.append(["strong" if agent_error(t) else default_label for t in episode.turns])
        sources.append(["error" if agent_error(t) else "default" for t in episode.turns])
        raw.append([None] * len(episode.turns))
    return TurnVerdicts(labels, sources, raw)


def judge_turns(teacher: Any, episodes: Sequence[Episode], config: SAGEOPDConfig) -> TurnVerdicts:
    """Label every turn of ``episodes``: errors first, then one batched greedy judge call for the rest."""
    verdicts = error_first_verdicts(episodes, config.default_label)
    if config.judge == "errors_only":
        return verdicts
    asked = [(row, k) for row, episode in enumerate(episodes) for k, t in enumerate(episode.turns) if not agent_error(t)]
    if not asked:
        return verdicts
    prompts = [judge_prompt(teacher, episodes[row], k, config.judge_history_turns, config.judge_max_prompt_tokens,
                            config.judge_thinking) for row, k in asked]
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
