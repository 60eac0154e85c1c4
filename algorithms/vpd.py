"""VPD: variational policy distillation, EM in one weight-shared network.

Method
------
Teacher ``q(y | x, C)``: the student's own network with diagnostic feedback ``C`` appended to the first
user message (``distill.teacher_prefix``), re-scoring the student's exact sampled tokens of every turn.

E-step (train the teacher view with BCO, unpaired). Successful trajectories are *chosen*, failed ones
*rejected*, each under its own feedback ``C``. At the start of the E-step the reference prior is reset to
the current student policy, ``pi_ref <- pi_theta``: the current weights reading the student's view ``x``
without ``C`` (``algo.reference_view=student``; ``teacher`` scores the reference on ``x, C`` instead, which
makes the reward exactly 0 at the E-step's first update). Its log-probs are taken once per E-step in a
no-grad pass, so no second model copy is held. The implicit reward, summed over the agent tokens, is
``r(y) = beta * sum_t [log q(y_t | x, C, y_<t) - log pi_ref(y_t | ..., y_<t)]``; with ``delta`` the running
mean of the rewards (this batch's rewards folded in first, over all ranks),
``L_E = mean_i [ -log sigmoid(r_i - delta) if y_i chosen else -log sigmoid(-(r_i - delta)) ]``.
An E-step is ``algo.e_updates`` optimiser steps at ``e_lr_scale`` times the learning rate.

M-step (distil into the student view). The student, WITHOUT ``C``, minimises the per-token divergence
(``algo.divergence``, reverse KL by default) to the live teacher ``q(. | x, C, h_t)`` on its own rollouts,
with no gradient through the teacher. ``m_steps_per_e_step`` M-steps per E-step (asymmetric counts):
``algo.schedule=alternate`` runs one phase per batch, ``inner`` the E-step then the M-steps on each batch
(the schedule and its counters: :mod:`algorithms.vpd_phases`).

Feedback ``C`` (``algo.feedback``, '+'-joined): ``env`` (the episode's textual feedback, or its outcome and
errors where the env gave none), ``sibling`` (a successful rollout of the same task), ``critique`` (the
network's own greedy critique of the transcript). A row with no ``C`` is masked out of both steps.

Why it works: with feedback in view, telling good trajectories from bad is easier than producing good
ones, so the E-step makes the feedback-conditioned view a better policy than the student; because the
reference is the current student, the E-step only learns what the feedback adds. The M-step then moves
that knowledge into the feedback-free view the agent acts with, as a dense per-token signal.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from agentgym_opd.algorithm import LossTerm, Step, agent_mask, fit_width, sequence_logprobs, token_logprobs_of
from agentgym_opd.config import constrained
from agentgym_opd.distill import (AlignedTeacher, DistillConfig, DistillState, DistillationAlgorithm, SelfTeacher,
                                  TeacherInputs, actions_block, attempt_feedback, episode_actions, successful_sibling,
                                  with_context)
from agentgym_opd.losses import RunningMean, bco_implicit_reward, bco_row_losses
from agentgym_opd.policy.base import SamplingParams
from agentgym_opd.rollout import RolloutBatch, RolloutEngine
from algorithms.vpd_phases import Phase, plan_steps  # noqa: F401 (Phase re-exported)

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
    reference_view: str = constrained("student", choices=("student", "teacher"),
                                      help="E-step reference pi_ref = current weights on the student's view (paper) or the teacher's")

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
    student's shifted coordinates ``[b, width - 1]``; differentiable. Log-probs are taken in the teacher's
    own coordinates (a chunk of positions at a time, :func:`agentgym_opd.algorithm.token_logprobs_of`) and
    then shifted by the row's offset, so no ``[b, T, V]`` tensor is built."""
    device = next(model.parameters()).device
    own = token_logprobs_of(model, inputs.input_ids.to(device), inputs.attention_mask.to(device))
    index = torch.arange(width - 1, device=device)[None, :] + inputs.offsets.to(device)[:, None]
    shifted = own.gather(1, index.clamp(0, own.shape[1] - 1))
    return torch.where(index < own.shape[1], shifted, torch.zeros_like(shifted))  # beyond the end: masked anyway


