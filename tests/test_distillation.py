"""The OPD family's shared core on real multi-turn rollouts of the tiny model: the teacher re-scores exactly
the student's tokens of every turn, given the same history plus its context."""

from __future__ import annotations

import pytest
import torch

from agentgym_opd.algorithm import sequence_logits
from agentgym_opd.distill import (SelfTeacher, aligned_teacher_logits, privileged_text, teacher_inputs,
                                  teacher_prefix)
from agentgym_opd.losses import token_logprobs
from agentgym_opd.policy.hf import HFPolicy
from agentgym_opd.policy.tiny import default_tiny_model
from algorithms.opd import OPD, check_same_tokenizer
from algorithms.opsd import OPSD
from agentgym_opd.distill import attempt_feedback, successful_sibling
from agentgym_opd.types import StepError
from algorithms.sdpo import SDPO
from algorithms.vpd import env_feedback
from tiny_rollouts import tiny_household_rollout



@pytest.fixture(scope="module")
def rollout():
    policy, batch = tiny_household_rollout(seed=11, max_turns=3, max_new_tokens=8)
    assert all(ep.num_turns == 3 for ep in batch.episodes)  # real multi-turn episodes
    return policy, batch


@pytest.mark.slow
def test_teacher_sequence_holds_the_students_tokens_of_every_turn_after_its_context(rollout):
    policy, batch = rollout
    rows = slice(0, len(batch))
    contexts = [privileged_text(ep.task) for ep in batch.episodes]
    prefixes = [teacher_prefix(policy, ep, c) for ep, c in zip(batch.episodes, contexts)]
    inputs = teacher_inputs(batch, rows, prefixes, pad_id=policy.pad_id)
    for row, ep in enumerate(batch.episodes):
        length = int(batch.attention_mask[row].sum())
        start = ep.prompt_length
        offset = int(inputs.offsets[row])
        assert offset == len(prefixes[row]) - start > 0
        student = batch.input_ids[row, start:length]
        teacher = inputs.input_ids[row, start + offset: length + offset]
        assert torch.equal(student, teacher)
        assert contexts[row] in policy.tokenizer.decode(prefixes[row])
        assert ep.task.privileged["walkthrough"][0] in contexts[row]
        for k, turn in enumerate(ep.turns):  # each turn's sampled ids, at their shifted positions
            positions = (batch.turn_index[row] == k).nonzero().flatten() + offset
            assert inputs.input_ids[row, positions].tolist() == turn.action_token_ids


@pytest.mark.slow
def test_aligned_teacher_logits_equal_an_independent_score_of_the_continuation(rollout):
    policy, batch = rollout
    rows = slice(0, len(batch))
    contexts = [privileged_text(ep.task) for ep in batch.episodes]
    prefixes = [teacher_prefix(policy, ep, c) for ep, c in zip(batch.episodes, contexts)]
    inputs = teacher_inputs(batch, rows, prefixes, pad_id=policy.pad_id)
    _, _, mask = sequence_logits(policy.model, batch, rows)
    width = mask.shape[1] + 1
    teacher = aligned_teacher_logits(policy.model, inputs, width)
    teacher_lp = token_logprobs(teacher, batch.input_ids[:, 1:width])
    for row, ep in enumerate(batch.episodes):
        start, length = ep.prompt_length, int(batch.attention_mask[row].sum())
        rest = batch.input_ids[row, start:length].tolist()
        scored = policy.score([prefixes[row]], [rest])[0].logprobs  # the teacher's own scoring pass
        agent = mask[row, start - 1: length - 1].bool()
        torch.testing.assert_close(teacher_lp[row, start - 1: length - 1][agent], scored[agent], atol=1e-4, rtol=1e-4)


def test_a_teacher_identical_to_the_student_gives_zero_kl_and_zero_gradient_signal(rollout):
    policy, batch = rollout
    algo = OPD({}, policy, HFPolicy.from_pretrained(default_tiny_model()))  # same weights, a separate copy
    state = algo.prepare(batch)
    loss, metrics = algo.loss(batch, state)
    assert abs(float(loss)) < 1e-5 and metrics["kl"] < 1e-5 and state.metrics["masked_fraction"] == 0.0


@pytest.mark.slow
def test_opsd_self_teacher_with_privileged_context_differs_and_its_loss_trains(rollout):
    policy, batch = rollout
    state = {k: v.clone() for k, v in policy.model.state_dict().items()}
    try:
        algo = OPSD({"teacher": "frozen"}, policy, optimizer=torch.optim.SGD(policy.model.parameters(), lr=0.05))
        first = algo.update(batch)
        second = algo.update(batch)
    finally:
        policy.model.load_state_dict(state)
    assert first["kl"] > 1e-4  # the context changes the teacher's distribution on the student's tokens
    assert second["kl"] < first["kl"]  # the student moves towards the frozen self-teacher


