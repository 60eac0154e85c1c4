"""LOPD: latent on-policy self-distillation with an experience bank and a privileged-margin constraint.

Experience. The student's successful training episodes (instruction + compact action-result trace) go
into an :class:`experience_bank.ExperienceBank` (``algo.bank_path``, else ``<output_dir>/experience_bank``).
The bank holds successful rollouts only, as in the paper; ``algo.seed_walkthroughs`` also puts each task's
expert walkthrough in (not the paper's setting). Under torchrun every rank adds every rank's successes, so
all ranks retrieve from the same bank. The bookkeeping (what is banked, the search, where the bank lives,
its checkpoint) is :mod:`algorithms.lopd.experience`; this module keeps the method.

Retrieval rule (what keeps LOPD apart from OPSD and SDPO, ``METHODS.md``: "never an experience of the
current task"). For an episode of task X, the top-J experiences by instruction similarity are taken from
the experiences that

- belong to ANOTHER task than X (same env, a different task id): never X's walkthrough, never a sibling
  rollout's success on X, never the episode's own trace. Being handed X's solution is OPSD's setting, a
  successful sibling SDPO's; LOPD learns its context from other tasks' experience. Another task with the
  same instruction text (a different layout of the same goal) is another task and may be retrieved;
- were banked BEFORE this batch: a batch's successes enter the bank only after its update
  (:meth:`LOPD.update`), so no episode of a batch is retrievable by that batch.

The J experiences are retrieved once per batch (``prepare``).

Teacher. A frozen copy of the initial backbone (a LoRA student's base, without its adapter), conditioned
on ``c_phi``: the J x K latents the :class:`~algorithms.lopd.composer.LatentComposer` (LoRA encoder + K
learned queries) makes from the (task, experience) pairs, injected as input embeddings before the
student's sequence, so student position t sits at teacher position t + J*K. A row with no experience is
masked out.

Signal. Reverse KL(student || teacher) over the student's top-M ids plus a tail bucket, on the student's
agent tokens; the teacher is NOT detached: the composer and the student are optimised jointly, the
composer through the teacher's logits (it is in the optimiser, synced across ranks and clipped with the
student).

Privileged margin. On successful episodes the teacher should beat the student on the student's own
tokens: ``gap = mean over successful rows of mean_t(log p_T(y_t) - log p_S(y_t)) >= m``. The loss adds
``beta * (m - gap)`` with the student's log-probs detached (the constraint is on the composer's context;
letting it push the student's likelihood down would fight the distillation). After each update
``beta <- max(0, beta + eta (m - gap))`` with the update's gap. beta, the composer's trainable weights
and the bank's contents are in the checkpoint; a resume rolls the bank back to the checkpoint.

Ablations: ``algo.train_composer=false`` (frozen composer), ``algo.margin=false`` (no constraint),
``algo.context=text`` (retrieved experiences as text via :func:`agentgym_opd.distill.teacher_prefix`).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch

from agentgym_opd.algorithm import LossTerm, Step, fit_width, micro_batch, weighted_sum
from agentgym_opd.config import constrained
from agentgym_opd.distill import (DistillConfig, DistillState, DistillationAlgorithm, aligned_teacher_hidden,
                                  reverse_kl_per_token, with_context)
from agentgym_opd.losses import token_logprobs, topm_distillation
from agentgym_opd.policy.hf import (can_chunk, chunk_positions, chunked_over_positions, final_hidden_states,
                                   output_head, output_logits)
from algorithms.lopd.composer import LatentComposer, plain_backbone
from algorithms.lopd.experience import (bank_entries, bank_entry, experiences_to_bank, from_every_rank,  # noqa: F401
                                        open_bank, restore_bank, retrieve_other_tasks, same_task,
                                        walkthrough_experience)
from agentgym_opd.rollout import RolloutBatch
from agentgym_opd.types import Episode


@dataclass
class LOPDConfig(DistillConfig):
    top_m: int = constrained(32, ge=1, help="top-M support (student's) plus a tail bucket")
    num_experiences: int = constrained(2, ge=1, help="J: experiences retrieved per task")
    num_latents: int = constrained(4, ge=1, help="K: latent vectors per experience")
    experience_max_tokens: int = constrained(192, ge=8, help="tokens of each (task, experience) text the composer reads")
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
    seed_walkthroughs: bool = constrained(False, help="also bank each task's expert walkthrough (not the paper's setting)")

    def __post_init__(self) -> None:
        """Refuse the shared divergence knobs LOPD does not implement, rather than ignore them."""
        fixed = {"divergence": "reverse_kl", "estimator": "full", "top_m_support": "student", "clip": None,
                 "jsd_beta": 0.5}
        wrong = [f"algo.{k}={getattr(self, k)!r}" for k, v in fixed.items() if getattr(self, k) != v]
        if wrong:
            raise ValueError(f"LOPD does not implement {', '.join(wrong)}: its signal is reverse KL over the "
                             "student's top-M plus a tail bucket; remove these settings")


@dataclass
class LOPDState(DistillState):
    """Per batch: the experiences retrieved for each row (empty: the row is masked out)."""

    found: list[list[Any]] = field(default_factory=list)


def latent_teacher_hidden(model: Any, context: Sequence[torch.Tensor | None], batch: RolloutBatch, rows: slice,
                          width: int) -> torch.Tensor:
    """The teacher's final hidden states (WITH gradient to the latents) in the student's shifted coordinates
    ``[b, width-1, H]``; its logits are ``lm_head`` of them, made a chunk of positions at a time by the loss.

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
    attention = torch.zeros(len(seqs), full, dtype=torch.long, device=device)
    padded = []
    for k, s in enumerate(seqs):
        padded.append(torch.nn.functional.pad(s, (0, 0, 0, full - s.shape[0])))
        attention[k, : s.shape[0]] = 1
    hidden = model.get_decoder()(inputs_embeds=torch.stack(padded), attention_mask=attention,
                                 use_cache=False).last_hidden_state
    index = torch.arange(width - 1, device=device)[None, :] + torch.tensor(offsets, device=device)[:, None]
    index = index.clamp(0, hidden.shape[1] - 1)
    return hidden.gather(1, index[..., None].expand(-1, -1, hidden.shape[-1]))


