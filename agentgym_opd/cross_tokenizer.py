"""On-policy distillation from a teacher whose tokenizer differs from the student's.

The same-tokenizer path (:mod:`agentgym_opd.distill`) feeds the teacher the student's very ids. A teacher of
another tokenizer cannot read them, so here it reads the student's episode *as text, in its own tokens*:

1. **The teacher's view.** The episode is rebuilt the way the rollout engine built it, with the teacher's
   tokenizer and chat template: the teacher's rendering of the first prompt (plus the method's context), then
   per turn the student's exact text (its sampled ids decoded, special-token strings taken literally, so agent
   text can never inject a template token into the teacher's view), the teacher's own end-of-turn token where
   the student ended its turn with its own, and the teacher's template text around the next observation. The
   teacher thus conditions on the same conversation, written in its own format.
2. **Alignment.** Per turn, the student's tokens and the teacher's re-tokenisation are cut into merged spans
   (:func:`agentgym_opd.token_alignment.merged_spans`); the student's end-of-turn token and the teacher's are
   one span of one token each.
3. **Scoring.** The teacher scores its view once (``Policy.score``: in process, or served by vLLM); the student
   runs once with gradient. Each side's log-probs are summed over each span (exact by the chain rule).
4. **The loss per span** (``algo.estimator``):

   - ``full`` (OPD's default): on a span of one token per side whose token both vocabularies hold
     (:class:`agentgym_opd.token_alignment.SharedVocabulary`), the reverse KL between the two next-token
     distributions on the shared tokens plus one tail bucket each (approximate: a coarsening, so a lower bound
     of the per-token KL; exactly OPD's full-vocabulary KL when the tokenizer is the same). On every other
     span the sampled estimator below.
   - ``sampled``: ``stopgrad(r_j) * log p_S(span_j)`` with ``r_j = log p_S(span_j) - log p_T(span_j)``, both
     exact span log-probs; its expectation is the reverse KL's score-function gradient at the span level.

   A span's loss is spread evenly over its student tokens, so the per-token tensor, the loss mask and every
   aggregation of :mod:`agentgym_opd.algorithm` stay as they are; the logged ``kl`` is the same per-span
   value (the divergence on shared one-token spans, ``r_j`` elsewhere).

With the same tokenizer and canonically tokenised text every span is one token per side and the shared
vocabulary is the whole vocabulary, so this path gives OPD's numbers (the test checks it); a run whose teacher
shares the student's tokenizer never comes here unless ``algo.cross_tokenizer=always``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch

from agentgym_opd.algorithm import micro_batch, weighted_sum
from agentgym_opd.losses import divergence_from_logprobs
from agentgym_opd.policy.chat import end_of_turn_text, turn_suffix_text
from agentgym_opd.rollout import RolloutBatch
from agentgym_opd.token_alignment import (SharedVocabulary, Span, SpanIndex, build_span_index, decode_exactly,
                                          merged_spans, shared_vocabulary, span_index, span_sums, spread_over_tokens,
                                          token_bytes)
from agentgym_opd.types import Episode

logger = logging.getLogger(__name__)

MODES = ("auto", "always", "off")
FULL_SHARE_METRIC = "cross/full_share"  # the share of agent tokens whose span took the full divergence


# ----------------------------------------------------------------------------------------------------
# Which path a teacher takes
# ----------------------------------------------------------------------------------------------------


def output_rows(policy: Any) -> int | None:
    """The number of logits a policy's model produces (None for a served teacher)."""
    model = getattr(policy, "model", None)
    if model is None:
        return None
    return int(model.get_output_embeddings().weight.shape[0])


def same_tokenizer(student: Any, teacher: Any) -> bool:
    """Whether the teacher can score the student's ids as they are: the same vocabulary and, in process, the
    same number of output rows."""
    if student.tokenizer.get_vocab() != teacher.tokenizer.get_vocab():
        return False
    rows = output_rows(teacher)
    return rows is None or rows == output_rows(student)


