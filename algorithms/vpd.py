"""VPD: variational policy distillation, EM in one weight-shared network.

NOTES (decisions where the brief was silent, and what remains)
- Schedule (``algo.schedule``): ``alternate`` (default) runs ONE phase per ``update`` call: an E-step is
  due at the first call and after every ``m_steps_per_e_step`` M-steps, every other call is an M-step, so
  each phase sees fresh on-policy rollouts. ``inner`` runs, in every call, the E-step and then the m
  M-steps on the same batch (more optimiser steps per rollout). Metrics say which ran: ``phase_e`` /
  ``phase_m`` (1.0 or 0.0), ``e_steps`` / ``m_steps`` (totals), ``e_skipped``.
- An E-step is ``e_updates`` optimiser steps (default 2) against ONE reference snapshot taken at its
  start. With a single step the implicit reward is exactly 0 at the forward pass (q = pi_ref), so the
  reference, delta and BCO's saturation would be vacuous; from the second step on they bound how far
  the teacher moves from the student.
- A batch with only chosen or only rejected rows still trains (``algo.one_sided=train``, default): BCO
  is unpaired, and the running baseline delta is what makes a one-sided batch meaningful. With
  ``one_sided=skip`` such a call runs an M-step instead and the E-step stays due for the next call.
  A call where no row has any feedback C does no optimiser step at all (``e_skipped``/``nothing_to_learn``).
- delta: TRL's order: the batch's (detached) rewards are folded into the running mean first, then the
  loss uses the new mean. That needs the rewards of the whole batch before the micro-batched gradient
  pass, so each E-update does one no-grad pre-pass (the reference's log-probs are computed once per
  E-step and reused by its updates).
- The BCO loss is the mean over the kept sequences of the whole batch (micro-batches are weighted by
  their kept-row count, so the gradient equals one big batch's).
- Feedback sources (``algo.feedback``, '+'-joined, e.g. ``env+sibling``): ``env`` = the episode's own
  textual feedback (where the env gave none, e.g. the engine ended the episode on unparseable output, the
  outcome and the turns' execution errors stand in: see ``env_feedback``); ``sibling`` = the action trace of another SUCCESSFUL rollout of the same task id (never
  the row itself); ``critique`` = a short critique of the episode generated greedily by the network itself,
  told only the transcript and the outcome. A row none of whose sources has text is masked out of both
  steps. ``needs_groups`` stays False (so the plain CLI line with ``rollout.group_size=1`` runs); in
  ``sibling`` mode ``collect`` instead plays each task of the step ``sibling_group_size`` times on the
  envs the trainer already made (4 tasks x 1 -> 2 tasks x 2); siblings are matched by task id.
- The M-step teacher is the live network (with C, no gradient), i.e. the teacher as the latest E-step
  left it and as the M-steps move it: one network, as the method says.
- ``--teacher`` is not used (the teacher is the student's own network).
- Remaining: the critique prompt is untuned (the tiny model's critiques are noise); no LoRA-specific
  cheap reference (a LoRA student's reference is a deep copy of the whole PEFT model).
- ``e_lr_scale`` (default 1.0): the E-step's lr as a multiple of train.lr (restored for the M-steps). Added
  because one AdamW E-update at the run's lr moved the rejected rows' summed log-prob by 40-80 nats.
- Measured (tiny model, household/train 8 tasks, CPU; student = SFT 90 steps, greedy train success 0.375;
  16 steps, tasks_per_step 4, lr 3e-4, rollout temperature 0.5, 3 seeds): OPD (teacher = SFT 160 steps,
  greedy 0.875) 0.375 -> 0.500 on every seed; VPD default 0.375 -> 0.000 on every seed; also 0.000 with
  beta=1, with e_lr_scale=0.1, with env+sibling feedback, and (weaker SFT-60 student) with one_sided=skip.
  Why: the feedback-conditioned view, the teacher, is worse than the student in this world. The
  same network, greedy, with C in the prompt: 0/8 tasks (plain view 3/8), even with the full walkthrough as C,
  and even after an SFT warm start with ``algo.context_fraction=0.5``. M-steps then distil a worse policy
  (their KL is 0.7-1.5 nats/token right after an E-step). VPD needs a network that already reads feedback;
  the tiny model does not. Not measured: a larger student (SmolLM2), which the CPU budget did not allow.

Method
------
Teacher ``q(y | x, C)``: the student's own network with diagnostic feedback ``C`` appended to the first
user message (``distill.teacher_prefix``), re-scoring the student's exact sampled tokens of every turn.

E-step (train the teacher view with BCO, unpaired). Successful trajectories are *chosen*, failed ones
*rejected*, each under its own feedback ``C``. At the start of the E-step the reference prior is reset to
the current student, ``pi_ref <- pi_theta`` (a frozen snapshot). The implicit reward, summed over the
agent tokens, is ``r(y) = beta * sum_t [log q(y_t | x, C, y_<t) - log pi_ref(y_t | x, C, y_<t)]``, and with
``delta`` the running mean of the rewards,
``L_E = mean_i [ -log sigmoid(r_i - delta) if y_i chosen else -log sigmoid(-(r_i - delta)) ]``.

M-step (distil into the student view). The student, WITHOUT ``C``, minimises the per-token divergence
(``algo.divergence``, reverse KL by default) to the teacher ``q(. | x, C, h_t)`` on its own rollouts, with
no gradient through the teacher. ``m_steps_per_e_step`` M-steps per E-step (asymmetric counts).

Why it works: with feedback in view, telling good trajectories from bad is easier than producing good
ones, so the E-step makes the feedback-conditioned view a better policy than the student; because the
reference is the current student, the E-step only learns what the feedback adds. The M-step then moves
that knowledge into the feedback-free view the agent acts with, as a dense per-token signal.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import torch

from agentgym_opd.config import constrained
from agentgym_opd.distill import (DistillConfig, DistillationAlgorithm, SelfTeacher, TeacherInputs, actions_block,
                                  episode_actions, with_context)
from agentgym_opd.losses import RunningMean, bco_implicit_reward, bco_loss, token_logprobs
from agentgym_opd.policy.base import SamplingParams
from agentgym_opd.rollout import RolloutBatch, RolloutEngine

FEEDBACK_SOURCES = ("env", "sibling", "critique")
INSTRUCTION = "Solve the original task correctly."
CRITIQUE_REQUEST = ("Critique the attempt above in one or two sentences: what went wrong, or what made it work, "
                    "and what to do next time.")


@dataclass
class VPDConfig(DistillConfig):
    """VPD's knobs: the shared divergence knobs (the M-step) plus the E-step's BCO and the schedule."""

    feedback: str = constrained("env", help="feedback source(s) C shown to the teacher, '+'-joined: env, sibling, critique")
    beta: float = constrained(0.1, gt=0, help="BCO implicit-reward scale beta")
    m_steps_per_e_step: int = constrained(3, ge=1, help="M-steps per E-step (the asymmetric count)")
    e_updates: int = constrained(2, ge=1, help="optimiser steps per E-step against one reference snapshot")
    e_lr_scale: float = constrained(1.0, gt=0, help="the E-step's learning rate as a multiple of train.lr")
    schedule: str = constrained("alternate", choices=("alternate", "inner"),
                                help="alternate = one phase per update call; inner = E then m M-steps on each batch")
    one_sided: str = constrained("train", choices=("train", "skip"),
                                 help="E-step on a batch with no chosen or no rejected rows: train (unpaired) or skip")
    delta_momentum: float | None = constrained(None, gt=0, le=1, help="None = cumulative mean of rewards; else an EMA")
    sibling_group_size: int = constrained(2, ge=2, help="sibling mode: rollouts of each task per step")
    critique_tokens: int = constrained(32, ge=1, help="critique mode: tokens of the self-critique")
    critique_max_chars: int = constrained(1500, ge=100, help="critique mode: transcript shown (its last characters)")

    def __post_init__(self) -> None:
        unknown = [s for s in self.sources if s not in FEEDBACK_SOURCES]
        if not self.sources or unknown:
            raise ValueError(f"feedback must be '+'-joined sources from {', '.join(FEEDBACK_SOURCES)}, got {self.feedback!r}")

    @property
    def sources(self) -> tuple[str, ...]:
        return tuple(s.strip() for s in self.feedback.split("+") if s.strip())


# ----------------------------------------------------------------------------------------------------
# Pure helpers (tested against hand computation)
# ----------------------------------------------------------------------------------------------------


def context_logprobs(model: Any, inputs: TeacherInputs, targets: torch.Tensor, width: int) -> torch.Tensor:
    """``log q(y_t)`` of the student's tokens under ``model`` reading the teacher's sequences, in the
    student's shifted coordinates ``[b, width - 1]``; differentiable (``distill.aligned_teacher_logits`` is
    the no-grad, full-vocabulary version the M-step uses). Log-probs are taken in the teacher's own
    coordinates and then shifted by the row's offset, so no second ``[b, T, V]`` tensor is built."""
    device = next(model.parameters()).device
    ids = inputs.input_ids.to(device)
    logits = model(input_ids=ids, attention_mask=inputs.attention_mask.to(device), use_cache=False).logits.float()
    own = token_logprobs(logits[:, :-1], ids[:, 1:])  # [b, W_t - 1]: position p predicts teacher id p+1
    index = torch.arange(width - 1, device=device)[None, :] + inputs.offsets.to(device)[:, None]
    shifted = own.gather(1, index.clamp(0, own.shape[1] - 1))
    return torch.where(index < own.shape[1], shifted, torch.zeros_like(shifted))  # beyond the end: masked anyway


