"""Helpers for tests that roll out the untrained tiny model on real envs."""

from __future__ import annotations

import torch

import agentgym_opd
from agentgym_opd.policy.base import SamplingParams
from agentgym_opd.policy.hf import HFPolicy
from agentgym_opd.policy.tiny import default_tiny_model
from agentgym_opd.rollout import RolloutBatch, RolloutEngine
from agentgym_opd.trainer import DEFAULT_SYSTEM_PROMPT

HOUSEHOLD = "household/train"


def accept_any(text: str, finish_reason: str):
    """Send whatever the untrained model says to the env, so rollouts are real multi-turn episodes."""
    return next((ln.strip() for ln in text.splitlines() if ln.strip()), "look"), None


def tiny_household_rollout(*, seed: int, max_turns: int, max_new_tokens: int) -> tuple[HFPolicy, RolloutBatch]:
    """The untrained tiny model (torch seed 0) on the first two household train tasks, two rollouts each,
    with the trainer's system prompt: the real multi-turn batch the algorithm tests compute losses on."""
    torch.manual_seed(0)
    policy = HFPolicy.from_pretrained(default_tiny_model())
    engine = RolloutEngine(policy, SamplingParams(max_new_tokens=max_new_tokens), system_prompt=DEFAULT_SYSTEM_PROMPT,
                           action_parser=accept_any)
    tasks = agentgym_opd.make(HOUSEHOLD).task_ids()[:2]
    return policy, engine.collect(HOUSEHOLD, tasks, group_size=2, seed=seed, max_turns=max_turns)


def perturbed_tiny_teacher(scale: float, seed: int = 0) -> HFPolicy:
    """The untrained tiny model with seeded Gaussian noise of std ``scale`` on every weight: a teacher that shares
    the student's tokenizer and differs from it by a known amount."""
    teacher = HFPolicy.from_pretrained(default_tiny_model())
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in teacher.model.parameters():
            p.add_(scale * torch.randn(p.shape, generator=generator))
    return teacher
