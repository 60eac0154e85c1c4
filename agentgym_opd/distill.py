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

from agentgym_opd.algorithm import (Algorithm, BatchState, LossTerm, Step, agent_mask, micro_batch, sequence_logits,
                                    weighted_sum)
from agentgym_opd.config import constrained
from agentgym_opd.losses import (TopM, aggregate_token_loss, full_vocab_divergence, sampled_token_surrogate,
                                 token_logprobs, topm_distillation, topm_divergence)
from agentgym_opd.profiling import phase
from agentgym_opd.policy.hf import (can_chunk, chosen_positions, chunk_positions, chunked_over_positions,
                                    final_hidden_states, output_head, output_logits, pack_positions,
                                    unpack_positions)
from agentgym_opd.rollout import RolloutBatch
from agentgym_opd.types import Episode, Task

# ----------------------------------------------------------------------------------------------------
# Context text: how privileged information and feedback are shown to a teacher
# ----------------------------------------------------------------------------------------------------

CONTEXT_HEADER = "Privileged information (only you can see this):"
TRANSITION = "Use it to act correctly now, one action per turn."


def actions_block(actions: Sequence[str]) -> str:
    """A solving action sequence, one format for walkthroughs and successful siblings alike (a network
    taught to read one reads the other). The steps are numbered: following a plan means knowing which step
    comes next, and a number to look up is easier to find than a count of one's own past turns."""
    return "Actions that solve this task: " + "; ".join(f"Step {i}: {a.strip()}" for i, a in enumerate(actions, 1)) + "."


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


def attempt_feedback(episode: Episode, *, outcome: bool = False) -> str | None:
    """What the environment said about an attempt, for a teacher's context (SDPO's and VPD's feedback).

    The episode's own textual feedback; where the env gave none (an episode the rollout engine ended on
    unparseable output never reaches the env's end-of-episode report) the execution errors its turns
    recorded stand in: how many actions failed and the last error's message. ``outcome=True`` also states
    the outcome when there is no feedback text (VPD: every row gets a C); otherwise an attempt with neither
    feedback nor errors has nothing to say (None: SDPO masks such a row)."""
    if episode.feedback:
        return episode.feedback
    parts = []
    if outcome:
        parts.append("Task completed." if episode.success else "Task not completed.")
    errors = episode.errors()
    if errors:
        parts.append(f"{len(errors)} of {episode.num_turns} actions failed; the last error: {errors[-1].message}")
    return " ".join(parts) or None


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


def _aligned_index(inputs: TeacherInputs, width: int, length: int, device: torch.device) -> torch.Tensor:
    """Teacher position of each student position 0..width-2 (clamped; prompt positions carry mask 0)."""
    index = torch.arange(width - 1, device=device)[None, :] + inputs.offsets.to(device)[:, None]
    return index.clamp(0, length - 1)


@dataclass
class AlignedTeacher:
    """A teacher's final hidden states in the student's shifted coordinates, and the network that owns them.

    ``hidden [b, width - 1, H]`` (no gradient): position t is the teacher's state for predicting student id
    t+1. Logits are made from it a chunk of positions at a time (:func:`chunked_distillation_terms`), so the
    teacher's ``[b, T, V]`` never exists: ``H`` numbers per position instead of ``V``.
    """

    hidden: torch.Tensor
    network: Any

    def logits(self, start: int = 0, end: int | None = None) -> torch.Tensor:
        """float32 teacher logits of positions ``start:end`` (the final norm is already in ``hidden``)."""
        with torch.no_grad():
            return output_logits(self.network, self.hidden[:, start:end])


def aligned_teacher_hidden(model: Any, inputs: TeacherInputs, width: int) -> AlignedTeacher:
    """Run the teacher's body once over ``P_t + R`` and keep its final hidden states at the student's positions."""
    device = next(model.parameters()).device
    with torch.no_grad():
        hidden = final_hidden_states(model, inputs.input_ids.to(device), inputs.attention_mask.to(device))
        index = _aligned_index(inputs, width, hidden.shape[1], device)
        hidden = hidden.gather(1, index[..., None].expand(-1, -1, hidden.shape[-1]))
    return AlignedTeacher(hidden, model)


def aligned_teacher_logits(model: Any, inputs: TeacherInputs, width: int) -> torch.Tensor:
    """Teacher next-token logits in the student's shifted coordinates: ``[b, width - 1, V]``, float32.

    Student position t (predicting student id t+1) maps to teacher position t + offset. Positions inside
    the student's prompt map to clamped indices; they carry mask 0 and are never used. For losses that
    read the whole teacher distribution at once; :func:`aligned_teacher_hidden` is the chunked form
    (the ``lm_head`` runs only on the aligned positions here too, and only one ``[b, T, V]`` is made).
    """
    return aligned_teacher_hidden(model, inputs, width).logits()


