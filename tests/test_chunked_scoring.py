"""Teacher scoring without [b, T, V]: the chunked paths give today's full-logit numbers on real rollouts."""

from __future__ import annotations

import copy

import pytest
import torch

from agentgym_opd.algorithm import sequence_logits, sequence_logprobs, token_logprobs_of
from agentgym_opd.distill import (DistillConfig, aligned_teacher_hidden, aligned_teacher_logits, aligned_teacher_scores,
                                  chunked_distillation_terms, distillation_per_token, privileged_text,
                                  reverse_kl_per_token, scored_distillation_terms, teacher_inputs, teacher_prefix)
from agentgym_opd.losses import teacher_topm, token_logprobs
from agentgym_opd.policy.hf import HFPolicy
from algorithms.opd import OPD
from algorithms.opsd import OPSD
from tiny_rollouts import tiny_household_rollout

CONFIGS = [
    DistillConfig(),
    DistillConfig(top_m=8, top_m_support="student", tail=True),
    DistillConfig(top_m=8, top_m_support="teacher", tail=False, divergence="forward_kl"),
    DistillConfig(divergence="jsd", jsd_beta=0.3, clip=2.0),
    DistillConfig(estimator="sampled", clip=5.0),
]


@pytest.fixture(scope="module")
def rollout():
    return tiny_household_rollout(seed=4, max_turns=3, max_new_tokens=8)


@pytest.fixture(scope="module")
def teacher(rollout):
    policy, _ = rollout
    other = copy.deepcopy(policy.model)
    torch.manual_seed(1)
    with torch.no_grad():
        for p in other.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return HFPolicy(other, policy.tokenizer)


def _inputs(policy, batch):
    rows = slice(0, len(batch))
    prefixes = [teacher_prefix(policy, ep, privileged_text(ep.task)) for ep in batch.episodes]
    width = int(batch.attention_mask.sum(dim=1).max())
    return rows, teacher_inputs(batch, rows, prefixes, pad_id=policy.pad_id), width


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: f"{c.divergence}-m{c.top_m}-{c.top_m_support}-{c.estimator}")
@pytest.mark.slow
def test_chunked_terms_and_gradient_equal_the_full_logit_computation(rollout, teacher, config):
    policy, batch = rollout
    rows, inputs, width = _inputs(policy, batch)
    ids, attention = batch.input_ids[:, :width], batch.attention_mask[:, :width]
    mask = batch.loss_mask[:, 1:width].float()

    policy.model.zero_grad()
    student_logits, student_logp, _ = sequence_logits(policy.model, batch, rows)
    teacher_logits = aligned_teacher_logits(teacher.model, inputs, width)
    full = distillation_per_token(student_logits, teacher_logits, ids[:, 1:], mask, config)
    full.sum().backward()
    full_grads = [p.grad.clone() for p in policy.model.parameters()]
    full_kl = reverse_kl_per_token(student_logits, teacher_logits, mask)

    real = mask.bool()
    assert 0 < int(real.sum()) < real.numel()  # the agent's tokens are some of the positions, not all
    # every position through the heads, or only the agent's (packed into one row, zeros elsewhere)
    for positions in (None, real):
        policy.model.zero_grad()
        terms = chunked_distillation_terms(policy.model, ids, attention, mask,
                                           aligned_teacher_hidden(teacher.model, inputs, width), config, chunk=7,
                                           positions=positions)
        terms.per_token.sum().backward()
        torch.testing.assert_close(terms.per_token, full.detach(), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(terms.kl, full_kl, atol=1e-5, rtol=1e-5)
        assert torch.equal(terms.mask, mask)
        # padding positions' log-probs are never used (the loss mask zeroes them) and differ by design: the update
        # runs a right-padded batch without its attention mask (final_hidden_states), the full forward with it
        torch.testing.assert_close(terms.student_logp[real], student_logp.detach()[real], atol=1e-5, rtol=0)
        if positions is not None:
            assert not terms.student_logp[~real].any()
        for a, b in zip((p.grad for p in policy.model.parameters()), full_grads):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)
    policy.model.zero_grad()


