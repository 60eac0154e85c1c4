"""LOPD: latent on-policy self-distillation with an experience bank and a privileged-margin constraint.

Experience. The student's successful training episodes (instruction + compact action-result trace) go
into an :class:`experience_bank.ExperienceBank` (``algo.bank_path``, else ``<output_dir>/experience_bank`` under the Trainer, else a temp dir; optionally
seeded from the tasks' expert walkthroughs, ``algo.seed_walkthroughs``, as each task is first seen).
For each episode the top-J experiences of its task are retrieved, excluding the episode's own trace.

Teacher. A frozen copy of the initial backbone, conditioned on ``c_phi``: the J x K latents the
:class:`agentgym_opd.latent_composer.LatentComposer` (LoRA encoder + K learned queries) makes from the
(task, experience) pairs, injected as input embeddings before the student's sequence:
``inputs_embeds = [c_phi ; embed(student ids)]``, so student position t sits at teacher position
t + J*K (J = experiences found for that row; a row with none is masked out, like OPSD without context).

Signal. Reverse KL(student || teacher) over the student's top-M ids plus a tail bucket, on the student's
agent tokens. Unlike :func:`agentgym_opd.losses.topm_divergence`, the teacher is NOT detached: the
composer and the student are optimised jointly, the composer through the teacher's logits.

Privileged margin. On successful episodes the teacher should beat the student on the student's own
tokens: ``gap = mean_t(log p_T(y_t) - log p_S(y_t)) >= m``. The loss adds ``beta * (m - gap)``; the
student's log-probs are detached in this term (decision: the constraint is on the composer's context,
and letting it push the student's likelihood *down* would fight the distillation). After each update
``beta <- max(0, beta + eta (m - gap))`` with the update's mean gap. beta is in ``extra_state``.

At inference only the student exists: the composer, bank and teacher copy live on the algorithm, the
checkpoint's ``model/`` is the student, and the composer's trainable state is in ``extra_state``.

Ablations: ``algo.train_composer=false`` (frozen composer), ``algo.margin=false`` (no constraint),
``algo.context=text`` (retrieved experiences as text via :func:`agentgym_opd.distill.teacher_prefix`).
"""

from __future__ import annotations

import copy
import tempfile
from dataclasses import dataclass
from typing import Any, Sequence

import torch

from agentgym_opd.algorithm import sequence_logits
from agentgym_opd.config import constrained
from agentgym_opd.distill import (DistillConfig, DistillationAlgorithm, TeacherInputs, aligned_teacher_logits,
                                  reverse_kl_per_token, teacher_inputs, teacher_prefix, with_context)
from agentgym_opd.latent_composer import LatentComposer
from agentgym_opd.losses import (aggregate_token_loss, divergence_from_logprobs, gathered_logprobs, student_topm_ids,
                                 tail_logprob, token_logprobs)
from agentgym_opd.rollout import RolloutBatch
from agentgym_opd.types import Episode


@dataclass
class LOPDConfig(DistillConfig):
    top_m: int = constrained(32, ge=1, help="top-M support (student's) plus a tail bucket")
    num_experiences: int = constrained(2, ge=1, help="J: experiences retrieved per task")
    num_latents: int = constrained(4, ge=1, help="K: latent vectors per experience")
    lora_rank: int = constrained(8, ge=1, help="LoRA rank of the composer's encoder")
    composer_lr: float = constrained(1e-3, gt=0, help="learning rate of the composer's parameter group")
    context: str = constrained("latent", choices=("latent", "text"), help="ablation: text = retrieved experience as text")
    train_composer: bool = constrained(True, help="ablation: false = frozen composer")
    margin: bool = constrained(True, help="ablation: false = no privileged-margin constraint")
    margin_value: float = constrained(0.1, help="m: required mean log-prob advantage of the teacher on successes")
    dual_lr: float = constrained(0.05, gt=0, help="eta: dual ascent step of beta")
    beta_init: float = constrained(0.0, ge=0, help="initial dual variable")
    bank_path: str = constrained("", help="experience bank folder ('' = <output_dir>/experience_bank)")
    embedder: str = constrained("minilm", choices=("minilm", "hashing"), help="retrieval embedder")
    seed_walkthroughs: bool = constrained(True, help="seed the bank with each task's expert walkthrough when seen")


def walkthrough_experience(episode: Episode):
    """The task's expert walkthrough as an Experience (actions only), or None."""
    from experience_bank import Experience

    walk = (episode.task.privileged or {}).get("walkthrough")
    if not walk:
        return None
    return Experience(episode.task.env_id, episode.task.id, episode.task.instruction, [(a, "") for a in walk],
                      metadata={"source": "walkthrough"})