def needs_cross_tokenizer(student: Any, teacher: Any, mode: str) -> bool:
    """``algo.cross_tokenizer``: ``auto`` takes the cross-tokenizer path only when the tokenizers differ;
    ``always`` takes it anyway (to compare the two paths); ``off`` never (the same-tokenizer guard refuses a
    different tokenizer)."""
    if mode not in MODES:
        raise ValueError(f"algo.cross_tokenizer must be one of {', '.join(MODES)}, got {mode!r}")
    if mode == "off":
        return False
    return mode == "always" or not same_tokenizer(student, teacher)


def check_cross_config(config: Any, served: bool) -> None:
    """The divergence settings the cross-tokenizer path can honour, or an error that says which to use."""
    if getattr(config, "top_m", 0):
        raise ValueError("algo.top_m > 0 with a teacher of another tokenizer: the two vocabularies have no common "
                         "top-M; use algo.top_m=0 (the divergence on the tokens both vocabularies share) or "
                         "algo.estimator=sampled")
    if getattr(config, "divergence", "reverse_kl") != "reverse_kl":
        raise ValueError(f"algo.divergence={config.divergence} with a teacher of another tokenizer: spans of "
                         "several tokens use the sampled estimate of the reverse KL, so only "
                         "algo.divergence=reverse_kl is consistent")
    if served and getattr(config, "estimator", "full") != "sampled":
        raise ValueError("a served teacher (model.teacher_backend=vllm) of another tokenizer ships the log-probs of "
                         "its own tokens only: use algo.estimator=sampled, or model.teacher_backend=hf")


def end_of_turn_id(tokenizer: Any) -> int | None:
    """The token a chat template closes an assistant message with (``<|im_end|>``): the first token of the
    template's end-of-turn text if it is a special token, else the tokenizer's EOS."""
    text = end_of_turn_text(tokenizer).strip()
    if text:
        ids = tokenizer.encode(text, add_special_tokens=False)
        if ids and tokenizer.convert_ids_to_tokens(ids[0]) in tokenizer.all_special_tokens:
            return int(ids[0])
    return None if tokenizer.eos_token_id is None else int(tokenizer.eos_token_id)


# ----------------------------------------------------------------------------------------------------
# The teacher's view of a student episode, in the teacher's tokens
# ----------------------------------------------------------------------------------------------------


@dataclass
class TurnView:
    """One turn in both sequences: where its agent tokens sit, and its merged spans (indices into those lists)."""

    turn: int
    student_positions: list[int]
    teacher_positions: list[int]
    spans: list[Span]


@dataclass
class TeacherView:
    """The teacher's token sequence for one student episode; ``ids[:prompt_length]`` is its first prompt."""

    ids: list[int]
    prompt_length: int
    turns: list[TurnView] = field(default_factory=list)


def system_prompt_of(episode: Episode) -> str | None:
    first = episode.first_prompt[0] if episode.first_prompt else None
    return first["content"] if first and first.get("role") == "system" else None


def agent_positions_by_turn(loss_mask: Sequence[int], turn_index: Sequence[int]) -> dict[int, list[int]]:
    """Sequence positions of each turn's agent tokens (mask 1), in order."""
    out: dict[int, list[int]] = {}
    for position, (m, k) in enumerate(zip(loss_mask, turn_index)):
        if m and k >= 0:
            out.setdefault(int(k), []).append(position)
    return out