@pytest.mark.slow
def test_scoring_only_teacher_ships_the_same_topm_and_token_logprobs(rollout, teacher):
    """`Policy.score` in the student's coordinates = the top-M and token log-probs of the full teacher logits."""
    policy, batch = rollout
    _, inputs, width = _inputs(policy, batch)
    logits = aligned_teacher_logits(teacher.model, inputs, width)
    logp, topm = aligned_teacher_scores(teacher, inputs, width, top_m=8)
    mask = batch.loss_mask[:, 1:width].bool()
    reference = teacher_topm(logits, 8)
    torch.testing.assert_close(logp[mask], token_logprobs(logits, batch.input_ids[:, 1:width])[mask], atol=1e-5, rtol=0)
    torch.testing.assert_close(topm.logprobs[mask], reference.logprobs[mask], atol=1e-5, rtol=0)
    torch.testing.assert_close(topm.tail[mask], reference.tail[mask], atol=1e-5, rtol=0)
    assert torch.equal(topm.ids[mask], reference.ids[mask])

    config = DistillConfig(top_m=8, top_m_support="teacher", tail=True)
    ids, attention, fmask = batch.input_ids[:, :width], batch.attention_mask[:, :width], mask.float()
    scored = scored_distillation_terms(policy.model, ids, attention, fmask, logp, topm, config, chunk=5)
    student_logits, _, _ = sequence_logits(policy.model, batch, slice(0, len(batch)))
    full = distillation_per_token(student_logits, logits, ids[:, 1:], fmask, config)
    torch.testing.assert_close(scored.per_token, full, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="top_m_support=teacher"):
        scored_distillation_terms(policy.model, ids, attention, fmask, logp, topm, DistillConfig(), chunk=5)


def test_score_with_support_ids_and_chunks_matches_full_log_softmax(rollout):
    policy, batch = rollout
    ids = batch.episodes[0].input_ids
    support = torch.randint(0, policy.model.config.vocab_size, (len(ids) - 1, 5))
    got = policy.score([ids[:1]], [ids[1:]], support_ids=[support])[0]
    with torch.no_grad():
        full = torch.log_softmax(policy.model(input_ids=torch.tensor([ids])).logits[0, :-1].float(), dim=-1)
    torch.testing.assert_close(got.top_logprobs, full.gather(-1, support), atol=1e-5, rtol=0)
    assert torch.equal(got.top_ids, support)
    own = policy.score([ids[:1]], [ids[1:]], top_m=5)[0]
    torch.testing.assert_close(own.top_logprobs, full.topk(5, dim=-1).values, atol=1e-5, rtol=0)


def test_token_logprobs_and_their_gradient_chunked_equal_the_full_logit_computation(rollout):
    """What GRPO, SFT and VPD's E-step read: the sampled ids' log-probs, several chunks, same gradient."""
    policy, batch = rollout
    width = int(batch.attention_mask.sum(dim=1).max())
    ids, attention = batch.input_ids[:, :width], batch.attention_mask[:, :width]
    mask = batch.loss_mask[:, 1:width].float()
    weights = torch.rand(mask.shape, generator=torch.Generator().manual_seed(0)) * mask

    policy.model.zero_grad()
    logits = policy.model(input_ids=ids, attention_mask=attention, use_cache=False).logits.float()[:, :-1]
    full = token_logprobs(logits, ids[:, 1:])
    (full * weights).sum().backward()
    full_grads = {n: p.grad.clone() for n, p in policy.model.named_parameters() if p.grad is not None}

    # every position through the head, or only the agent's (packed into one row, zeros elsewhere)
    for positions in (None, mask.bool()):
        policy.model.zero_grad()
        chunked = token_logprobs_of(policy.model, ids, attention, chunk=7, positions=positions)  # a ragged last chunk
        (chunked * weights).sum().backward()
        torch.testing.assert_close(chunked * mask, full * mask, atol=1e-5, rtol=0)
        if positions is not None:
            assert not chunked[~positions].any()
        for name, p in policy.model.named_parameters():
            torch.testing.assert_close(p.grad, full_grads[name], atol=1e-5, rtol=1e-4, msg=name)
    logp, loss_mask = sequence_logprobs(policy.model, batch, slice(0, len(batch)))
    assert torch.equal(loss_mask, mask)
    torch.testing.assert_close(logp * mask, full.detach() * mask, atol=1e-5, rtol=0)