def latent_teacher_logits(model: Any, context: Sequence[torch.Tensor | None], batch: RolloutBatch, rows: slice,
                          width: int) -> torch.Tensor:
    """Teacher logits (WITH gradient to the latents) in the student's shifted coordinates ``[b, width-1, V]``.

    Row k's teacher input is ``[context[k] ; embed(ids)]``: student position t is teacher position
    t + len(context[k]).
    """
    embed = model.get_input_embeddings()
    device = embed.weight.device
    seqs, offsets = [], []
    for k, row in enumerate(range(rows.start, rows.stop)):
        length = int(batch.attention_mask[row].sum())
        tokens = embed(batch.input_ids[row, :length].to(device))
        c = context[k]
        seqs.append(tokens if c is None else torch.cat([c.to(tokens.dtype), tokens], dim=0))
        offsets.append(0 if c is None else c.shape[0])
    full = max(s.shape[0] for s in seqs)
    inputs = torch.zeros(len(seqs), full, embed.weight.shape[1], dtype=embed.weight.dtype, device=device)
    attention = torch.zeros(len(seqs), full, dtype=torch.long, device=device)
    padded = []
    for k, s in enumerate(seqs):
        padded.append(torch.cat([s, inputs[k, s.shape[0]:]], dim=0))
        attention[k, : s.shape[0]] = 1
    logits = model(inputs_embeds=torch.stack(padded), attention_mask=attention, use_cache=False).logits.float()
    index = torch.arange(width - 1, device=device)[None, :] + torch.tensor(offsets, device=device)[:, None]
    index = index.clamp(0, logits.shape[1] - 1)
    return logits.gather(1, index[..., None].expand(-1, -1, logits.shape[-1]))


def topm_reverse_kl_with_teacher_grad(student_logits: torch.Tensor, teacher_logits: torch.Tensor, m: int,
                                      mask: torch.Tensor, tail: bool = True) -> torch.Tensor:
    """Per-token KL(student || teacher) on the student's top-M ids (+ tail); gradients reach BOTH sides."""
    ids = student_topm_ids(student_logits, m)
    student_m = gathered_logprobs(student_logits, ids)
    teacher_m = torch.log_softmax(teacher_logits, dim=-1).gather(-1, ids)
    if tail:
        student_m = torch.cat([student_m, tail_logprob(student_m).unsqueeze(-1)], dim=-1)
        teacher_m = torch.cat([teacher_m, tail_logprob(teacher_m).unsqueeze(-1)], dim=-1)
    else:
        student_m = student_m - torch.logsumexp(student_m, dim=-1, keepdim=True)
        teacher_m = teacher_m - torch.logsumexp(teacher_m, dim=-1, keepdim=True)
    return divergence_from_logprobs(student_m, teacher_m, "reverse_kl") * mask


def dual_step(beta: float, margin: float, gap: float, eta: float) -> float:
    """Projected dual ascent on the margin constraint: ``max(0, beta + eta (m - gap))``."""
    return max(0.0, beta + eta * (margin - gap))


