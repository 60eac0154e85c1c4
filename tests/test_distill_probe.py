"""The distillation probe: an independent KL to the teacher that OPD's own loss must match, and that OPD lowers."""

from __future__ import annotations

import pytest

from agentgym_opd.policy.base import SamplingParams
from agentgym_opd.policy.hf import HFPolicy
from agentgym_opd.policy.tiny import default_tiny_model
from agentgym_opd.registry import make
from agentgym_opd.rollout import RolloutEngine
from probe_scripts import import_probe
from tiny_rollouts import perturbed_tiny_teacher

distill_probe = import_probe("distill_probe")
divergence_to_teacher, probe = distill_probe.divergence_to_teacher, distill_probe.probe


def _pair():
    return HFPolicy.from_pretrained(default_tiny_model()), perturbed_tiny_teacher(0.05)


@pytest.mark.slow
def test_a_model_is_at_zero_divergence_from_itself():
    student, _ = _pair()
    envs = [make("household/train", max_turns=2) for _ in range(2)]
    batch = RolloutEngine(student, SamplingParams(max_new_tokens=8, temperature=1.0)).collect(
        envs, envs[0].task_ids()[:2], seed=0)
    kl, agree = divergence_to_teacher(student, student, batch)
    assert abs(kl) < 1e-6 and agree == 1.0


@pytest.mark.slow
def test_opd_loss_is_the_probes_kl_and_opd_steps_lower_it():
    student, teacher = _pair()
    rows = probe(student, teacher, lr=3e-3, steps=3, tasks=2, max_turns=2)
    assert len(rows) == 4 and rows[0]["kl_trained"] > 0.01
    for row in rows[:-1]:  # the algorithm's loss before a step is the batch's KL measured independently
        assert abs(row["opd_loss"] - row["kl_trained"]) < 1e-4 * max(1.0, row["kl_trained"])
    assert rows[-1]["kl_trained"] < rows[0]["kl_trained"]


@pytest.mark.slow
def test_the_probe_can_train_on_the_teachers_own_play_and_report_greedy_success():
    student, teacher = _pair()
    rows = probe(student, teacher, lr=3e-3, steps=2, tasks=2, max_turns=2, divergence="forward_kl", states="teacher",
                 eval_tasks=2)
    assert [r["step"] for r in rows] == [0, 1, 2]
    assert "valid_seen_success" in rows[0] and "valid_seen_success" in rows[-1] and "valid_seen_success" not in rows[1]
    assert all(0.0 <= r["valid_seen_success"] <= 1.0 for r in (rows[0], rows[-1]))
    assert all(r["opd_loss"] > 0 for r in rows[:-1])  # forward KL to a different teacher on its own play
    try:
        probe(student, teacher, lr=1e-3, steps=1, tasks=1, max_turns=1, states="nobody")
    except ValueError as err:
        assert "states must be" in str(err)
    else:
        raise AssertionError("an unknown `states` was accepted")