@pytest.mark.parametrize("algo", ["opd", "opsd", "sdpo", "vpd"])
def test_algorithm_loss_on_the_chunked_path_equals_the_full_logit_path(rollout, teacher, algo):
    policy, batch = rollout
    if algo == "opd":
        method = OPD({"top_m": 8}, policy, teacher)
    elif algo == "opsd":
        method = OPSD({"top_m": 8, "top_m_support": "teacher", "tail": False}, policy)
    elif algo == "sdpo":  # SDPO mixing in GRPO's term: the student's log-probs come from the chunked path too
        from algorithms.sdpo import SDPO

        method = SDPO({"top_m": 8, "distill_weight": 0.5, "teacher": "live"}, policy)
    else:  # VPD's M-step against its live self-teacher
        from agentgym_opd.algorithm import Step
        from algorithms.vpd import VPD

        vpd = VPD({"top_m": 8}, policy)
        state = vpd.prepare(batch)
        loss, metrics = vpd.loss(batch, state, Step("m"))
        vpd.teacher_hidden = lambda inputs, width: None
        full_loss, full_metrics = vpd.loss(batch, state, Step("m"))
        assert abs(float(loss) - float(full_loss)) < 1e-5 and abs(metrics["kl"] - full_metrics["kl"]) < 1e-5
        assert metrics["kl"] > 0 and state.metrics["masked_fraction"] < 1
        return
    loss, metrics = method.loss(batch)
    method.teacher_hidden = lambda inputs, width: None  # today's path: full teacher logits
    full_loss, full_metrics = method.loss(batch)
    assert abs(float(loss) - float(full_loss)) < 1e-5
    assert abs(metrics["kl"] - full_metrics["kl"]) < 1e-5 and metrics["kl"] > 0


class ScoringOnlyTeacher:
    """A teacher reachable only through `Policy.score` (what a served vLLM teacher offers): no `.model`."""

    def __init__(self, policy: HFPolicy):
        self._policy, self.tokenizer = policy, policy.tokenizer

    def score(self, contexts, continuations, top_m=0, grad=False, *, support_ids=None):
        if grad or support_ids is not None:
            raise NotImplementedError("served teachers score their own top-M without gradients")
        return self._policy.score(contexts, continuations, top_m=top_m)


@pytest.mark.parametrize("algo", [{"top_m": 8, "top_m_support": "teacher"}, {"estimator": "sampled"}],
                         ids=["topm-teacher-support", "sampled"])
@pytest.mark.slow
def test_opd_against_a_scoring_only_teacher_equals_the_in_process_teacher(rollout, teacher, algo):
    policy, batch = rollout
    served = OPD(algo, policy, ScoringOnlyTeacher(teacher))
    assert served.teacher_hidden is not None and served.teacher_scorer() is not None
    loss, _ = served.loss(batch)
    reference, _ = OPD(algo, policy, teacher).loss(batch)
    assert abs(float(loss.detach()) - float(reference.detach())) < 1e-5
    loss.backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in policy.model.parameters())
    policy.model.zero_grad()


@pytest.mark.slow
def test_sage_opd_weighs_turns_by_a_served_teachers_confidence(rollout, teacher):
    """SAGE-OPD's c_t from a scoring-only teacher (its top-1 log-prob) equals the in-process teacher's."""
    from algorithms.sage_opd import SAGEOPD

    policy, batch = rollout
    config = {"top_m": 8, "top_m_support": "teacher", "judge": "errors_only"}
    local, served = SAGEOPD(config, policy, teacher), SAGEOPD(config, policy, ScoringOnlyTeacher(teacher))
    local_state, served_state = local.prepare(batch), served.prepare(batch)
    assert (local_state.weights > 0).any() and 0 < local_state.metrics["mean_confidence"] < 1
    torch.testing.assert_close(served_state.weights, local_state.weights, atol=1e-5, rtol=0)
    local_loss, _ = local.loss(batch, local_state)
    served_loss, _ = served.loss(batch, served_state)
    assert abs(float(local_loss) - float(served_loss)) < 1e-5 and float(local_loss) > 0
