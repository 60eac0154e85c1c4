"""The label probe: the teacher is asked from exactly the student's history, and its labels are replayed."""

from __future__ import annotations

import pytest

from agentgym_opd.policy.hf import HFPolicy
from agentgym_opd.policy.tiny import default_tiny_model
from probe_scripts import import_probe
from tiny_rollouts import perturbed_tiny_teacher

label_probe = import_probe("label_probe")
CLASSES, probe = label_probe.CLASSES, label_probe.probe


@pytest.mark.slow
def test_a_greedy_student_is_its_own_teachers_every_label():
    """Asked from the exact token prefix of each turn, a greedy student's own model says what it said: every
    label equals the action, and the env rejects the labels exactly where it rejected the actions (the replay
    puts the env in the state the student was in)."""
    student = HFPolicy.from_pretrained(default_tiny_model())
    rows = probe(student, student, tasks=3, temperature=0.0, max_turns=4)
    assert set(rows) == set(CLASSES)
    assert sum(r["turns"] for r in rows.values()) == 12
    for r in rows.values():
        if r["turns"]:
            assert r["same"] == 1.0 and r["teacher_rejected"] == r["student_rejected"]


@pytest.mark.slow
def test_another_teacher_disagrees_somewhere():
    student = HFPolicy.from_pretrained(default_tiny_model())
    rows = probe(student, perturbed_tiny_teacher(0.5), tasks=3, temperature=1.0, max_turns=4)
    assert min(r["same"] for r in rows.values() if r["turns"]) < 1.0


def test_a_label_is_judged_in_the_state_the_student_left():
    """The replay puts the env where the student's earlier actions took it: the same "go to X" is fine from the
    start and rejected once the student already went there."""
    from agentgym_opd.action_parsing import get_parser
    from agentgym_opd.registry import env_protocol, make

    label_rejected = label_probe.label_rejected

    env = make("household/train", max_turns=8)
    task = env.task_ids()[0]
    env.reset(options={"task_id": task})
    go = next(text for text in env.world.admissible() if text.startswith("go to "))
    parse = get_parser(env_protocol("household/train").action_parser)
    assert not label_rejected(env, task, [], (go, "stop", []), parse)
    assert label_rejected(env, task, [go], (go, "stop", []), parse)
    assert label_rejected(env, task, [], ("\x00 no such command", "stop", []), parse)