def repeat_tasks(tasks: list[str], group: int) -> list[str]:
    """The step's task list with each of its first ``ceil(n / group)`` tasks played ``group`` times, so the
    same number of envs yields siblings (``[a, b, c, d], 2 -> [a, a, b, b]``)."""
    return [tasks[i // group] for i in range(len(tasks))]


# ----------------------------------------------------------------------------------------------------
# The algorithm
# ----------------------------------------------------------------------------------------------------


@dataclass
class VPDState(DistillState):
    """Per batch: the planned steps, the rows' outcomes, and the E-step's reference log-probs and delta."""

    plan: list[Step] = field(default_factory=list)
    success: torch.Tensor | None = None
    reference: torch.Tensor | None = None  # [B, T-1] log pi_ref of the student's tokens, once per E-step
    delta: float = 0.0
    e_done: int = 0


class VPD(DistillationAlgorithm):
    """Variational policy distillation: BCO on the feedback-conditioned view (E), KL into the plain view (M)."""

    Config = VPDConfig
    needs_groups = False  # sibling mode regroups tasks in `collect`

    def __init__(self, config: Any, student: Any, teacher: Any = None, **kwargs: Any):
        super().__init__(config, student, teacher, **kwargs)
        self.live_teacher = SelfTeacher(student, "live")
        self.delta = RunningMean(self.config.delta_momentum)
        self.phase = Phase()

    # ------------------------------------------------------------------ data
    def collect(self, engine: RolloutEngine, envs: Any, tasks: Any, *, group_size: int, seed: int) -> RolloutBatch:
        tasks = list(tasks)
        if "sibling" in self.config.sources and group_size == 1:
            tasks = repeat_tasks(tasks, self.config.sibling_group_size)
        return engine.collect(envs, tasks, group_size=group_size, seed=seed)

    # ------------------------------------------------------------------ the feedback C
    def teacher_context(self, batch: RolloutBatch, row: int, critiques: list[str | None] | None = None) -> str | None:
        episode = batch.episodes[row]
        parts: list[str] = []
        for source in self.config.sources:
            if source == "env":
                parts.append("Feedback on this attempt: " + env_feedback(episode))
            elif source == "sibling":
                sibling = successful_sibling(batch, row)
                if sibling is not None:
                    parts.append("A successful attempt at this task. "
                                 + actions_block(episode_actions(batch.episodes[sibling])))
            elif source == "critique" and critiques and critiques[row]:
                parts.append("Your own critique of this attempt: " + critiques[row])
        return with_context(parts + [INSTRUCTION]) if parts else None

    def critiques(self, batch: RolloutBatch) -> list[str | None]:
        """One greedy self-critique per row (made once per batch: E and M steps see the same C)."""
        prompts = [self.student.apply_chat_template(critique_messages(ep, self.config.critique_max_chars))
                   for ep in batch.episodes]
        gens = self.student.generate(prompts, SamplingParams(max_new_tokens=self.config.critique_tokens, temperature=0.0))
        return [" ".join(g.text.split()) or None for g in gens]

    def teacher_logits(self, inputs: TeacherInputs, width: int) -> torch.Tensor:
        return self.live_teacher.logits(inputs, width)

    def teacher_hidden(self, inputs: TeacherInputs, width: int) -> AlignedTeacher:
        return self.live_teacher.hidden(inputs, width)

    # ------------------------------------------------------------------ the schedule
    def prepare(self, batch: RolloutBatch) -> VPDState:
        critiques = self.critiques(batch) if "critique" in self.config.sources else None
        contexts = [self.teacher_context(batch, row, critiques) for row in range(len(batch))]
        kept = torch.tensor([c is not None for c in contexts])
        success = torch.tensor([ep.success for ep in batch.episodes])
        state = VPDState(contexts=contexts, success=success)
        from agentgym_opd import distributed as D

        counts = D.all_reduce_sum_list([float(kept.sum()), float((kept & success).sum()), float((kept & ~success).sum())],
                                       self.dist)  # every rank must plan the same steps
        state.plan, schedule = plan_steps(self.config, self.phase, *counts)
        state.metrics = {"masked_fraction": 1.0 - float(kept.float().mean()), **schedule,
                         "bco_chosen": float((kept & success).sum()), "bco_rejected": float((kept & ~success).sum())}
        return state

    def steps(self, state: VPDState) -> list[Step]:
        return list(state.plan)

    def after_update(self, metrics: dict[str, float], step: Step) -> None:
        if step.name == "e":
            metrics["bco_loss"] = metrics["loss"]
        else:
            self.phase.ran_m()
        metrics.update({"e_steps": float(self.phase.e_steps), "m_steps": float(self.phase.m_steps),
                        "bco_delta": float(self.delta.mean)})

    # ------------------------------------------------------------------ E-step
    def begin_step(self, batch: RolloutBatch, state: VPDState, step: Step) -> None:
        """Before each E-update: the reference (once per E-step) and this batch's rewards folded into delta."""
        if step.name != "e":
            return
        from agentgym_opd import distributed as D

        chunks = [slice(s, min(s + self.micro_batch_size, len(batch))) for s in range(0, len(batch), self.micro_batch_size)]
        was_training = self.model.training
        self.model.eval()
        with torch.no_grad():
            if state.e_done == 0 or state.reference is None:  # pi_ref <- pi_theta, at the E-step's start
                state.reference = torch.zeros(batch.loss_mask[:, 1:].shape)
                for rows in chunks:
                    logp = self.reference_logprobs(batch, rows, state)
                    state.reference[rows, : logp.shape[1]] = logp.cpu()
            rewards = torch.cat([self.implicit_rewards(batch, rows, state)[0].cpu() for rows in chunks])
        self.model.train(was_training)
        kept = self.kept_rows(state).bool()
        state.delta = self.delta.update(D.all_gather_floats(rewards[kept].tolist(), self.dist))
        state.e_done += 1
        if state.e_done == self.config.e_updates:
            self.phase.ran_e()
            state.e_done = 0

    def reference_logprobs(self, batch: RolloutBatch, rows: slice, state: VPDState) -> torch.Tensor:
        """``log pi_ref`` of the student's tokens: the current weights on the student's view (default) or on
        the teacher's view (``reference_view=teacher``)."""
        if self.config.reference_view == "student":
            return sequence_logprobs(self.model, batch, rows)[0]
        inputs = self.teacher_view(batch, rows, state)
        width = int(batch.attention_mask[rows].sum(dim=1).max())
        targets = batch.input_ids[rows][:, 1:width]
        return context_logprobs(self.model, inputs, targets, width)

    def implicit_rewards(self, batch: RolloutBatch, rows: slice, state: VPDState) -> tuple[torch.Tensor, torch.Tensor]:
        """``(r [b], mask [b, T-1])`` of ``rows`` under the current weights on the teacher's view."""
        inputs = self.teacher_view(batch, rows, state)
        width = int(batch.attention_mask[rows].sum(dim=1).max())
        device = next(self.model.parameters()).device
        targets = batch.input_ids[rows][:, 1:width].to(device)
        logp = context_logprobs(self.model, inputs, targets, width)
        mask = batch.loss_mask[rows][:, 1:width].to(device).float() * self.kept_rows(state)[rows].to(device)[:, None]
        reference = fit_width(state.reference[rows], logp)
        return bco_implicit_reward(logp, reference, mask, self.config.beta), mask

    def token_weights(self, batch: RolloutBatch, state: VPDState, step: Step) -> dict[str, LossTerm]:
        if step.name == "e":  # the mean over kept rows of each row's BCO loss
            return {"bco": LossTerm(agent_mask(batch) * self.kept_rows(state)[:, None], "seq_mean_token_mean")}
        return super().token_weights(batch, state, step)

    def compute_loss(self, batch: RolloutBatch, rows: slice, coef: dict[str, torch.Tensor], state: VPDState,
                     step: Step) -> tuple[torch.Tensor, dict[str, float]]:
        if step.name != "e":
            return super().compute_loss(batch, rows, coef, state, step)
        r, mask = self.implicit_rewards(batch, rows, state)
        row_share = fit_width(coef["bco"], mask).sum(dim=1)  # 1 / (kept rows of the batch) on kept rows
        per_row = bco_row_losses(r, state.success[rows], state.delta)
        loss = torch.where(row_share > 0, per_row * row_share, torch.zeros_like(per_row)).sum()
        return loss, {"bco_reward": float((r.detach() * row_share).sum())}

    # ------------------------------------------------------------------ state
    def extra_state(self) -> dict[str, Any]:
        return {"delta": self.delta.state_dict(), "phase": self.phase.state_dict()}

    def load_extra_state(self, state: dict[str, Any]) -> None:
        if "delta" in state:
            self.delta.load_state_dict(state["delta"])
        if "phase" in state:
            self.phase = Phase.from_state(state["phase"])


def env_feedback(episode: Any) -> str:
    """The ``env`` source of C: :func:`agentgym_opd.distill.attempt_feedback` with the outcome stated, so
    every row has a C in ``env`` mode."""
    return attempt_feedback(episode, outcome=True)  # type: ignore[return-value]


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
