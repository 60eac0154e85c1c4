"""SFT: behaviour cloning on the expert's actions.

Teacher: none. Signal: cross-entropy on the expert's action tokens, agent tokens only.

The expert: ``task.privileged["demonstration"]`` where the env has one (an expert that acts only on what
the agent can observe, e.g. the household world's searching expert), else ``privileged["walkthrough"]``.
An episode shown WITH privileged context (``context_fraction``) follows the walkthrough that context
spells out: reading the plan from the prompt is then the behaviour being cloned.

Where the data comes from, and why this way: the expert episode is *played* through the same
:class:`~agentgym_opd.rollout.RolloutEngine` the student's rollouts use, by a scripted policy whose
reply is the next expert action, tokenised, plus the end-of-turn token. So the training
sequence has exactly the chat-template bookkeeping, loss mask and turn index of an on-policy rollout
(observations come from the real env, not from a stored transcript): what the student learns to say
is what it will later be asked to say, token for token, and a distillation method warm-started from
SFT sees no template shift. A task without expert actions is an error that names it.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Sequence

import torch

from agentgym_opd.algorithm import (Algorithm, BatchState, LossTerm, Step, agent_mask, fit_width, sequence_logprobs,
                                    weighted_sum)
from agentgym_opd.config import constrained
from agentgym_opd.distill import privileged_text
from agentgym_opd.policy.base import SamplingParams
from agentgym_opd.policy.scripted import ScriptAgent, ScriptedPolicy
from agentgym_opd.rollout import RolloutBatch, RolloutEngine


@dataclass
class SFTConfig:
    """Knobs of behaviour cloning."""

    aggregation: str = constrained("token_mean", choices=("token_mean", "seq_mean_token_mean"),
                                   help="how per-token cross-entropy is averaged over the batch")
    expert: str = constrained("observable", choices=("observable", "walkthrough"), help=(
        "whose actions to clone: 'observable' = privileged['demonstration'] where the env has one (an expert "
        "acting only on what the agent sees), else the walkthrough; 'walkthrough' = always the optimal plan"))
    context_fraction: float = constrained(0.0, ge=0, le=1, help=(
        "share of expert episodes shown WITH the task's privileged context in the first prompt: a warm start "
        "that teaches the network to read a context block, which self-teachers (opsd, sdpo) rely on"))


def expert_actions(task: Any, *, with_context: bool, expert: str = "observable") -> list[str]:
    """The expert's actions for one task: the observable demonstration when there is one and no context is
    shown (the walkthrough walks straight to what the agent cannot see: cloning it does not generalise)."""
    privileged = task.privileged or {}
    if expert == "observable" and not with_context and privileged.get("demonstration"):
        return list(privileged["demonstration"])
    return list(privileged.get("walkthrough") or [])


def expert_batch(student: Any, env: Any, task_ids: Sequence[str], *, engine_template: RolloutEngine,
                 seed: int = 0, context_fraction: float = 0.0, expert: str = "observable") -> RolloutBatch:
    """Teacher-force each task's expert actions through the rollout engine; one padded batch of expert episodes.

    With ``context_fraction > 0`` that share of episodes (chosen by a RNG seeded with ``seed``) shows the
    task's privileged context after the first observation, as a self-teacher will see it.
    """
    batches = []
    rng = random.Random(seed)
    for k, task_id in enumerate(task_ids):
        task = env.get_task(task_id)
        context = privileged_text(task) if context_fraction > 0 and rng.random() < context_fraction else None
        actions = expert_actions(task, with_context=context is not None, expert=expert)
        if not actions:
            raise ValueError(f"task {task_id!r} of {env.env_id} has no privileged['demonstration'] or "
                             "['walkthrough']: SFT needs expert actions")
        longest = max(len(engine_template.policy.tokenizer.encode(a, add_special_tokens=False)) for a in actions)
        engine = RolloutEngine(ScriptedPolicy(ScriptAgent(actions), like=student),
                               SamplingParams(max_new_tokens=max(longest + 1, 2)),
                               max_context_tokens=engine_template.max_context_tokens,
                               system_prompt=engine_template.system_prompt, action_parser=engine_template.parse)
        batches.append(engine.collect([env], [task_id], seed=seed + k, contexts=[context]))
    return concat_batches(batches, pad_id=int(getattr(student.tokenizer, "pad_token_id", 0) or 0))


def concat_batches(batches: Sequence[RolloutBatch], pad_id: int) -> RolloutBatch:
    """Stack single-episode batches into one right-padded batch (group ids renumbered per source batch)."""
    width = max(b.input_ids.shape[1] for b in batches)

    def pad(t: torch.Tensor, value: float) -> torch.Tensor:
        return torch.nn.functional.pad(t, (0, width - t.shape[1]), value=value)

    temperatures = {b.logprob_temperature for b in batches}
    if len(temperatures) > 1:
        raise ValueError(f"concat_batches: the batches' behaviour log-probs are at different temperatures "
                         f"{sorted(temperatures)}; one importance ratio needs one: collect them alike")
    offsets, groups, shift = [], [], 0
    for b in batches:
        groups.append(b.group_ids + shift)
        shift += int(b.group_ids.max()) + 1
    return RolloutBatch(
        episodes=[e for b in batches for e in b.episodes],
        input_ids=torch.cat([pad(b.input_ids, pad_id) for b in batches]),
        attention_mask=torch.cat([pad(b.attention_mask, 0) for b in batches]),
        loss_mask=torch.cat([pad(b.loss_mask, 0) for b in batches]),
        turn_index=torch.cat([pad(b.turn_index, -1) for b in batches]),
        behaviour_logprobs=torch.cat([pad(b.behaviour_logprobs, 0.0) for b in batches]),
        group_ids=torch.cat(groups),
        rewards=torch.cat([b.rewards for b in batches]),
        logprob_temperature=temperatures.pop(),
    )


class SFT(Algorithm):
    """Behaviour cloning: cross-entropy on the expert's actions (warm start and baseline)."""

    Config = SFTConfig
    needs_groups = False

    def collect(self, engine: RolloutEngine, envs: Sequence[Any], tasks: Sequence[str], *, group_size: int,
                seed: int) -> RolloutBatch:
        """Expert episodes of the sampled tasks (one per task: the expert is deterministic, so G is moot)."""
        return expert_batch(self.student, envs[0], tasks, engine_template=engine, seed=seed,
                            context_fraction=self.config.context_fraction, expert=self.config.expert)

    def token_weights(self, batch: RolloutBatch, state: BatchState, step: Step) -> dict[str, LossTerm]:
        mask = agent_mask(batch)  # "episodes" only weighs a metric: each expert episode once
        return {"loss": LossTerm(mask, self.config.aggregation), "episodes": LossTerm(mask, "seq_mean_token_mean")}

    def compute_loss(self, batch: RolloutBatch, rows: slice, coef: dict[str, torch.Tensor], state: BatchState,
                     step: Step) -> tuple[torch.Tensor, dict[str, float]]:
        logp, mask = sequence_logprobs(self.model, batch, rows)
        nll = weighted_sum(-logp, coef["loss"])
        per_episode = (logp.detach() * mask).sum(dim=1)
        episode_share = fit_width(coef["episodes"], logp).sum(dim=1)
        return nll, {"nll": float(nll.detach()), "expert_logprob_per_episode": float((per_episode * episode_share).sum()),
                     "expert_tokens": float(mask.sum())}