def teacher_view(student: Any, teacher: Any, ids: Sequence[int], loss_mask: Sequence[int], turn_index: Sequence[int],
                 episode: Episode, context: str | None) -> TeacherView:
    """Rebuild the episode in the teacher's tokens (module docstring, step 1), aligned turn by turn.

    Mirrors :class:`agentgym_opd.rollout.RolloutEngine`'s bookkeeping: after a turn that is not the last, the
    template's end of turn (dropped when the turn already ended with its own end-of-turn token), the next user
    message (the turn's observation) and the assistant header; after the last turn, the end of turn unless
    the turn sampled one."""
    from agentgym_opd.distill import teacher_prefix

    s_tok, t_tok = student.tokenizer, teacher.tokenizer
    student_stops = set(getattr(student, "stop_token_ids", []) or [])
    teacher_stops = set(getattr(teacher, "stop_token_ids", []) or [])
    teacher_end = end_of_turn_id(t_tok)
    system = system_prompt_of(episode)
    out = list(teacher_prefix(teacher, episode, context))
    view = TeacherView(out, len(out))
    positions = agent_positions_by_turn(loss_mask, turn_index)
    for k, turn in enumerate(episode.turns):
        s_pos = positions.get(k, [])
        s_ids = [int(ids[p]) for p in s_pos]
        ended = bool(s_ids) and s_ids[-1] in student_stops and teacher_end is not None
        body = s_ids[:-1] if ended else s_ids
        text = decode_exactly(s_tok, body)
        t_body = list(t_tok.encode(text, add_special_tokens=False, split_special_tokens=True)) if text else []
        spans = merged_spans(token_bytes(s_tok, body), token_bytes(t_tok, t_body))
        t_pos = list(range(len(out), len(out) + len(t_body)))
        out += t_body
        if ended:
            spans.append(Span((len(body), len(body) + 1), (len(t_body), len(t_body) + 1)))
            t_pos.append(len(out))
            out.append(int(teacher_end))  # type: ignore[arg-type]
        view.turns.append(TurnView(k, s_pos, t_pos, spans))
        if not turn.done:
            suffix = list(t_tok.encode(turn_suffix_text(t_tok, turn.observation, system), add_special_tokens=False))
            if ended and suffix and suffix[0] in teacher_stops:
                suffix = suffix[1:]
            out += suffix
        elif not ended:
            out += list(t_tok.encode(end_of_turn_text(t_tok), add_special_tokens=False))
    return view


def check_teacher_length(teacher: Any, view: TeacherView) -> None:
    """A view longer than the teacher's position table is an error that says so (not a silent wrap-around)."""
    model = getattr(teacher, "model", None)
    limit = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    if limit is not None and len(view.ids) > int(limit):
        raise ValueError(f"the teacher's view of an episode has {len(view.ids)} tokens, more than its "
                         f"{limit} positions: lower model.max_seq_len or rollout.max_turns")


# ----------------------------------------------------------------------------------------------------
# The teacher, its scores, and the per-token terms
# ----------------------------------------------------------------------------------------------------


@dataclass
class CrossTerms:
    """Per-token results of one micro-batch ``[b, W-1]`` (as :class:`agentgym_opd.distill.DistillTerms`), and
    the share of agent tokens whose span took the full divergence."""

    per_token: torch.Tensor
    mask: torch.Tensor
    kl: torch.Tensor
    student_logp: torch.Tensor
    full_share: torch.Tensor