class LOPD(DistillationAlgorithm):
    """Latent self-distillation: a frozen self-teacher fed composed latents of retrieved experiences; reverse KL + margin."""

    Config = LOPDConfig

    def __init__(self, config: Any, student: Any, teacher: Any = None, **kwargs: Any):
        super().__init__(config, student, teacher, **kwargs)
        c = self.config
        self.frozen_teacher = copy.deepcopy(self.model).eval().requires_grad_(False)
        self.composer = LatentComposer(self.frozen_teacher, student.tokenizer, num_latents=c.num_latents,
                                       lora_rank=c.lora_rank)
        if not c.train_composer:
            self.composer.requires_grad_(False)
        elif c.context == "latent":
            self.optimizer.add_param_group({"params": self.composer.trainable_parameters(), "lr": c.composer_lr})
        from agentgym_opd.embedding import HashingEmbedder, SentenceEmbedder
        from experience_bank import ExperienceBank

        bank_dir = c.bank_path or (f"{self.work_dir}/experience_bank" if self.work_dir else tempfile.mkdtemp(prefix="lopd_bank_"))
        self.bank = ExperienceBank(bank_dir,
                                   HashingEmbedder() if c.embedder == "hashing" else SentenceEmbedder())
        self.beta = float(c.beta_init)
        self._gaps: list[tuple[float, float]] = []  # (sum of per-episode gaps, count) per micro-batch
        self._seeded: set[str] = set()

    # ------------------------------------------------------------------ experience
    def collect(self, engine, envs, tasks, *, group_size, seed) -> RolloutBatch:
        batch = super().collect(engine, envs, tasks, group_size=group_size, seed=seed)
        self.remember(batch.episodes)
        return batch

    def remember(self, episodes: Sequence[Episode]) -> None:
        """Add successful episodes (and, once per task, its walkthrough when seeding is on) to the bank."""
        items: list[Any] = [ep for ep in episodes if ep.success]
        if self.config.seed_walkthroughs:
            for ep in episodes:
                if ep.task.id not in self._seeded:
                    self._seeded.add(ep.task.id)
                    walk = walkthrough_experience(ep)
                    if walk is not None:
                        items.append(walk)
        if items:
            self.bank.add_many(items)

    def retrieve(self, episode: Episode) -> list[Any]:
        """Top-J experiences for the episode's task, never the episode's own trace."""
        from experience_bank import trace_from_episode

        if self.bank.count() == 0:
            return []
        own = trace_from_episode(episode).trace_hash()
        found = self.bank.retrieve(episode.task, k=self.config.num_experiences + 1, env_id=episode.task.env_id)
        return [e for e in found if e.trace_hash() != own][: self.config.num_experiences]

    # ------------------------------------------------------------------ teacher
    def teacher_context(self, batch: RolloutBatch, row: int) -> str | None:
        found = self.retrieve(batch.episodes[row])
        return with_context([e.as_text() for e in found]) if found else None

    def teacher_logits(self, inputs: TeacherInputs, width: int) -> torch.Tensor:
        return aligned_teacher_logits(self.frozen_teacher, inputs, width)

    def latent_context(self, batch: RolloutBatch, rows: slice) -> list[torch.Tensor | None]:
        out: list[torch.Tensor | None] = []
        for row in range(rows.start, rows.stop):
            episode = batch.episodes[row]
            found = self.retrieve(episode)
            out.append(self.composer.context(episode.task.instruction, [e.as_text() for e in found]) if found else None)
        return out

    # ------------------------------------------------------------------ loss
    def compute_loss(self, batch: RolloutBatch, rows: slice) -> tuple[torch.Tensor, dict[str, float]]:
        c = self.config
        student_logits, student_logp, mask = sequence_logits(self.model, batch, rows)
        width = student_logits.shape[1] + 1
        if c.context == "latent":
            context = self.latent_context(batch, rows)
            keep = torch.tensor([x is not None for x in context], dtype=torch.float32)
            teacher_logits = latent_teacher_logits(self.frozen_teacher, context, batch, rows, width)
        else:
            texts = [self.teacher_context(batch, r) for r in range(rows.start, rows.stop)]
            prefixes = [teacher_prefix(self.student, batch.episodes[r], t) if t else None
                        for r, t in zip(range(rows.start, rows.stop), texts)]
            keep = torch.tensor([p is not None for p in prefixes], dtype=torch.float32)
            pad = int(getattr(self.student.tokenizer, "pad_token_id", 0) or 0)
            teacher_logits = self.teacher_logits(teacher_inputs(batch, rows, prefixes, pad), width)
        mask = mask * keep.to(mask.device)[:, None]
        if mask.sum() == 0:
            return student_logits.sum() * 0.0, {"distill_loss": 0.0, "kl": 0.0, "masked_fraction": 1.0,
                                                "beta": self.beta, "margin_gap": 0.0}
        per_token = topm_reverse_kl_with_teacher_grad(student_logits, teacher_logits, c.top_m, mask, c.tail)
        loss = aggregate_token_loss(per_token, mask, c.aggregation)  # type: ignore[arg-type]
        targets = batch.input_ids[rows][:, 1:width].to(student_logits.device)
        teacher_logp = token_logprobs(teacher_logits, targets)
        success = torch.tensor([float(batch.episodes[r].success) for r in range(rows.start, rows.stop)],
                               device=mask.device)
        success_mask = mask * success[:, None]
        metrics: dict[str, float] = {}
        if success_mask.sum() > 0:
            per_row = ((teacher_logp - student_logp.detach()) * success_mask).sum(1) / success_mask.sum(1).clamp(min=1)
            rows_ok = success_mask.sum(1) > 0
            gap = per_row[rows_ok].mean()
            self._gaps.append((float(per_row[rows_ok].sum().detach()), float(rows_ok.sum())))
            if c.margin:
                loss = loss + self.beta * (c.margin_value - gap)
            metrics["margin_gap"] = float(gap.detach())
        kl = reverse_kl_per_token(student_logits, teacher_logits.detach(), mask)
        metrics.update({"distill_loss": float(aggregate_token_loss(per_token, mask, c.aggregation).detach()),  # type: ignore[arg-type]
                        "kl": float((kl.sum() / mask.sum()).detach()),
                        "masked_fraction": 1.0 - float((mask.sum(1) > 0).float().mean()),
                        "beta": self.beta, "bank_size": float(self.bank.count())})
        return loss, metrics

    def update(self, batch: RolloutBatch) -> dict[str, float]:
        self._gaps = []
        metrics = super().update(batch)
        metrics["beta"] = self.beta  # after the dual step
        return metrics

    def after_update(self) -> None:
        """Dual ascent on beta with this update's mean gap over successful episodes (none: no step)."""
        count = sum(n for _, n in self._gaps)
        if self.config.margin and count > 0:
            self.beta = dual_step(self.beta, self.config.margin_value, sum(s for s, _ in self._gaps) / count,
                                  self.config.dual_lr)

    # ------------------------------------------------------------------ state
    def extra_state(self) -> dict[str, Any]:
        return {"beta": self.beta, "composer": self.composer.trainable_state(), "seeded": sorted(self._seeded)}

    def load_extra_state(self, state: dict[str, Any]) -> None:
        self.beta = float(state.get("beta", self.beta))
        if "composer" in state:
            self.composer.load_trainable_state(state["composer"])
        self._seeded = set(state.get("seeded", []))
