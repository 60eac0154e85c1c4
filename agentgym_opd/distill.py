"""What every on-policy distillation method shares: the teacher re-scores the student's exact tokens.

The OPD family differs in *who* the teacher is (a separate model, the student's own network, a frozen
or EMA copy of it) and *what extra context* it sees (nothing, the task's privileged solution, the env's
feedback and a successful sibling, retrieved experience). The mechanics are the same, and they live here:

1. **The teacher's view of a student episode.** The student's sequence is ``P_s + R``: its first prompt
   (chat template of system + first observation + assistant header), then everything after it (its own
   sampled ids of every turn, and the observations between them). The teacher's sequence is ``P_t + R``:
   the same first messages with the extra context appended to the first user message, re-rendered by the
   chat template, followed by *the very same ids* ``R``. Nothing after the prefix is re-tokenised, so
   every agent token of every turn sits at a known offset ``len(P_t) - len(P_s)`` in the teacher's
   sequence, and the teacher conditions on the same history plus its context.
2. **Aligned teacher logits** gathered back into the student's coordinates, so a loss compares
   ``p_S(. | h_t)`` and ``p_T(. | c, h_t)`` position by position under the student's loss mask.
3. **The per-token divergence** chosen by config: full vocabulary or top-M plus a tail bucket (student's
   or teacher's support), reverse/forward KL or JSD, or the sampled-token estimator.
4. **Self-teachers**: live (current weights), frozen (adapter off for LoRA, else a copy of the initial
   weights) or an EMA of the student, with the EMA state checkpointed.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch

from agentgym_opd.algorithm import (Algorithm, BatchState, LossTerm, Step, agent_mask, sequence_logits,
                                    weighted_sum)
from agentgym_opd.config import constrained
from agentgym_opd.losses import full_vocab_divergence, sampled_token_surrogate, token_logprobs, topm_distillation
from agentgym_opd.rollout import RolloutBatch
from agentgym_opd.types import Episode, Task

# ----------------------------------------------------------------------------------------------------
# Context text: how privileged information and feedback are shown to a teacher
# ----------------------------------------------------------------------------------------------------

CONTEXT_HEADER = "Privileged information (only you can see this):"
TRANSITION = "Use it to act correctly now, one action per turn."


def actions_block(actions: Sequence[str]) -> str:
    """A solving action sequence, one format for walkthroughs and successful siblings alike (a network
    taught to read one reads the other)."""
    return "Actions that solve this task: " + "; ".join(a.strip() for a in actions) + "."


def privileged_text(task: Task) -> str | None:
    """The task's ``privileged`` dict as teacher-readable text, or None when it holds nothing usable."""
    p = task.privileged or {}
    parts: list[str] = []
    if p.get("walkthrough"):
        parts.append(actions_block(p["walkthrough"]))
    if p.get("answer") not in (None, "", []):
        answer = p["answer"]
        parts.append("Answer: " + (" / ".join(map(str, answer)) if isinstance(answer, (list, tuple)) else str(answer)))
    if p.get("solution") and not p.get("walkthrough"):
        parts.append("Reference solution:\n" + str(p["solution"]))
    if p.get("evidence"):
        evidence = p["evidence"]
        parts.append("Evidence: " + (" ".join(map(str, evidence)) if isinstance(evidence, (list, tuple)) else str(evidence)))
    return with_context(parts) if parts else None


def with_context(parts: Sequence[str]) -> str:
    """Wrap context parts in the header and transition line every teacher prompt uses."""
    return "\n".join([CONTEXT_HEADER, *parts, TRANSITION])


def episode_actions(episode: Episode) -> list[str]:
    """The env-accepted actions of an episode (parse-error turns left out): its compact solution trace."""
    return [t.action for t in episode.turns if not t.info.get("parse_error")]


# ----------------------------------------------------------------------------------------------------
# The teacher's view of the student's tokens
# ----------------------------------------------------------------------------------------------------