class CrossTokenizerTeacher:
    """A teacher of another tokenizer, wrapped for the OPD family (module docstring)."""

    def __init__(self, student: Any, teacher: Any, config: Any):
        self.student = student
        self.teacher = teacher
        self.config = config
        self.served = not hasattr(teacher, "model")
        check_cross_config(config, self.served)
        self.full = getattr(config, "estimator", "full") == "full"
        s_end, t_end = end_of_turn_id(student.tokenizer), end_of_turn_id(teacher.tokenizer)
        self.vocabulary: SharedVocabulary = shared_vocabulary(
            student.tokenizer, teacher.tokenizer, student_size=output_rows(student), teacher_size=output_rows(teacher),
            pairs=[(s_end, t_end)] if s_end is not None and t_end is not None else [])

    def describe(self) -> str:
        """One log line: what this path does with this pair."""
        kind = ("reverse KL on one-token spans of the shared vocabulary, the sampled estimate elsewhere"
                if self.full else "the sampled estimate on every span")
        return (f"teacher tokenizer differs from the student's ({len(self.student.tokenizer)} vs "
                f"{len(self.teacher.tokenizer)} tokens, {len(self.vocabulary)} shared): cross-tokenizer distillation "
                f"on merged spans, {kind}")

    # ------------------------------------------------------------------ teacher side
    def views(self, batch: RolloutBatch, rows: Sequence[int], contexts: Sequence[str | None]) -> list[TeacherView]:
        out = []
        for row, context in zip(rows, contexts):
            length = int(batch.attention_mask[row].sum())
            view = teacher_view(self.student, self.teacher, batch.input_ids[row, :length].tolist(),
                                batch.loss_mask[row, :length].tolist(), batch.turn_index[row, :length].tolist(),
                                batch.episodes[row], context or None)
            check_teacher_length(self.teacher, view)
            out.append(view)
        return out

    def teacher_scores(self, views: Sequence[TeacherView], *, support: bool, top_m: int = 0) -> list[Any]:
        """``Policy.score`` of each view after its prompt, with the shared vocabulary as support if asked."""
        contexts = [v.ids[: v.prompt_length] for v in views]
        continuations = [v.ids[v.prompt_length:] for v in views]
        if support:
            ids = self.vocabulary.teacher_ids
            supports = [ids[None, :].expand(len(c), -1) for c in continuations]
            return self.teacher.score(contexts, continuations, support_ids=supports)
        return self.teacher.score(contexts, continuations, top_m=top_m)

    # ------------------------------------------------------------------ the per-token terms
    def terms(self, model: Any, batch: RolloutBatch, rows: slice, contexts: Sequence[str | None]) -> CrossTerms:
        """The per-token loss and KL of ``rows`` (rows whose context is None are masked: no teacher runs)."""
        from agentgym_opd.policy.hf import chunked_token_scores, final_hidden_states

        ids, attention, mask = micro_batch(model, batch, rows)
        b, width = ids.shape[0], ids.shape[1] - 1
        kept = [k for k, c in enumerate(contexts) if c is not None]
        keep = torch.zeros(b, device=mask.device)
        keep[kept] = 1.0
        mask = mask * keep[:, None]
        hidden = final_hidden_states(model, ids, attention)[:, :-1]
        device = hidden.device
        support = self.vocabulary.student_ids.to(device)[None, None, :].expand(b, width, -1) if self.full else None
        student = chunked_token_scores(model, hidden, ids[:, 1:], support_ids=support)
        zeros = torch.zeros((b, width), device=device)
        if not kept:
            return CrossTerms(student.logprobs * 0.0, mask, zeros, student.logprobs, zeros)
        views = self.views(batch, [rows.start + k for k in kept], [contexts[k] for k in kept])
        with torch.no_grad():
            scores = self.teacher_scores(views, support=self.full)
        index, full_spans = self.alignment(views, kept, width, ids)
        teacher_logp = torch.cat([s.logprobs.float().to(device) for s in scores])
        s_span, t_span = span_sums(student.logprobs, teacher_logp, index)
        ratio = (s_span - t_span).detach()
        clip = getattr(self.config, "clip", None)
        clipped = ratio.clamp(-clip, clip) if clip is not None else ratio
        span_loss = clipped * s_span
        span_kl = ratio
        if self.full and full_spans[0]:
            divergence = self.shared_divergence(student, scores, full_spans, width)
            which = torch.tensor(full_spans[0], dtype=torch.long, device=device)
            limited = divergence.clamp(max=clip) if clip is not None else divergence
            span_loss = span_loss.index_put((which,), limited)
            span_kl = span_kl.index_put((which,), divergence.detach())
        size = b * width
        per_token = spread_over_tokens(span_loss, index, size).view(b, width)
        kl = spread_over_tokens(span_kl, index, size).view(b, width)
        full_flag = torch.zeros(index.count, device=device)
        if full_spans[0]:
            full_flag[torch.tensor(full_spans[0], dtype=torch.long, device=device)] = 1.0
        share = spread_over_tokens(full_flag, index, size).view(b, width)
        counts = spread_over_tokens(torch.ones(index.count, device=device), index, size).view(b, width)
        share = torch.where(counts > 0, share / counts.clamp(min=1e-30), zeros)  # 1 on tokens of full spans
        return CrossTerms(per_token * mask, mask, kl * mask, student.logprobs, share * mask)

    def alignment(self, views: Sequence[TeacherView], kept: Sequence[int], width: int,
                  ids: torch.Tensor) -> tuple[SpanIndex, tuple[list[int], list[int], list[int]]]:
        """The batch's :class:`SpanIndex` (student positions flat over ``[b, width]``, teacher positions flat
        over the concatenated scores) and the spans that take the full divergence: ``(span numbers, flat
        student positions, flat teacher positions)``."""
        parts, count, offset = [], 0, 0
        full: tuple[list[int], list[int], list[int]] = ([], [], [])
        teacher_of = self.vocabulary.teacher_of
        for view, k in zip(views, kept):
            for turn in view.turns:
                s_flat = [k * width + p - 1 for p in turn.student_positions]
                t_flat = [offset + q - view.prompt_length for q in turn.teacher_positions]
                parts.append(span_index(turn.spans, s_flat, t_flat, first_span=count))
                if self.full:
                    for n, span in enumerate(turn.spans, start=count):
                        if not span.one_to_one:
                            continue
                        s_id = int(ids[k, turn.student_positions[span.student[0]]])
                        t_id = view.ids[turn.teacher_positions[span.teacher[0]]]
                        if teacher_of.get(s_id) == t_id:
                            full[0].append(n)
                            full[1].append(s_flat[span.student[0]])
                            full[2].append(t_flat[span.teacher[0]])
                count += len(turn.spans)
            offset += len(view.ids) - view.prompt_length
        return build_span_index(parts, count), full

    def shared_divergence(self, student: Any, scores: Sequence[Any], full_spans: tuple[list[int], list[int], list[int]],
                          width: int) -> torch.Tensor:
        """Reverse KL on the shared vocabulary plus a tail bucket, at the full spans' positions ``[n]``."""
        device = student.logprobs.device
        k = len(self.vocabulary)
        s_positions = torch.tensor(full_spans[1], dtype=torch.long, device=device)
        t_positions = torch.tensor(full_spans[2], dtype=torch.long, device=device)
        s_top = student.top_logprobs.reshape(-1, k)[s_positions]
        s_tail = student.tail_logprob.reshape(-1)[s_positions]
        t_top = torch.cat([s.top_logprobs.float().to(device) for s in scores])[t_positions]
        t_tail = torch.cat([s.tail_logprob.float().to(device) for s in scores])[t_positions]
        s_support = torch.cat([s_top, s_tail[:, None]], dim=-1)
        t_support = torch.cat([t_top, t_tail[:, None]], dim=-1)
        return divergence_from_logprobs(s_support, t_support, "reverse_kl")

    def compute_loss(self, model: Any, batch: RolloutBatch, rows: slice, coef: torch.Tensor,
                     contexts: Sequence[str | None]) -> tuple[torch.Tensor, dict[str, float]]:
        """``rows``' share of the batch loss and its metric contributions (weighted like the loss, so their
        sums over micro-batches are batch-level means): ``kl``, and ``cross/full_share``, the share of agent
        tokens whose span took the full divergence."""
        terms = self.terms(model, batch, rows, contexts)
        loss = weighted_sum(terms.per_token, coef)
        return loss, {"distill_loss": float(loss.detach()), "kl": float(weighted_sum(terms.kl, coef)),
                      FULL_SHARE_METRIC: float(weighted_sum(terms.full_share, coef))}

    # ------------------------------------------------------------------ SAGE-OPD's confidence
    def turn_confidence(self, batch: RolloutBatch, rows: slice, contexts: Sequence[str | None],
                        width: int) -> torch.Tensor:
        """Each student agent token's turn confidence ``[b, width - 1]``: the teacher's mean top-1 probability
        over *its own* tokens of the turn (the per-turn quantity SAGE-OPD weighs by; which tokens it is
        averaged over is the teacher's business). Zero on masked rows and off the agent tokens."""
        b = rows.stop - rows.start
        out = torch.zeros((b, width - 1))
        kept = [k for k, c in enumerate(contexts) if c is not None]
        if not kept:
            return out
        views = self.views(batch, [rows.start + k for k in kept], [contexts[k] for k in kept])
        with torch.no_grad():
            scores = self.teacher_scores(views, support=False, top_m=1)
        for view, k, score in zip(views, kept, scores):
            top1 = score.top_logprobs[:, 0].float().exp().cpu()
            for turn in view.turns:
                if not turn.teacher_positions or not turn.student_positions:
                    continue
                local = torch.tensor([q - view.prompt_length for q in turn.teacher_positions])
                value = float(top1[local].mean())
                for p in turn.student_positions:
                    if 0 < p < width:
                        out[k, p - 1] = value
        return out