@pytest.mark.slow
def test_topm_and_sampled_estimators_run_on_the_same_view(rollout):
    policy, batch = rollout
    full = OPSD({}, policy).loss(batch)[0]
    topm = OPSD({"top_m": 755, "top_m_support": "teacher", "tail": True}, policy).loss(batch)[0]
    torch.testing.assert_close(topm, full, atol=1e-3, rtol=1e-3)  # M = V - 1: the tail holds one token
    small = OPSD({"top_m": 4}, policy).loss(batch)[0]
    assert 0 < float(small) < float(full) + 1.0
    assert OPSD.Config().tail is False and OPSD.Config().top_m_support == "teacher"  # OPSD's paper: renormalise
    sampled = OPSD({"estimator": "sampled"}, policy).loss(batch)[0]
    assert torch.isfinite(sampled)


def test_ema_self_teacher_moves_by_the_rate_and_round_trips_its_state():
    policy = HFPolicy.from_pretrained(default_tiny_model())
    teacher = SelfTeacher(policy, "ema", ema_rate=0.25)
    name, param = next(iter(policy.model.named_parameters()))
    before = dict(teacher.copy.named_parameters())[name].detach().clone()
    with torch.no_grad():
        param.add_(1.0)
    teacher.after_update()
    after = dict(teacher.copy.named_parameters())[name]
    torch.testing.assert_close(after, before + 0.25 * (param.detach() - before))
    state = teacher.state_dict()
    fresh = SelfTeacher(policy, "ema")
    fresh.load_state_dict(state)
    torch.testing.assert_close(dict(fresh.copy.named_parameters())[name], after)
    assert SelfTeacher(policy, "live").copy is None


def test_sdpo_context_uses_a_successful_sibling_and_feedback_and_masks_rows_with_neither(rollout):
    """Row 2 ends on parse errors with no feedback text: its errors are its feedback (as VPD's). Row 3 has
    neither feedback nor an error nor a successful sibling: masked."""
    policy, batch = rollout
    saved = [(ep.success, ep.feedback, [t.error for t in ep.turns]) for ep in batch.episodes]
    try:
        # group 0: rollout 0 succeeded, rollout 1 failed with feedback; group 1: both failed, no feedback
        for ep, (success, feedback) in zip(batch.episodes, [(True, ""), (False, "Task not completed."), (False, ""), (False, "")]):
            ep.success, ep.feedback = success, feedback
        batch.episodes[2].turns[-1].error = StepError("parse_error", "No action found in the answer.")
        for turn in batch.episodes[3].turns:
            turn.error = None
        algo = SDPO({}, policy)
        assert successful_sibling(batch, 1) == 0 and successful_sibling(batch, 0) is None
        assert algo.teacher_context(batch, 0) is None  # success, no other successful sibling: nothing to show
        ctx = algo.teacher_context(batch, 1)
        assert "A successful attempt" in ctx and "Task not completed." in ctx
        assert batch.episodes[0].turns[0].action.strip() in ctx
        errors = algo.teacher_context(batch, 2)
        assert errors and "the last error: No action found in the answer." in errors
        assert attempt_feedback(batch.episodes[2]) in errors and attempt_feedback(batch.episodes[2]) in env_feedback(batch.episodes[2])
        assert algo.teacher_context(batch, 3) is None and attempt_feedback(batch.episodes[3]) is None
        assert SDPO({"use_feedback": False}, policy).teacher_context(batch, 2) is None
        assert algo.prepare(batch).metrics["masked_fraction"] == 0.5
        mixed, parts = SDPO({"distill_weight": 0.5}, policy).loss(batch)
        assert "pg_loss" in parts and torch.isfinite(mixed)
    finally:
        for ep, (success, feedback, errors) in zip(batch.episodes, saved):
            ep.success, ep.feedback = success, feedback
            for turn, error in zip(ep.turns, errors):
                turn.error = error


def test_opd_takes_a_teacher_with_another_tokenizer_on_merged_spans_unless_told_off(tmp_path):
    from agentgym_opd.policy.tiny import build_tiny_model

    student = HFPolicy.from_pretrained(default_tiny_model())
    other = HFPolicy.from_pretrained(build_tiny_model(tmp_path / "other", ["put the apple in the fridge", "go to the kitchen"] * 20, vocab_size=300))
    check_same_tokenizer(student, student)
    assert OPD({}, student, other).cross is not None  # issue 39: the cross-tokenizer path, by itself
    with pytest.raises(ValueError, match="tokenizers differ"):
        OPD({"cross_tokenizer": "off"}, student, other)
    with pytest.raises(ValueError, match="needs a teacher"):
        OPD({}, student, None)