@dataclass
class Phase:
    """Which step the next update runs, from the counters VPD checkpoints."""

    e_steps: int = 0
    m_steps: int = 0
    m_since_e: int = 0

    def e_due(self, m_per_e: int) -> bool:
        return self.e_steps == 0 or self.m_since_e >= m_per_e

    def ran_e(self) -> None:
        self.e_steps += 1
        self.m_since_e = 0

    def ran_m(self) -> None:
        self.m_steps += 1
        self.m_since_e += 1


def repeat_tasks(tasks: list[str], group: int) -> list[str]:
    """The step's task list with each of its first ``ceil(n / group)`` tasks played ``group`` times, so the
    same number of envs yields siblings (``[a, b, c, d], 2 -> [a, a, b, b]``)."""
    return [tasks[i // group] for i in range(len(tasks))]


# ----------------------------------------------------------------------------------------------------
# The algorithm
# ----------------------------------------------------------------------------------------------------


class VPD(DistillationAlgorithm):
    """Variational policy distillation: BCO on the feedback-conditioned view (E), KL into the plain view (M)."""

    Config = VPDConfig
    needs_groups = False  # sibling mode regroups tasks in `collect` (see NOTES)

    def __init__(self, config: Any, student: Any, teacher: Any = None, **kwargs: Any):
        super().__init__(config, student, teacher, **kwargs)
        self.live_teacher = SelfTeacher(student, "live")
        self.delta = RunningMean(self.config.delta_momentum)
        self.phase = Phase()
        self.reference: torch.nn.Module | None = None  # pi_ref, refreshed at the start of every E-step
        self._critiques: tuple[RolloutBatch, list[str | None]] | None = None

    # ------------------------------------------------------------------ data
    def collect(self, engine: RolloutEngine, envs: Any, tasks: Any, *, group_size: int, seed: int) -> RolloutBatch:
        tasks = list(tasks)
        if "sibling" in self.config.sources and group_size == 1:
            tasks = repeat_tasks(tasks, self.config.sibling_group_size)
        return engine.collect(envs, tasks, group_size=group_size, seed=seed)

    # ------------------------------------------------------------------ the feedback C
    def teacher_context(self, batch: RolloutBatch, row: int) -> str | None:
        episode = batch.episodes[row]
        parts: list[str] = []
        for source in self.config.sources:
            if source == "env":
                parts.append("Feedback on this attempt: " + env_feedback(episode))
            elif source == "sibling":
                sibling = successful_sibling_by_task(batch, row)
                if sibling is not None:
                    parts.append("A successful attempt at this task. "
                                 + actions_block(episode_actions(batch.episodes[sibling])))
            elif source == "critique":
                critique = self.critiques(batch)[row]
                if critique:
                    parts.append("Your own critique of this attempt: " + critique)
        return with_context(parts + [INSTRUCTION]) if parts else None

    def critiques(self, batch: RolloutBatch) -> list[str | None]:
        """One self-critique per row, generated once per batch (E and M steps must see the same C)."""
        if self._critiques is not None and self._critiques[0] is batch:
            return self._critiques[1]
        prompts = [self.student.apply_chat_template(critique_messages(ep, self.config.critique_max_chars))
                   for ep in batch.episodes]
        gens = self.student.generate(prompts, SamplingParams(max_new_tokens=self.config.critique_tokens, temperature=0.0))
        texts = [" ".join(g.text.split()) or None for g in gens]
        self._critiques = (batch, texts)
        return texts

    def teacher_logits(self, inputs: TeacherInputs, width: int) -> torch.Tensor:
        return self.live_teacher.logits(inputs, width)

    # ------------------------------------------------------------------ the schedule
    def update(self, batch: RolloutBatch) -> dict[str, float]:
        if len(batch) == 0:
            raise ValueError("update: empty batch")
        kept = torch.tensor([self.teacher_context(batch, row) is not None for row in range(len(batch))], dtype=torch.bool)
        if not kept.any():  # no row has any feedback: nothing to learn, and no optimiser step (no drift)
            return {"loss": 0.0, "phase_e": 0.0, "phase_m": 0.0, "e_skipped": 0.0, "nothing_to_learn": 1.0,
                    **self._counters()}
        success = torch.tensor([ep.success for ep in batch.episodes], dtype=torch.bool)
        n_chosen, n_rejected = int((kept & success).sum()), int((kept & ~success).sum())
        metrics: dict[str, float] = {"phase_e": 0.0, "phase_m": 0.0, "e_skipped": 0.0, "nothing_to_learn": 0.0}
        run_e = self.config.schedule == "inner" or self.phase.e_due(self.config.m_steps_per_e_step)
        if run_e and self.config.one_sided == "skip" and (n_chosen == 0 or n_rejected == 0):
            run_e = False
            metrics["e_skipped"] = 1.0
        if run_e:
            metrics.update(self.e_step(batch, kept, success))
            metrics["phase_e"] = 1.0
        if self.config.schedule == "inner" or not run_e:
            m_runs = self.config.m_steps_per_e_step if self.config.schedule == "inner" else 1
            for k in range(m_runs):
                m_metrics = self.m_step(batch)
                if k == 0 and m_runs > 1:  # inner schedule: the first and last M-step's KL on this batch
                    metrics["kl_first"] = m_metrics.get("kl", 0.0)
                metrics.update(m_metrics)
            metrics["phase_m"] = 1.0
        return {**metrics, **self._counters()}

    def _counters(self) -> dict[str, float]:
        return {"e_steps": float(self.phase.e_steps), "m_steps": float(self.phase.m_steps),
                "bco_delta": float(self.delta.mean)}

    # ------------------------------------------------------------------ E-step
    def refresh_reference(self) -> torch.nn.Module:
        """``pi_ref <- pi_theta``: copy the current weights into the frozen reference (made once, then reused)."""
        if self.reference is None:
            self.reference = copy.deepcopy(self.model).eval().requires_grad_(False)
        else:
            self.reference.load_state_dict(self.model.state_dict())
        return self.reference

    def e_step(self, batch: RolloutBatch, kept: torch.Tensor, success: torch.Tensor) -> dict[str, float]:
        """``e_updates`` optimiser steps of BCO on the teacher view, against one fresh reference snapshot."""
        reference = self.refresh_reference()
        base_lrs = [group["lr"] for group in self.optimizer.param_groups]
        try:
            for group in self.optimizer.param_groups:
                group["lr"] = group["lr"] * self.config.e_lr_scale
            metrics = self._e_updates(batch, kept, success, reference)
        finally:  # the M-steps (and the trainer's scheduler) see the learning rate as it was
            for group, lr in zip(self.optimizer.param_groups, base_lrs):
                group["lr"] = lr
        self.phase.ran_e()
        return metrics

    def _e_updates(self, batch: RolloutBatch, kept: torch.Tensor, success: torch.Tensor,
                   reference: torch.nn.Module) -> dict[str, float]:
        chunks = [slice(s, min(s + self.micro_batch_size, len(batch))) for s in range(0, len(batch), self.micro_batch_size)]
        views = [self._e_view(batch, rows) for rows in chunks]
        with torch.no_grad():
            ref_logps = [context_logprobs(reference, inputs, targets, width) for inputs, targets, _, width in views]
        n_kept = int(kept.sum())
        metrics: dict[str, float] = {}
        for update in range(self.config.e_updates):
            self.model.train()
            with torch.no_grad():  # TRL's order: fold this batch's rewards into delta, then use it
                rewards = torch.cat([bco_implicit_reward(context_logprobs(self.model, inputs, targets, width), ref, mask,
                                                         self.config.beta).cpu()
                                     for (inputs, targets, mask, width), ref in zip(views, ref_logps)])
            delta = self.delta.update(rewards[kept])
            self.optimizer.zero_grad(set_to_none=True)
            loss_total, chosen_sum, rejected_sum = 0.0, 0.0, 0.0
            for rows, (inputs, targets, mask, width), ref in zip(chunks, views, ref_logps):
                row_kept, row_success = kept[rows], success[rows]
                if not row_kept.any():
                    continue
                logp = context_logprobs(self.model, inputs, targets, width)
                r = bco_implicit_reward(logp, ref, mask, self.config.beta)
                chosen = (row_kept & row_success).to(r.device)
                rejected = (row_kept & ~row_success).to(r.device)
                loss, _ = bco_loss(r[chosen], r[rejected], delta)
                if not torch.isfinite(loss):
                    raise FloatingPointError(f"VPD E-step: non-finite BCO loss {float(loss)}")
                share = int(row_kept.sum()) / n_kept
                (loss * share).backward()
                loss_total += share * float(loss.detach())
                chosen_sum += float(r[chosen].detach().sum())
                rejected_sum += float(r[rejected].detach().sum())
            if self.grad_clip is not None:
                metrics["e_grad_norm"] = float(torch.nn.utils.clip_grad_norm_(self.trainable_parameters(), self.grad_clip))
            self.optimizer.step()
            self.after_update()
            if update == 0:
                metrics["bco_loss_first"] = loss_total
            n_c, n_r = int((kept & success).sum()), int((kept & ~success).sum())
            metrics.update({"bco_loss": loss_total, "loss": loss_total, "bco_chosen": float(n_c), "bco_rejected": float(n_r),
                            "bco_reward_chosen": chosen_sum / n_c if n_c else 0.0,
                            "bco_reward_rejected": rejected_sum / n_r if n_r else 0.0})
        self.model.eval()
        return metrics

    def _e_view(self, batch: RolloutBatch, rows: slice) -> tuple[TeacherInputs, torch.Tensor, torch.Tensor, int]:
        """The teacher's inputs for ``rows``, the student's target ids and loss mask, and the rows' width."""
        inputs, keep = self.teacher_view(batch, rows)
        width = int(batch.attention_mask[rows].sum(dim=1).max())
        device = next(self.model.parameters()).device
        targets = batch.input_ids[rows][:, 1:width].to(device)
        mask = batch.loss_mask[rows][:, 1:width].to(device).float() * keep.to(device)[:, None]
        return inputs, targets, mask, width

    # ------------------------------------------------------------------ M-step
    def m_step(self, batch: RolloutBatch) -> dict[str, float]:
        """One optimiser step of token-level distillation from the live teacher view into the student view."""
        metrics = super().update(batch)  # the base step: micro-batches, clipping, one optimiser step
        self.phase.ran_m()
        return metrics

    # ------------------------------------------------------------------ state
    def extra_state(self) -> dict[str, Any]:
        return {"delta": self.delta.state_dict(), "phase": vars(self.phase).copy()}

    def load_extra_state(self, state: dict[str, Any]) -> None:
        if "delta" in state:
            self.delta.load_state_dict(state["delta"])
        if "phase" in state:
            self.phase = Phase(**state["phase"])


def env_feedback(episode: Any) -> str:
    """The episode's own textual feedback; where the env gave none (an episode the rollout engine ended on
    unparseable output never reached the env's end-of-episode report) the outcome and the execution errors
    the turns recorded stand in, so every row has a C in ``env`` mode."""
    if episode.feedback:
        return episode.feedback
    text = "Task completed." if episode.success else "Task not completed."
    errors = episode.errors()
    if errors:
        text += f" {len(errors)} of {episode.num_turns} actions failed; the last error: {errors[-1].message}"
    return text


def successful_sibling_by_task(batch: RolloutBatch, row: int) -> int | None:
    """Another row of the same task id that succeeded (the highest-return one), or None. Matching by task
    id, not group id, finds siblings both in trainer groups and in the regrouped sibling-mode batches."""
    task_id = batch.episodes[row].task.id
    best = None
    for other, episode in enumerate(batch.episodes):
        if other != row and episode.task.id == task_id and episode.success:
            if best is None or episode.return_ > batch.episodes[best].return_:
                best = other
    return best


def critique_messages(episode: Any, max_chars: int) -> list[dict[str, str]]:
    """The self-critique prompt: the attempt's transcript (its last ``max_chars`` characters), the outcome
    (known to the trainer from the reward), and the request. The env's textual feedback is not shown, so
    ``critique`` is the model's own diagnosis, not a paraphrase of the ``env`` source."""
    lines = [f"Task: {episode.initial_observation}"]
    for k, turn in enumerate(episode.turns, 1):
        lines.append(f"Action {k}: {turn.action.strip()}")
        lines.append(f"Observation {k}: {turn.observation.strip()}")
    transcript = "\n".join(lines)
    if len(transcript) > max_chars:
        transcript = "..." + transcript[-max_chars:]
    outcome = "The attempt succeeded." if episode.success else "The attempt failed."
    return [{"role": "user", "content": f"{transcript}\n\n{outcome}\n{CRITIQUE_REQUEST}"}]