def aligned_teacher_scores(teacher: Any, inputs: TeacherInputs, width: int, top_m: int) -> tuple[torch.Tensor, TopM | None]:
    """A scoring-only teacher (any `Policy.score`, e.g. a served vLLM teacher) in the student's coordinates.

    Returns ``(logp [b, width - 1], TopM [b, width - 1, M] or None)``: the teacher's log-prob of each student
    id and its own top-M with the tail, at every student position (zeros where the position is in the
    student's prompt; those carry mask 0). This is all a teacher outside the process can ship, so losses
    that need the full vocabulary or the student's support are refused by :func:`scored_distillation_terms`.
    """
    rows = inputs.input_ids.shape[0]
    seqs = [inputs.input_ids[r, : int(inputs.attention_mask[r].sum())].tolist() for r in range(rows)]
    scores = teacher.score([s[:1] for s in seqs], [s[1:] for s in seqs], top_m=top_m)
    logp = torch.zeros((rows, width - 1))
    ids = torch.zeros((rows, width - 1, max(top_m, 1)), dtype=torch.long)
    top = torch.full((rows, width - 1, max(top_m, 1)), -1e4)
    tail = torch.zeros((rows, width - 1))
    for r, sc in enumerate(scores):
        offset = int(inputs.offsets[r])
        # teacher score index j is teacher position j (predicting teacher id j+1) = student position j - offset
        j0 = max(offset, 0)
        count = min(sc.logprobs.shape[0] - j0, width - 1 - (j0 - offset))
        if count <= 0:
            continue
        dst = slice(j0 - offset, j0 - offset + count)
        logp[r, dst] = sc.logprobs[j0: j0 + count].float().cpu()
        if top_m > 0:
            ids[r, dst] = sc.top_ids[j0: j0 + count].cpu()
            top[r, dst] = sc.top_logprobs[j0: j0 + count].float().cpu()
            tail[r, dst] = sc.tail_logprob[j0: j0 + count].float().cpu()
    return logp, (TopM(ids, top, tail) if top_m > 0 else None)


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


@dataclass
class DistillTerms:
    """Per-token results of one micro-batch ``[b, T]``: the loss, the mask it is taken under, the exact
    reverse KL (the ``kl`` every method logs; detached) and the student's log-prob of each sampled id at the
    rollout's temperature (``RolloutBatch.logprob_temperature``: what an importance ratio against the
    behaviour log-probs needs; the divergence itself is always of the model's own distribution)."""

    per_token: torch.Tensor
    mask: torch.Tensor
    kl: torch.Tensor
    student_logp: torch.Tensor


def tempered_logprobs(logits: torch.Tensor, targets: torch.Tensor, temperature: float) -> torch.Tensor:
    """Log-probs of ``targets`` under ``softmax(logits / temperature)`` (the behaviour distribution of a
    rollout sampled at that temperature)."""
    return token_logprobs(logits if temperature == 1.0 else logits / temperature, targets)


def chunked_distillation_terms(student_model: Any, ids: torch.Tensor, attention: torch.Tensor, mask: torch.Tensor,
                               teacher: AlignedTeacher, config: DistillConfig, chunk: int | None = None,
                               logp_temperature: float = 1.0, positions: torch.Tensor | None = None) -> DistillTerms:
    """:func:`distillation_per_token` and the exact KL, computed a chunk of positions at a time.

    The student's body runs once (with gradient); then, per chunk, both final norms' outputs go through
    their ``lm_head`` and the per-token divergence is taken. Every per-token quantity depends on its own
    position only, so the result equals the whole-sequence computation; but only one chunk's
    vocabulary-sized tensors exist at any time, in the forward and (the chunk is recomputed during
    backward, see :func:`agentgym_opd.policy.hf.chunked_over_positions`) in the backward too. ``ids``/``attention`` ``[b, W]``,
    ``mask`` ``[b, W - 1]`` (already zero on masked rows).

    ``positions`` ``[b, W - 1]`` (the agent tokens; default: every position): only these positions go through
    the heads, packed into one row, and every output is zero elsewhere. A multi-turn episode is mostly
    observations and prompts, and per position the two heads (with the student's recomputed in the backward
    pass) are a large share of an update's arithmetic (docs/speed.md).
    """
    hidden = final_hidden_states(student_model, ids, attention)[:, :-1]
    targets = ids[:, 1:]
    full_mask, shape = mask, targets.shape
    where = chosen_positions(positions)
    if where is not None:  # the chosen positions packed into one row
        hidden, targets, mask = (pack_positions(t, where) for t in (hidden, targets, mask))
        teacher = AlignedTeacher(pack_positions(teacher.hidden, where), teacher.network)
    vocab = output_head(student_model).weight.shape[0]
    step = chunk or chunk_positions(hidden.shape[0], vocab)

    def one_chunk(h: torch.Tensor, start: int, end: int):
        student_logits = output_logits(student_model, h)
        teacher_logits = teacher.logits(start, end)
        target, m = targets[:, start:end], mask[:, start:end]
        per_token = distillation_per_token(student_logits, teacher_logits, target, m, config)
        kl = reverse_kl_per_token(student_logits, teacher_logits, m)
        return per_token, kl, tempered_logprobs(student_logits, target, logp_temperature)

    outputs = chunked_over_positions(student_model, hidden, one_chunk, step)
    per_token, kl, student_logp = (unpack_positions(out, where, shape) for out in outputs)
    return DistillTerms(per_token, full_mask, kl.detach(), student_logp)


