"""The household base models: what they learn from, and a build that is deterministic and cached."""

from __future__ import annotations

import dataclasses
import random

import pytest

from agentgym_opd.distill import CONTEXT_HEADER, privileged_text
from agentgym_opd.registry import make
from evaluation.base_models import (
    STUDENT_SPEC, TEACHER_SPEC, BaseModelSpec, build_base_model, choose_kind, context_plan, ensure_base_model,
)

MINI = BaseModelSpec("mini", hidden=16, layers=1, heads=2, steps=2, batch_size=2, warmup_steps=1, train_tasks=6,
                     context_share=0.5, max_turns=40)


def test_the_teacher_is_larger_and_trained_longer_than_the_student():
    assert TEACHER_SPEC.hidden * TEACHER_SPEC.layers > STUDENT_SPEC.hidden * STUDENT_SPEC.layers
    assert TEACHER_SPEC.steps > STUDENT_SPEC.steps
    assert STUDENT_SPEC.key() != dataclasses.replace(STUDENT_SPEC, lr=1e-3).key()  # every setting is in the key


def test_plain_episodes_follow_the_observable_expert_and_context_episodes_use_their_context():
    env = make("household/train", num_tasks=12, max_turns=40)
    task = env.get_task(env.task_ids()[4])
    rng = random.Random(0)
    context, actions = context_plan(task, "none", env, rng)
    assert context is None and actions == task.privileged["demonstration"]
    context, actions = context_plan(task, "walkthrough", env, rng)
    assert context == privileged_text(task) and actions == task.privileged["walkthrough"]
    context, actions = context_plan(task, "sibling", env, rng)
    assert context.startswith(CONTEXT_HEADER) and "A successful attempt at this task." in context
    assert actions == task.privileged["demonstration"]
    context, actions = context_plan(task, "feedback", env, rng)
    assert "Feedback on your previous attempt: Task not completed" in context
    with pytest.raises(ValueError, match="unknown context kind"):
        context_plan(task, "gossip", env, rng)
    kinds = [choose_kind(random.Random(i), 0.35) for i in range(400)]
    assert 0.25 < 1 - kinds.count("none") / 400 < 0.45 and {"walkthrough", "sibling", "feedback"} <= set(kinds)


def test_build_is_deterministic_and_cached(tmp_path, monkeypatch):
    import torch
    from safetensors.torch import load_file

    a = build_base_model(MINI, tmp_path / "a", progress=False)
    b = build_base_model(MINI, tmp_path / "b", progress=False)
    wa, wb = load_file(str(a / "model.safetensors")), load_file(str(b / "model.safetensors"))
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    init = dataclasses.replace(MINI, steps=0)
    w0 = load_file(str(build_base_model(init, tmp_path / "c", progress=False) / "model.safetensors"))
    assert any(not torch.equal(wa[k], w0[k]) for k in wa)  # training changed the weights
    assert (a / "tokenizer.json").read_text() == (b / "tokenizer.json").read_text()

    monkeypatch.setenv("AGENTGYM_OPD_CACHE", str(tmp_path / "cache"))
    lines: list[str] = []
    first = ensure_base_model(MINI, progress=False, log=lines.append)
    assert any("built in" in line for line in lines)
    lines.clear()
    assert ensure_base_model(MINI, progress=False, log=lines.append) == first and not lines  # cached: no rebuild
    assert (first.parent / "spec.json").is_file() and MINI.key() in first.parent.name
