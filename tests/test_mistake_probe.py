"""The mistake probe: a seeded share of a model's actions goes wrong, and only those."""

from __future__ import annotations

import pytest

from agentgym_opd.policy.base import SamplingParams
from agentgym_opd.policy.hf import HFPolicy
from agentgym_opd.policy.tiny import default_tiny_model
from agentgym_opd.registry import make
from agentgym_opd.rollout import RolloutEngine
from probe_scripts import import_probe

mistake_probe = import_probe("mistake_probe")
MistakenPolicy, mistaken = mistake_probe.MistakenPolicy, mistake_probe.mistaken


def test_a_mistake_moves_the_first_number_on():
    assert mistaken("take cup 2 from shelf 1") == "take cup 3 from shelf 1"
    assert mistaken("go to drawer 6") == "go to drawer 1"
    assert mistaken("look") == "look"


def _first_actions(policy, tasks):
    envs = [make("household/train", max_turns=1) for _ in tasks]
    engine = RolloutEngine(policy, SamplingParams(max_new_tokens=12, temperature=1.0))
    return [e.turns[0].action for e in engine.collect(envs, tasks, seed=5).episodes]


@pytest.mark.slow
def test_rate_zero_is_the_model_itself_and_rate_one_changes_every_action_with_a_number():
    policy = HFPolicy.from_pretrained(default_tiny_model())
    tasks = make("household/train").task_ids()[:12]
    plain = _first_actions(policy, tasks)
    assert _first_actions(MistakenPolicy(policy, 0.0), tasks) == plain
    wrong = _first_actions(MistakenPolicy(policy, 1.0), tasks)
    assert wrong == [mistaken(a) for a in plain]
    assert any(w != a for w, a in zip(wrong, plain))  # some sampled actions carry a number