def lopd_token_terms(student_logits: torch.Tensor, teacher_logits: torch.Tensor, targets: torch.Tensor,
                     mask: torch.Tensor, config: "LOPDConfig") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per position: the top-M (student support) + tail reverse KL with gradient to both sides, the exact
    reverse KL (a metric), and the teacher-student log-prob gap of the sampled token (the margin's term)."""
    per_token = topm_distillation(student_logits, teacher_logits, config.top_m, mask, "reverse_kl",
                                  support="student", tail=config.tail, teacher_grad=True)
    kl = reverse_kl_per_token(student_logits.detach(), teacher_logits.detach(), mask)
    gap = token_logprobs(teacher_logits, targets) - token_logprobs(student_logits, targets).detach()
    return per_token, kl, gap


def dual_step(beta: float, margin: float, gap: float, eta: float) -> float:
    """Projected dual ascent on the margin constraint: ``max(0, beta + eta (m - gap))``."""
    return max(0.0, beta + eta * (margin - gap))


class LOPD(DistillationAlgorithm):
    """Latent self-distillation: a frozen self-teacher fed composed latents of retrieved experiences; reverse KL + margin."""

    Config = LOPDConfig

    def __init__(self, config: Any, student: Any, teacher: Any = None, **kwargs: Any):
        super().__init__(config, student, teacher, **kwargs)
        c = self.config
        self.frozen_teacher = plain_backbone(self.model)
        if self.frozen_teacher is self.model:
            self.frozen_teacher = copy.deepcopy(self.model)
        self.frozen_teacher.eval().requires_grad_(False)
        self.composer = LatentComposer(self.frozen_teacher, student.tokenizer, num_latents=c.num_latents,
                                       lora_rank=c.lora_rank, max_tokens=c.experience_max_tokens)
        if not c.train_composer or c.context != "latent":
            self.composer.requires_grad_(False)
        else:
            self.optimizer.add_param_group({"params": self.composer.trainable_parameters(), "lr": c.composer_lr})
        self.beta = float(c.beta_init)
        self._bank: Any = None
        self._seeded: set[str] = set()

    # ------------------------------------------------------------------ experience
    @property
    def bank(self) -> Any:
        """The experience bank, opened on first use (under torchrun each rank keeps its own copy)."""
        if self._bank is None:
            self._bank = open_bank(self.config, self.work_dir, self.dist, owner=self)
        return self._bank

    def update(self, batch: RolloutBatch) -> dict[str, float]:
        """The batch's update, THEN its successes enter the bank: retrieval for a batch (in ``prepare``) never
        sees that batch's own episodes (the retrieval rule in the module docstring)."""
        metrics = super().update(batch)
        self.remember(batch.episodes)
        return metrics

    def remember(self, episodes: Sequence[Episode]) -> None:
        """Bank every rank's successful episodes (and, once per task, its walkthrough when seeding is on)."""
        items = from_every_rank(experiences_to_bank(episodes, self._seeded, self.config.seed_walkthroughs), self.dist)
        if items:
            self.bank.add_many(items)

    def retrieve(self, episode: Episode) -> list[Any]:
        """Top-J experiences of OTHER tasks of the episode's env, best first (the retrieval rule)."""
        return retrieve_other_tasks(self.bank, episode.task, self.config.num_experiences)

    # ------------------------------------------------------------------ teacher
    def prepare(self, batch: RolloutBatch) -> LOPDState:
        found = [self.retrieve(episode) for episode in batch.episodes]
        contexts = [with_context([e.as_text() for e in f]) if f else None for f in found]
        success = torch.tensor([float(ep.success) for ep in batch.episodes])
        kept = torch.tensor([float(bool(f)) for f in found])
        return LOPDState(metrics={"masked_fraction": 1.0 - float(kept.mean()), "bank_size": float(self.bank.count()),
                                  "margin_rows": float((kept * success).sum()), "beta": self.beta},
                         contexts=contexts, found=found)

    def token_weights(self, batch: RolloutBatch, state: LOPDState, step: Step) -> dict[str, LossTerm]:
        terms = super().token_weights(batch, state, step)
        if self.config.margin:  # mean over successful rows of each row's mean gap
            success = torch.tensor([float(ep.success) for ep in batch.episodes])
            terms["margin"] = LossTerm(terms["distill"].weights * success[:, None], "seq_mean_token_mean")
        return terms

    def compute_loss(self, batch: RolloutBatch, rows: slice, coef: dict[str, torch.Tensor], state: LOPDState,
                     step: Step) -> tuple[torch.Tensor, dict[str, float]]:
        c = self.config
        ids, attention, mask = micro_batch(self.model, batch, rows)
        width, targets = ids.shape[1], ids[:, 1:]
        mask = mask * self.kept_rows(state)[rows].to(mask.device)[:, None]
        if c.context == "latent":
            context = [self.composer.context(batch.episodes[r].task.instruction, [e.as_text() for e in state.found[r]])
                       if state.found[r] else None for r in range(rows.start, rows.stop)]
            teacher_hidden = latent_teacher_hidden(self.frozen_teacher, context, batch, rows, width)
        else:
            teacher_hidden = aligned_teacher_hidden(self.frozen_teacher, self.teacher_view(batch, rows, state), width).hidden
        if can_chunk(self.model):  # student and teacher heads a chunk of positions at a time
            student_hidden = final_hidden_states(self.model, ids, attention)[:, :-1]
            b = student_hidden.shape[0]

            def one_chunk(h: torch.Tensor, start: int, end: int):
                return lopd_token_terms(output_logits(self.model, h[:b]), output_logits(self.frozen_teacher, h[b:]),
                                        targets[:, start:end], mask[:, start:end], c)

            step_positions = chunk_positions(2 * b, output_head(self.model).weight.shape[0])
            hidden = torch.cat([student_hidden, teacher_hidden.to(student_hidden.dtype)], dim=0)
            per_token, kl, gap = chunked_over_positions(self.model, hidden, one_chunk, step_positions)
        else:  # a student whose hidden states cannot be reached: its whole forward
            student_logits = self.model(input_ids=ids, attention_mask=attention, use_cache=False).logits.float()[:, :-1]
            per_token, kl, gap = lopd_token_terms(student_logits, output_logits(self.frozen_teacher, teacher_hidden),
                                                  targets, mask, c)
        loss = weighted_sum(per_token, coef["distill"])
        metrics = {"distill_loss": float(loss.detach()), "kl": float(weighted_sum(kl.detach(), coef["distill"]))}
        if c.margin:
            loss = loss + self.beta * weighted_sum(c.margin_value - gap, coef["margin"])
            metrics["margin_gap"] = float(weighted_sum(gap.detach(), coef["margin"]))
            metrics["margin_weight"] = float(fit_width(coef["margin"], gap).sum())
        return loss, metrics

    def after_update(self, metrics: dict[str, float], step: Step) -> None:
        """Dual ascent on beta with this update's gap over successful episodes (none: no step)."""
        if self.config.margin and metrics.get("margin_weight", 0.0) > 0.5:  # the weights sum to 1 when any row had one
            self.beta = dual_step(self.beta, self.config.margin_value, metrics["margin_gap"], self.config.dual_lr)
        metrics["beta"] = self.beta

    # ------------------------------------------------------------------ state
    def extra_state(self) -> dict[str, Any]:
        return {"beta": self.beta, "composer": self.composer.trainable_state(), "seeded": sorted(self._seeded),
                "bank": bank_entries(self.bank)}

    def load_extra_state(self, state: dict[str, Any]) -> None:
        self.beta = float(state.get("beta", self.beta))
        if "composer" in state:
            self.composer.load_trainable_state(state["composer"])
        self._seeded = set(state.get("seeded", []))
        if "bank" in state:
            restore_bank(self.bank, state["bank"])