def scored_distillation_terms(student_model: Any, ids: torch.Tensor, attention: torch.Tensor, mask: torch.Tensor,
                              teacher_logp: torch.Tensor, teacher_topm: TopM | None, config: DistillConfig,
                              chunk: int | None = None, logp_temperature: float = 1.0) -> DistillTerms:
    """The same terms against a scoring-only teacher (:func:`aligned_teacher_scores`): its top-M + tail, or
    its log-probs of the sampled ids. ``kl`` is then the top-M + tail estimate of the reverse KL (the exact
    one needs the teacher's full distribution, which such a teacher does not ship)."""
    if config.estimator != "sampled" and (config.top_m == 0 or config.top_m_support != "teacher"):
        raise ValueError("a scoring-only teacher (e.g. model.teacher_backend=vllm) ships its own top-M and the "
                         "sampled ids' log-probs only: use algo.top_m>0 with algo.top_m_support=teacher, or "
                         "algo.estimator=sampled")
    hidden = final_hidden_states(student_model, ids, attention)[:, :-1]
    targets = ids[:, 1:]
    device = hidden.device
    teacher_logp = teacher_logp.to(device)
    record = None if teacher_topm is None else TopM(teacher_topm.ids.to(device), teacher_topm.logprobs.to(device),
                                                    teacher_topm.tail.to(device))
    vocab = output_head(student_model).weight.shape[0]
    step = chunk or chunk_positions(ids.shape[0], vocab)

    def one_chunk(h: torch.Tensor, start: int, end: int):
        student_logits = output_logits(student_model, h)
        target, m = targets[:, start:end], mask[:, start:end]
        student_logp = token_logprobs(student_logits, target)
        ratio_logp = tempered_logprobs(student_logits, target, logp_temperature)
        if record is None:
            kl = (student_logp.detach() - teacher_logp[:, start:end]) * m  # sampled estimate of the reverse KL
            per_token = sampled_token_surrogate(student_logp, teacher_logp[:, start:end], m, clip=config.clip)
            return per_token, kl, ratio_logp
        part = TopM(record.ids[:, start:end], record.logprobs[:, start:end], record.tail[:, start:end])
        if config.estimator == "sampled":
            per_token = sampled_token_surrogate(student_logp, teacher_logp[:, start:end], m, clip=config.clip)
        else:
            per_token = topm_divergence(student_logits, part, m, config.divergence, tail=config.tail,  # type: ignore[arg-type]
                                        beta=config.jsd_beta, clip=config.clip)
        kl = topm_divergence(student_logits.detach(), part, m, "reverse_kl", tail=True)
        return per_token, kl, ratio_logp

    per_token, kl, student_logp = chunked_over_positions(student_model, hidden, one_chunk, step)
    return DistillTerms(per_token, mask, kl.detach(), student_logp)


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

    def hidden(self, inputs: TeacherInputs, width: int) -> AlignedTeacher:
        """:meth:`logits` in chunked form (final hidden states; logits made per chunk by the loss).

        The heads read ``hidden`` later, outside any adapter context: correct because LoRA adapts the
        body's projections, never ``lm_head``; and ``AlignedTeacher.logits`` runs without gradient, so a
        live teacher sharing the student's ``lm_head`` passes no gradient through it."""
        network = getattr(self.student, "model", self.student)
        if self.copy is not None:
            return aligned_teacher_hidden(self.copy, inputs, width)
        if self.use_adapter_off:
            with self.student.adapter_disabled():
                return aligned_teacher_hidden(network, inputs, width)
        was_training = network.training
        network.eval()
        try:
            return aligned_teacher_hidden(network, inputs, width)
        finally:
            network.train(was_training)

    @torch.no_grad()
    def after_update(self) -> None:
        if self.mode != "ema" or self.copy is None:
            return
        student = dict(getattr(self.student, "model", self.student).named_parameters())
        for name, param in self.copy.named_parameters():
            source = student[name].detach()
            if hasattr(source, "full_tensor"):  # an FSDP-sharded student: the copy holds whole tensors
                source = source.full_tensor()
            param.lerp_(source, self.ema_rate)

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

    def teacher_hidden(self, inputs: TeacherInputs, width: int) -> AlignedTeacher | None:
        """The teacher in chunked form (see :class:`AlignedTeacher`), or None where the teacher is only
        available as full logits (then :meth:`teacher_logits` is used). A separate in-process teacher and
        the self-teachers return it; :meth:`compute_loss` then never holds ``[b, T, V]``."""
        return None

    def teacher_scorer(self) -> Any:
        """A scoring-only teacher (any `Policy.score`, e.g. a served vLLM teacher), or None. Used when
        :meth:`teacher_hidden` gives nothing: the loss then runs on the teacher's top-M + tail."""
        return None

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
        """``(per_token_loss, mask, student_logits, teacher_logits, student_logp)`` for ``rows``; masked rows
        zeroed; ``student_logp`` at the rollout's temperature (see :class:`DistillTerms`)."""
        student_logits, _, mask = sequence_logits(self.model, batch, rows)
        width = student_logits.shape[1] + 1
        with phase("teacher"):
            teacher_logits = self.teacher_logits(self.teacher_view(batch, rows, state), width)
        mask = mask * self.kept_rows(state)[rows].to(mask.device)[:, None]
        targets = batch.input_ids[rows][:, 1:width].to(student_logits.device)
        per_token = distillation_per_token(student_logits, teacher_logits, targets, mask, self.config)
        student_logp = tempered_logprobs(student_logits, targets, batch.logprob_temperature)
        return per_token, mask, student_logits, teacher_logits, student_logp

    def chunked_terms(self, batch: RolloutBatch, rows: slice, state: DistillState) -> DistillTerms | None:
        """The per-token terms without any ``[b, T, V]`` (chunked; see :func:`chunked_distillation_terms`),
        or None when the teacher offers neither hidden states nor scores, or the student's hidden states
        cannot be reached (:func:`agentgym_opd.policy.hf.can_chunk`; then the full-logit path runs)."""
        if not can_chunk(self.model):
            if self.teacher_scorer() is not None:
                raise ValueError("a served teacher (model.teacher_backend=vllm) needs the chunked student path: "
                                 "the student's forward must take `logits_to_keep` (any recent Transformers "
                                 "causal LM does), or use model.teacher_backend=hf")
            return None
        ids, attention, mask = micro_batch(self.model, batch, rows)
        width = ids.shape[1]
        with phase("teacher"):
            inputs = self.teacher_view(batch, rows, state)
            teacher = self.teacher_hidden(inputs, width)
            scorer = self.teacher_scorer() if teacher is None else None
            if scorer is not None:
                logp, topm = aligned_teacher_scores(scorer, inputs, width,
                                                    self.config.top_m if self.config.estimator != "sampled" else 0)
        agent = mask > 0  # the positions any loss term reads
        mask = mask * self.kept_rows(state)[rows].to(mask.device)[:, None]
        temperature = batch.logprob_temperature
        if teacher is not None:
            return chunked_distillation_terms(self.model, ids, attention, mask, teacher, self.config,
                                              logp_temperature=temperature, positions=agent)
        if scorer is None:
            return None
        return scored_distillation_terms(self.model, ids, attention, mask, logp, topm, self.config,
                                         logp_temperature=temperature)

    def compute_loss(self, batch: RolloutBatch, rows: slice, coef: dict[str, torch.Tensor], state: DistillState,
                     step: Step) -> tuple[torch.Tensor, dict[str, float]]:
        terms = self.chunked_terms(batch, rows, state)
        if terms is None:
            per_token, mask, student_logits, teacher_logits, _ = self.distillation_terms(batch, rows, state)
            loss = weighted_sum(per_token, coef["distill"])
            return loss, distill_metrics(loss, student_logits, teacher_logits, mask, coef["distill"])
        loss = weighted_sum(terms.per_token, coef["distill"])
        return loss, {"distill_loss": float(loss.detach()), "kl": float(weighted_sum(terms.kl, coef["distill"]))}


def distill_metrics(loss: torch.Tensor, student_logits: torch.Tensor, teacher_logits: torch.Tensor,
                    mask: torch.Tensor, coef: torch.Tensor) -> dict[str, float]:
    """The metric contributions every OPD-family method logs: its distillation loss, and the exact reverse
    KL(student || teacher) weighted like the loss (comparable across methods)."""
    kl = reverse_kl_per_token(student_logits, teacher_logits, mask)
    return {"distill_loss": float(loss.detach()), "kl": float(weighted_sum(kl, coef))}