def teacher_prefix(policy: Any, episode: Episode, context: str | None) -> list[int]:
    """Chat-template ids of the student's first prompt with ``context`` appended to its first user message."""
    messages = [dict(m) for m in episode.first_prompt]
    if context:
        messages[-1]["content"] = f"{messages[-1]['content']}\n\n{context}"
    return list(policy.apply_chat_template(messages, add_generation_prompt=True))


@dataclass
class TeacherInputs:
    """The teacher's sequences for some batch rows, and where each row's student tokens sit in them.

    ``input_ids``/``attention_mask`` are ``[b, W]`` (right-padded); teacher position = student position +
    ``offsets[row]``.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    offsets: torch.Tensor


def teacher_inputs(batch: RolloutBatch, rows: slice, prefixes: Sequence[list[int] | None], pad_id: int) -> TeacherInputs:
    """Build ``P_t + R`` for each row (``None`` prefix: the student's own prompt, offset 0)."""
    seqs, offsets = [], []
    for k, row in enumerate(range(rows.start, rows.stop)):
        episode = batch.episodes[row]
        length = int(batch.attention_mask[row].sum())
        ids = batch.input_ids[row, :length].tolist()
        prompt_length = int(episode.prompt_length or 0)
        prefix = prefixes[k]
        if prefix is None:
            prefix = ids[:prompt_length]
        seqs.append(list(prefix) + ids[prompt_length:])
        offsets.append(len(prefix) - prompt_length)
    width = max(len(s) for s in seqs)
    input_ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    attention = torch.zeros_like(input_ids)
    for k, s in enumerate(seqs):
        input_ids[k, : len(s)] = torch.tensor(s)
        attention[k, : len(s)] = 1
    return TeacherInputs(input_ids, attention, torch.tensor(offsets, dtype=torch.long))


def aligned_teacher_logits(model: Any, inputs: TeacherInputs, width: int) -> torch.Tensor:
    """Teacher next-token logits in the student's shifted coordinates: ``[b, width - 1, V]``.

    Student position t (predicting student id t+1) maps to teacher position t + offset. Positions inside
    the student's prompt map to clamped indices; they carry mask 0 and are never used.
    """
    device = next(model.parameters()).device
    with torch.no_grad():
        logits = model(input_ids=inputs.input_ids.to(device), attention_mask=inputs.attention_mask.to(device),
                       use_cache=False).logits.float()
    index = torch.arange(width - 1, device=device)[None, :] + inputs.offsets.to(device)[:, None]
    index = index.clamp(0, logits.shape[1] - 1)
    return logits.gather(1, index[..., None].expand(-1, -1, logits.shape[-1]))


# ----------------------------------------------------------------------------------------------------
# The per-token distillation signal
# ----------------------------------------------------------------------------------------------------


@dataclass
class DistillConfig:
    """The divergence every OPD-family method minimises (a base its config dataclasses extend)."""

    divergence: str = constrained("reverse_kl", choices=("reverse_kl", "forward_kl", "jsd"),
                                  help="per-token divergence; reverse_kl = KL(student || teacher), as in OPD")
    jsd_beta: float = constrained(0.5, ge=0, le=1, help="JSD interpolation (0 = forward KL, 1 = reverse KL, TRL GKD convention)")
    top_m: int = constrained(0, ge=0, help="0 = full vocabulary; M > 0 = top-M plus a tail bucket")
    top_m_support: str = constrained("student", choices=("student", "teacher"),
                                     help="whose top-M ids hold the support (SDPO: student; OPSD: teacher)")
    tail: bool = constrained(True, help="top-M: add the remaining-mass bucket (False: renormalise over M)")
    estimator: str = constrained("full", choices=("full", "sampled"),
                                 help="full = exact divergence over the support; sampled = stopgrad(r_t) log p_S(y_t)")
    clip: float | None = constrained(None, gt=0, help="per-token clip of the divergence (or |r_t| for sampled)")
    aggregation: str = constrained("token_mean", choices=("token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"))


def distillation_per_token(student_logits: torch.Tensor, teacher_logits: torch.Tensor, targets: torch.Tensor,
                           mask: torch.Tensor, config: DistillConfig) -> torch.Tensor:
    """Per-token distillation loss ``[b, T]`` (zero off the mask), as the config chooses.

    ``targets [b, T]`` are the sampled ids (the sampled-token estimator needs them).
    """
    if config.estimator == "sampled":
        student_logp = token_logprobs(student_logits, targets)
        teacher_logp = token_logprobs(teacher_logits, targets)
        return sampled_token_surrogate(student_logp, teacher_logp, mask, clip=config.clip)
    if config.top_m > 0:
        return topm_distillation(student_logits, teacher_logits, config.top_m, mask, config.divergence,  # type: ignore[arg-type]
                                 support=config.top_m_support, tail=config.tail, beta=config.jsd_beta,  # type: ignore[arg-type]
                                 clip=config.clip)
    return full_vocab_divergence(student_logits, teacher_logits, mask, config.divergence,  # type: ignore[arg-type]
                                 beta=config.jsd_beta, clip=config.clip)


def reverse_kl_per_token(student_logits: torch.Tensor, teacher_logits: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Exact per-token KL(student || teacher), detached: the number every method logs as ``kl``."""
    with torch.no_grad():
        return full_vocab_divergence(student_logits.detach(), teacher_logits, mask, "reverse_kl")


# ----------------------------------------------------------------------------------------------------
# Self-teachers
# ----------------------------------------------------------------------------------------------------


class SelfTeacher:
    """The student's own network as a teacher: ``live``, ``frozen`` or ``ema``.

    live: the current weights (no gradient through the teacher). frozen: the initial weights; the
    adapter-off base when the student is LoRA (the base never trains, so no copy), else a deep copy.
    ema: a copy moved after every optimiser step, ``teacher <- (1 - rate) teacher + rate student``.
    """

    def __init__(self, student: Any, mode: str, ema_rate: float = 0.05):
        if mode not in ("live", "frozen", "ema"):
            raise ValueError(f"self-teacher mode must be live, frozen or ema, got {mode!r}")
        self.student = student
        self.mode = mode
        self.ema_rate = ema_rate
        network = getattr(student, "model", student)
        self.use_adapter_off = mode == "frozen" and getattr(student, "is_lora", False)
        self.copy = None if mode == "live" or self.use_adapter_off else copy.deepcopy(network).eval().requires_grad_(False)

    def logits(self, inputs: TeacherInputs, width: int) -> torch.Tensor:
        network = getattr(self.student, "model", self.student)
        if self.copy is not None:
            return aligned_teacher_logits(self.copy, inputs, width)
        if self.use_adapter_off:
            with self.student.adapter_disabled():
                return aligned_teacher_logits(network, inputs, width)
        was_training = network.training
        network.eval()
        try:
            return aligned_teacher_logits(network, inputs, width)
        finally:
            network.train(was_training)

    @torch.no_grad()
    def after_update(self) -> None:
        if self.mode != "ema" or self.copy is None:
            return
        student = dict(getattr(self.student, "model", self.student).named_parameters())
        for name, param in self.copy.named_parameters():
            param.lerp_(student[name].detach(), self.ema_rate)

    def state_dict(self) -> dict[str, Any]:
        return {"copy": self.copy.state_dict()} if self.mode == "ema" and self.copy is not None else {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.copy is not None and "copy" in state:
            self.copy.load_state_dict(state["copy"])


# ----------------------------------------------------------------------------------------------------
# The shared algorithm shape
# ----------------------------------------------------------------------------------------------------


@dataclass
class DistillState(BatchState):
    """Per batch: each row's teacher context (``None``: the row has nothing to learn from)."""

    contexts: list[str | None] = field(default_factory=list)


def successful_sibling(batch: RolloutBatch, row: int) -> int | None:
    """Another row of the same task that succeeded (the highest-return one), or None; never the row itself.

    Siblings are matched by task id, so they are found in the trainer's groups and in batches a method
    regrouped itself (VPD's sibling mode)."""
    task_id = batch.episodes[row].task.id
    best = None
    for other, episode in enumerate(batch.episodes):
        if other != row and episode.task.id == task_id and episode.success:
            if best is None or episode.return_ > batch.episodes[best].return_:
                best = other
    return best


class DistillationAlgorithm(Algorithm):
    """Base of the OPD family: a subclass says what the teacher is and what context it sees per episode.

    Subclasses implement :meth:`teacher_context` (the extra text for one episode, ``""`` for none, or
    ``None`` to mask the episode out) and :meth:`teacher_logits`. The contexts are decided once per batch
    in :meth:`prepare`; the per-token weights are the agent tokens of kept rows; the loss is the
    configured divergence (``config`` extends :class:`DistillConfig`).
    """

    def teacher_context(self, batch: RolloutBatch, row: int) -> str | None:
        raise NotImplementedError

    def teacher_logits(self, inputs: TeacherInputs, width: int) -> torch.Tensor:
        raise NotImplementedError

    @property
    def teacher_policy(self) -> Any:
        """Whose chat template renders the teacher's prefix (the student's, for a self-teacher)."""
        return self.student

    def prepare(self, batch: RolloutBatch) -> DistillState:
        contexts = [self.teacher_context(batch, row) for row in range(len(batch))]
        masked = sum(c is None for c in contexts) / max(len(contexts), 1)
        return DistillState(metrics={"masked_fraction": masked}, contexts=contexts)

    def kept_rows(self, state: DistillState) -> torch.Tensor:
        return torch.tensor([c is not None for c in state.contexts], dtype=torch.float32)

    def token_weights(self, batch: RolloutBatch, state: DistillState, step: Step) -> dict[str, LossTerm]:
        return {"distill": LossTerm(agent_mask(batch) * self.kept_rows(state)[:, None], self.config.aggregation)}

    def teacher_view(self, batch: RolloutBatch, rows: slice, state: DistillState) -> TeacherInputs:
        """The teacher's inputs for ``rows`` (a masked row keeps the student's own prompt: weight 0 anyway)."""
        prefixes = [teacher_prefix(self.teacher_policy, batch.episodes[row], state.contexts[row])
                    if state.contexts[row] else None for row in range(rows.start, rows.stop)]
        pad = int(getattr(self.student.tokenizer, "pad_token_id", 0) or 0)
        return teacher_inputs(batch, rows, prefixes, pad)

    def distillation_terms(self, batch: RolloutBatch, rows: slice, state: DistillState) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(per_token_loss, mask, student_logits, teacher_logits, student_logp)`` for ``rows``; masked rows zeroed."""
        student_logits, student_logp, mask = sequence_logits(self.model, batch, rows)
        width = student_logits.shape[1] + 1
        teacher_logits = self.teacher_logits(self.teacher_view(batch, rows, state), width)
        mask = mask * self.kept_rows(state)[rows].to(mask.device)[:, None]
        targets = batch.input_ids[rows][:, 1:width].to(student_logits.device)
        per_token = distillation_per_token(student_logits, teacher_logits, targets, mask, self.config)
        return per_token, mask, student_logits, teacher_logits, student_logp

    def compute_loss(self, batch: RolloutBatch, rows: slice, coef: dict[str, torch.Tensor], state: DistillState,
                     step: Step) -> tuple[torch.Tensor, dict[str, float]]:
        per_token, mask, student_logits, teacher_logits, _ = self.distillation_terms(batch, rows, state)
        loss = weighted_sum(per_token, coef["distill"])
        return loss, distill_metrics(loss, student_logits, teacher_logits, mask, coef["distill"])


def distill_metrics(loss: torch.Tensor, student_logits: torch.Tensor, teacher_logits: torch.Tensor,
                    mask: torch.Tensor, coef: torch.Tensor) -> dict[str, float]:
    """The metric contributions every OPD-family method logs: its distillation loss, and the exact reverse
    KL(student || teacher) weighted like the loss (comparable across methods)."""
    kl = reverse_kl_per_token(student_logits, teacher_logits, mask)
    return {"distill_loss": float(loss.detach()), "kl": float(weighted_sum(kl, coef))}
