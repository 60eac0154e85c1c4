"""Every shared loss against a direct, slow computation on small tensors (Python loops, torch.distributions).

Float64 throughout so that agreement is checked to ~1e-10, not hidden behind fp32 noise; a few checks run
in float32 where stability (the tail bucket) is the point.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch.distributions import Categorical, kl_divergence

from agentgym_opd import losses as L

B, T, V, M = 3, 5, 11, 4


@pytest.fixture(autouse=True)
def float64_default():
    """Float64 for this module only, restored afterwards so other test modules are unaffected."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(previous)


@pytest.fixture()
def gen() -> torch.Generator:
    return torch.Generator().manual_seed(1234)


def _mask() -> torch.Tensor:
    mask = torch.ones(B, T, dtype=torch.bool)
    mask[0, 3:] = False  # a short sequence
    mask[2, 0] = False  # a prompt token inside the window
    return mask


def _loop_masked_mean(values, mask):
    total, count = 0.0, 0.0
    for b in range(values.shape[0]):
        for t in range(values.shape[1]):
            if mask[b, t]:
                total += float(values[b, t])
                count += 1
    return total / count


# ------------------------------------------------------------------ masked aggregation


def test_masked_helpers_match_loops_and_ignore_nan_padding(gen):
    values = torch.randn(B, T, generator=gen)
    mask = _mask()
    values_with_nan = values.masked_fill(~mask, float("nan"))
    assert L.masked_mean(values_with_nan, mask).item() == pytest.approx(_loop_masked_mean(values, mask), abs=1e-12)
    assert L.masked_sum(values_with_nan, mask).item() == pytest.approx(float(values[mask].sum()), abs=1e-12)
    seq = L.per_sequence_mean(values_with_nan, mask)
    for b in range(B):
        assert seq[b].item() == pytest.approx(float(values[b][mask[b]].mean()), abs=1e-12)


def test_masked_mean_of_nothing_is_zero_and_float_mask_is_a_weight():
    values = torch.randn(2, 3)
    assert L.masked_mean(values, torch.zeros(2, 3, dtype=torch.bool)).item() == 0.0
    weights = torch.tensor([[1.0, 0.5, 0.0], [2.0, 0.0, 0.0]])
    expected = float((values * weights).sum() / weights.sum())
    assert L.masked_mean(values, weights).item() == pytest.approx(expected)
    with pytest.raises(ValueError, match="mask shape"):
        L.masked_mean(values, torch.ones(3, 2))


def test_aggregation_modes_match_their_formulas(gen):
    per_token = torch.rand(B, T, generator=gen)
    mask = _mask()
    mask[1] = False  # a sequence with no loss tokens is left out of the sequence mean
    assert L.aggregate_token_loss(per_token, mask, "token_mean").item() == pytest.approx(_loop_masked_mean(per_token, mask))
    seq_means = [float(per_token[b][mask[b]].mean()) for b in range(B) if mask[b].any()]
    seq_mean = L.aggregate_token_loss(per_token, mask, "seq_mean_token_mean")
    assert seq_mean.item() == pytest.approx(sum(seq_means) / len(seq_means))
    dr = float(per_token[mask].sum()) / (B * T)
    assert L.aggregate_token_loss(per_token, mask, "seq_mean_token_sum_norm").item() == pytest.approx(dr)
    assert L.aggregate_token_loss(per_token, mask, "seq_mean_token_sum_norm", max_len=20).item() == pytest.approx(
        float(per_token[mask].sum()) / (B * 20)
    )
    with pytest.raises(ValueError, match="unknown aggregation"):
        L.aggregate_token_loss(per_token, mask, "sum")


# ------------------------------------------------------------------ GRPO


def test_group_advantages_grid_matches_loop_with_and_without_std(gen):
    rewards = torch.rand(4, 6, generator=gen)
    adv = L.group_advantages(rewards, eps=1e-6)
    adv_dr = L.group_advantages(rewards, scale_by_std=False)
    for g in range(4):
        row = [float(x) for x in rewards[g]]
        mean = sum(row) / len(row)
        std = math.sqrt(sum((x - mean) ** 2 for x in row) / (len(row) - 1))
        for i, r in enumerate(row):
            assert adv[g, i].item() == pytest.approx((r - mean) / (std + 1e-6), abs=1e-9)
            assert adv_dr[g, i].item() == pytest.approx(r - mean, abs=1e-12)
    population = L.group_advantages(rewards, unbiased=False)
    expected = (rewards[0, 0] - rewards[0].mean()) / (rewards[0].std(unbiased=False) + 1e-6)
    assert population[0, 0].item() == pytest.approx(float(expected))


def test_group_advantages_flat_with_ids_equals_grid_and_handles_singletons(gen):
    rewards = torch.rand(3, 4, generator=gen)
    grid = L.group_advantages(rewards)
    perm = torch.randperm(12, generator=gen)
    flat_rewards = rewards.reshape(-1)[perm]
    group_ids = (torch.arange(12) // 4)[perm] * 7 + 3  # arbitrary labels
    flat = L.group_advantages(flat_rewards, group_ids)
    assert torch.allclose(flat, grid.reshape(-1)[perm])
    uneven = L.group_advantages(torch.tensor([1.0, 0.0, 5.0]), torch.tensor([0, 0, 1]))
    assert uneven[2].item() == 0.0  # a group of one has no signal
    assert uneven[0].item() == pytest.approx(0.5 / (math.sqrt(0.5) + 1e-6))
    constant = L.group_advantages(torch.ones(2, 4))
    assert torch.equal(constant, torch.zeros(2, 4))
    with pytest.raises(ValueError, match="group_ids"):
        L.group_advantages(torch.ones(5))


def _loop_clipped_token(logp, old, adv, lo, hi):
    ratio = math.exp(logp - old)
    return -min(ratio * adv, min(max(ratio, 1 - lo), 1 + hi) * adv), ratio


@pytest.mark.parametrize("aggregation", L.AGGREGATIONS)
def test_clipped_policy_gradient_loss_matches_loop(gen, aggregation):
    logp = (torch.randn(B, T, generator=gen) * 0.3 - 1.0).requires_grad_()
    old = logp.detach() + torch.randn(B, T, generator=gen) * 0.3
    adv = torch.randn(B, generator=gen)
    mask = _mask()
    loss, stats = L.clipped_policy_gradient_loss(logp, old, adv, mask, eps_low=0.2, eps_high=0.28, aggregation=aggregation)
    per_token = torch.zeros(B, T)
    clipped, ratios = [], []
    for b in range(B):
        for t in range(T):
            value, ratio = _loop_clipped_token(float(logp.detach()[b, t]), float(old[b, t]), float(adv[b]), 0.2, 0.28)
            per_token[b, t] = value
            if mask[b, t]:
                ratios.append(ratio)
                clipped.append(abs(value + ratio * float(adv[b])) > 1e-12)
    expected = L.aggregate_token_loss(per_token, mask, aggregation)
    assert loss.item() == pytest.approx(expected.item(), abs=1e-12)
    assert stats.mean_ratio.item() == pytest.approx(sum(ratios) / len(ratios))
    assert stats.clip_fraction.item() == pytest.approx(sum(clipped) / len(clipped))
    assert 0 < stats.clip_fraction.item() < 1
    loss.backward()
    assert logp.grad is not None and torch.all(logp.grad[~mask] == 0)


def test_clipped_loss_gradient_is_zero_on_clipped_tokens():
    logp = torch.tensor([[math.log(2.0), 0.0]], requires_grad=True)  # ratio 2 (clipped), ratio 1
    old = torch.zeros(1, 2)
    loss, _ = L.clipped_policy_gradient_loss(logp, old, torch.tensor([1.0]), None)
    loss.backward()
    assert logp.grad[0, 0].item() == 0.0
    assert logp.grad[0, 1].item() == pytest.approx(-0.5)  # -(rho * A) / 2 tokens, d rho/d logp = rho = 1


def test_k3_matches_formula_and_equals_kl_in_expectation(gen):
    logp = torch.randn(B, T, generator=gen)
    ref = torch.randn(B, T, generator=gen)
    k3 = L.k3_kl(logp, ref, _mask())
    for b in range(B):
        for t in range(T):
            d = float(ref[b, t] - logp[b, t])
            assert k3[b, t].item() == pytest.approx((math.exp(d) - d - 1) if _mask()[b, t] else 0.0)
    # Sampling tokens from pi: mean k3 estimates KL(pi || ref).
    pi = Categorical(logits=torch.randn(V, generator=gen))
    ref_dist = Categorical(logits=torch.randn(V, generator=gen))
    samples = pi.sample((200_000,))
    estimate = L.k3_kl(pi.log_prob(samples), ref_dist.log_prob(samples)).mean()
    assert estimate.item() == pytest.approx(kl_divergence(pi, ref_dist).item(), rel=0.03)


def test_truncated_importance_weight():
    logp = torch.tensor([0.0, 1.0, -1.0], requires_grad=True)
    weight = L.truncated_importance_weight(logp, torch.zeros(3), cap=2.0)
    assert torch.allclose(weight, torch.tensor([1.0, 2.0, math.exp(-1.0)]))
    assert not weight.requires_grad


# ------------------------------------------------------------------ full-vocabulary divergences


def _categoricals(logits):
    return Categorical(logits=logits)


def _loop_kl(p_logits, q_logits):
    p = torch.softmax(p_logits, -1)
    q = torch.softmax(q_logits, -1)
    return sum(float(p[v]) * (math.log(float(p[v])) - math.log(float(q[v]))) for v in range(p.shape[-1]))


def _loop_jsd(s_logits, t_logits, beta):
    p_s = torch.softmax(s_logits, -1)
    p_t = torch.softmax(t_logits, -1)
    total = 0.0
    for v in range(p_s.shape[-1]):
        s, t = float(p_s[v]), float(p_t[v])
        m = beta * t + (1 - beta) * s
        total += beta * t * math.log(t / m) + (1 - beta) * s * math.log(s / m)
    return total


def test_full_vocab_kls_match_torch_distributions(gen):
    student = torch.randn(B, T, V, generator=gen)
    teacher = torch.randn(B, T, V, generator=gen) * 2
    mask = _mask()
    reverse = L.full_vocab_divergence(student, teacher, mask, "reverse_kl")
    forward = L.full_vocab_divergence(student, teacher, mask, "forward_kl")
    expected_reverse = kl_divergence(_categoricals(student), _categoricals(teacher))
    expected_forward = kl_divergence(_categoricals(teacher), _categoricals(student))
    assert torch.allclose(reverse, expected_reverse * mask, atol=1e-12)
    assert torch.allclose(forward, expected_forward * mask, atol=1e-12)
    # log-probs in instead of logits: same answer
    assert torch.allclose(L.full_vocab_divergence(torch.log_softmax(student, -1), teacher, mask), reverse, atol=1e-12)


@pytest.mark.parametrize("beta", [0.1, 0.5, 0.9])
def test_jsd_interior_matches_loop(gen, beta):
    student = torch.randn(2, 2, V, generator=gen)
    teacher = torch.randn(2, 2, V, generator=gen)
    jsd = L.full_vocab_divergence(student, teacher, None, "jsd", beta=beta)
    for b in range(2):
        for t in range(2):
            assert jsd[b, t].item() == pytest.approx(_loop_jsd(student[b, t], teacher[b, t], beta), abs=1e-12)
    raw = L.full_vocab_divergence(student, teacher, None, "jsd", beta=beta, jsd_convention="raw")
    assert torch.allclose(raw, jsd)


def test_jsd_endpoints_raw_zero_and_trl_gkd_kl_limits(gen):
    student = torch.randn(2, 3, V, generator=gen)
    teacher = torch.randn(2, 3, V, generator=gen)
    for beta in (0.0, 1.0):
        raw = L.full_vocab_divergence(student, teacher, None, "jsd", beta=beta, jsd_convention="raw")
        assert torch.allclose(raw, torch.zeros(2, 3), atol=1e-12)
    forward = L.full_vocab_divergence(student, teacher, None, "forward_kl")
    reverse = L.full_vocab_divergence(student, teacher, None, "reverse_kl")
    assert torch.allclose(L.full_vocab_divergence(student, teacher, None, "jsd", beta=0.0), forward)
    assert torch.allclose(L.full_vocab_divergence(student, teacher, None, "jsd", beta=1.0), reverse)
    # and they are the limits of the normalised JSD: JSD/beta -> forward KL, JSD/(1-beta) -> reverse KL
    small = 1e-5
    near0 = L.full_vocab_divergence(student, teacher, None, "jsd", beta=small, jsd_convention="raw") / small
    near1 = L.full_vocab_divergence(student, teacher, None, "jsd", beta=1 - small, jsd_convention="raw") / small
    assert torch.allclose(near0, forward, rtol=1e-3)
    assert torch.allclose(near1, reverse, rtol=1e-3)
    with pytest.raises(ValueError, match="beta"):
        L.full_vocab_divergence(student, teacher, None, "jsd", beta=1.5)
    with pytest.raises(ValueError, match="unknown divergence kind"):
        L.full_vocab_divergence(student, teacher, None, "tv")


def test_divergence_gradients_reach_only_the_student(gen):
    for kind in L.DIVERGENCE_KINDS:
        student = torch.randn(B, T, V, generator=gen, requires_grad=True)
        teacher = torch.randn(B, T, V, generator=gen, requires_grad=True)
        L.full_vocab_divergence(student, teacher, _mask(), kind).sum().backward()
        assert teacher.grad is None
        assert student.grad is not None and student.grad.abs().sum() > 0
        assert torch.all(student.grad[~_mask()] == 0)


def test_full_vocab_reverse_kl_gradient_matches_autograd_of_loop(gen):
    student = torch.randn(1, 1, V, generator=gen, requires_grad=True)
    teacher = torch.randn(1, 1, V, generator=gen)
    L.full_vocab_divergence(student, teacher).sum().backward()
    reference = student.detach().clone().requires_grad_()
    kl_divergence(Categorical(logits=reference), Categorical(logits=teacher)).sum().backward()
    assert torch.allclose(student.grad, reference.grad, atol=1e-12)


def test_per_token_clip_caps_value_and_stops_gradient(gen):
    student = torch.randn(1, 4, V, generator=gen, requires_grad=True)
    teacher = torch.randn(1, 4, V, generator=gen) * 5
    plain = L.full_vocab_divergence(student, teacher)
    cap = float(plain.detach().median())
    clipped = L.full_vocab_divergence(student, teacher, clip=cap)
    assert torch.allclose(clipped, plain.clamp(max=cap))
    clipped.sum().backward()
    above = plain.detach()[0] > cap
    assert torch.all(student.grad[0][above] == 0)
    assert torch.all(student.grad[0][~above].abs().sum(-1) > 0)


# ------------------------------------------------------------------ top-M + tail


def _loop_topm_reverse_kl(student_logits, teacher_logits, ids, tail):
    """Direct computation for one token: probabilities on ids, plus 1 - sum as a tail, or renormalised."""
    p_s = torch.softmax(student_logits, -1)
    p_t = torch.softmax(teacher_logits, -1)
    s = [float(p_s[i]) for i in ids]
    t = [float(p_t[i]) for i in ids]
    if tail:
        s.append(1 - sum(s))
        t.append(1 - sum(t))
    else:
        s = [x / sum(s) for x in s]
        t = [x / sum(t) for x in t]
    return sum(a * math.log(a / b) for a, b in zip(s, t))


@pytest.mark.parametrize("support", ["student", "teacher"])
@pytest.mark.parametrize("tail", [True, False])
def test_topm_reverse_kl_matches_loop(gen, support, tail):
    student = torch.randn(B, T, V, generator=gen)
    teacher = torch.randn(B, T, V, generator=gen) * 1.5
    mask = _mask()
    values = L.topm_distillation(student, teacher, M, mask, "reverse_kl", support=support, tail=tail)
    source = student if support == "student" else teacher
    for b in range(B):
        for t in range(T):
            ids = torch.topk(source[b, t], M).indices.tolist()
            expected = _loop_topm_reverse_kl(student[b, t], teacher[b, t], ids, tail) if mask[b, t] else 0.0
            assert values[b, t].item() == pytest.approx(expected, abs=1e-10)


def test_topm_forward_and_jsd_use_the_same_support(gen):
    student = torch.randn(B, T, V, generator=gen)
    teacher = torch.randn(B, T, V, generator=gen)
    record = L.gather_topm(teacher, L.student_topm_ids(student, M))
    ids = record.ids
    s_lp = torch.log_softmax(student, -1).gather(-1, ids)
    s_support = torch.cat([s_lp, torch.log1p(-s_lp.exp().sum(-1, keepdim=True))], -1)
    t_support = torch.cat([record.logprobs, torch.log1p(-record.logprobs.exp().sum(-1, keepdim=True))], -1)
    forward = L.topm_divergence(student, record, None, "forward_kl")
    expected_forward = kl_divergence(Categorical(logits=t_support), Categorical(logits=s_support))
    assert torch.allclose(forward, expected_forward, atol=1e-10)
    jsd = L.topm_divergence(student, record, None, "jsd", beta=0.3)
    assert jsd[1, 2].item() == pytest.approx(_loop_jsd(s_support[1, 2], t_support[1, 2], 0.3), abs=1e-10)


def test_topm_with_full_support_equals_full_vocab(gen):
    student = torch.randn(B, T, V, generator=gen)
    teacher = torch.randn(B, T, V, generator=gen)
    full = L.full_vocab_divergence(student, teacher, _mask(), "reverse_kl")
    # M = V: nothing is left in the tail (floored at ~1e-19), so the divergence is the full-vocabulary one
    topm = L.topm_distillation(student, teacher, V, _mask(), "reverse_kl", support="teacher", tail=True)
    assert torch.allclose(topm, full, atol=1e-6)
    renorm = L.topm_distillation(student, teacher, V, _mask(), "reverse_kl", support="student", tail=False)
    assert torch.allclose(renorm, full, atol=1e-12)


def test_teacher_record_is_m_plus_one_numbers_and_tail_is_stable():
    teacher = torch.randn(2, 3, 1000)
    record = L.teacher_topm(teacher, 8)
    assert record.ids.shape == (2, 3, 8) and record.logprobs.shape == (2, 3, 8) and record.tail.shape == (2, 3)
    assert record.numel_per_token() == 9
    total = record.logprobs.exp().sum(-1) + record.tail.exp()
    assert torch.allclose(total, torch.ones(2, 3), atol=1e-12)
    # fp32, almost all mass on the kept ids (log-probs as a teacher server ships them): 1 - sum p in
    # linear space rounds to 0, the stable form keeps the remaining mass to full relative precision.
    kept = torch.tensor([[-1e-10, -40.0]], dtype=torch.float32)
    expected_tail = math.log(1e-10 - math.exp(-40.0))
    assert L.tail_logprob(kept).item() == pytest.approx(expected_tail, rel=1e-5)
    assert torch.log(1 - kept.exp().sum(-1)).item() == float("-inf")
    # everything kept: the tail holds only rounding error (or the ~1e-19 floor), finite, never log(0)
    gen32 = torch.Generator().manual_seed(0)
    for _ in range(20):
        full = L.teacher_topm(torch.randn(4, 4, 5, generator=gen32, dtype=torch.float32), 5)
        assert torch.isfinite(full.tail).all()
        assert (full.tail.exp() < 1e-6).all()
    exact = L.tail_logprob(torch.tensor([[0.0]], dtype=torch.float32))
    assert exact.item() == pytest.approx(math.log(math.sqrt(torch.finfo(torch.float32).tiny)), rel=1e-4)


def test_topm_gradients_reach_only_student_logits_and_stay_finite(gen):
    for kind in L.DIVERGENCE_KINDS:
        for support in ("student", "teacher"):
            student = torch.randn(B, T, V, generator=gen, dtype=torch.float32, requires_grad=True)
            teacher = (torch.randn(B, T, V, generator=gen, dtype=torch.float32) * 8).requires_grad_()
            values = L.topm_distillation(student, teacher, M, _mask(), kind, support=support)
            values.sum().backward()
            assert teacher.grad is None
            assert torch.isfinite(student.grad).all() and student.grad.abs().sum() > 0
            assert torch.all(student.grad[~_mask()] == 0)


def test_topm_record_validation():
    with pytest.raises(ValueError, match=r"\[B, T, M\]"):
        L.TopM(torch.zeros(2, 3, dtype=torch.long), torch.zeros(2, 3), torch.zeros(2))
    with pytest.raises(ValueError, match="tail"):
        L.TopM(torch.zeros(1, 2, 3, dtype=torch.long), torch.zeros(1, 2, 3), torch.zeros(1, 3))
    with pytest.raises(ValueError, match="M <= V"):
        L.teacher_topm(torch.zeros(1, 1, 4), 5)
    with pytest.raises(ValueError, match="support"):
        L.topm_distillation(torch.zeros(1, 1, 4), torch.zeros(1, 1, 4), 2, support="both")


# ------------------------------------------------------------------ sampled-token estimator


def test_sampled_token_estimator(gen):
    student_logits = torch.randn(B, T, V, generator=gen, requires_grad=True)
    teacher_logits = torch.randn(B, T, V, generator=gen, requires_grad=True)
    tokens = torch.randint(0, V, (B, T), generator=gen)
    s_lp = L.token_logprobs(student_logits, tokens)
    t_lp = L.token_logprobs(teacher_logits, tokens)
    for b in range(B):
        for t in range(T):
            expected = torch.log_softmax(student_logits.detach()[b, t], -1)[tokens[b, t]]
            assert s_lp[b, t].item() == pytest.approx(float(expected))
    mask = _mask()
    adv = L.sampled_token_advantages(s_lp, t_lp, mask)
    assert torch.allclose(adv, -(s_lp - t_lp).detach() * mask)
    surrogate = L.sampled_token_surrogate(s_lp, t_lp, mask)
    surrogate.sum().backward()
    assert teacher_logits.grad is None
    # gradient of the surrogate w.r.t. log p_S(y_t) is r_t (stopgrad)
    ratio = (s_lp - t_lp).detach()
    leaf = s_lp.detach().requires_grad_()
    L.sampled_token_surrogate(leaf, t_lp, mask).sum().backward()
    assert torch.allclose(leaf.grad, ratio * mask)
    clipped = L.sampled_token_surrogate(leaf.detach(), t_lp, None, clip=0.1)
    assert torch.all(clipped.abs() <= 0.1 * leaf.detach().abs() + 1e-12)


def test_sampled_token_estimator_is_unbiased_for_reverse_kl_gradient(gen):
    """E_{y~p_S}[grad stopgrad(r) log p_S(y)] equals grad KL(p_S || p_T) (score-function identity)."""
    student = torch.randn(V, generator=gen, requires_grad=True)
    teacher = torch.randn(V, generator=gen)
    exact = torch.autograd.grad(kl_divergence(Categorical(logits=student), Categorical(logits=teacher)), student)[0]
    probs = torch.softmax(student.detach(), -1)
    expected = torch.zeros(V)
    for y in range(V):  # exact expectation over the vocabulary, one term per sampled token
        s_lp = L.token_logprobs(student.view(1, 1, V), torch.tensor([[y]]))
        t_lp = L.token_logprobs(teacher.view(1, 1, V), torch.tensor([[y]]))
        grad = torch.autograd.grad(L.sampled_token_surrogate(s_lp, t_lp).sum(), student)[0]
        expected += probs[y] * grad
    assert torch.allclose(expected, exact, atol=1e-12)


# ------------------------------------------------------------------ BCO


def test_bco_reward_and_loss_match_formula(gen):
    policy = torch.randn(4, T, generator=gen, requires_grad=True)
    ref = torch.randn(4, T, generator=gen, requires_grad=True)
    mask = torch.ones(4, T)
    mask[1, 2:] = 0
    rewards = L.bco_implicit_reward(policy, ref, mask, beta=0.1)
    for b in range(4):
        expected = 0.1 * sum(float(policy.detach()[b, t] - ref.detach()[b, t]) for t in range(T) if mask[b, t])
        assert rewards[b].item() == pytest.approx(expected)
    delta = 0.05
    loss, stats = L.bco_loss(rewards[:3], rewards[3:], delta)

    def log_sigmoid(x):
        return -math.log1p(math.exp(-x))

    plain = [float(r) for r in rewards.detach()]
    terms = [-log_sigmoid(r - delta) for r in plain[:3]] + [-log_sigmoid(-(plain[3] - delta))]
    assert loss.item() == pytest.approx(sum(terms) / 4)
    assert stats.delta == delta and stats.chosen_reward.item() == pytest.approx(float(rewards.detach()[:3].mean()))
    loss.backward()
    assert ref.grad is None and policy.grad.abs().sum() > 0
    only_rejected, _ = L.bco_loss(torch.zeros(0), torch.tensor([0.0]), 0.0)
    assert only_rejected.item() == pytest.approx(math.log(2))
    with pytest.raises(ValueError, match="at least one"):
        L.bco_loss(torch.zeros(0), torch.zeros(0), 0.0)


def test_running_mean_cumulative_ema_and_state_roundtrip():
    running = L.RunningMean()
    seen: list[float] = []
    for batch in ([1.0, 2.0], [6.0], [], [0.5, 0.5, 0.5]):
        running.update(torch.tensor(batch))
        seen += batch
        assert running.mean == pytest.approx(sum(seen) / len(seen))
    restored = L.RunningMean()
    restored.load_state_dict(running.state_dict())
    assert restored.mean == running.mean and restored.count == running.count
    ema = L.RunningMean(momentum=0.5)
    ema.update([4.0])
    ema.update([0.0, 2.0])
    assert ema.mean == pytest.approx(4.0 + 0.5 * (1.0 - 4.0))
    with pytest.raises(ValueError, match="momentum"):
        L.RunningMean(momentum=0.0)


def test_gathered_logprobs_custom_backward_passes_gradcheck(gen):
    """The hand-written backward (one [.., V] buffer) against finite differences, repeated ids included."""
    logits = torch.randn(2, 3, 7, generator=gen, requires_grad=True)
    ids = torch.randint(0, 7, (2, 3, 4), generator=gen)
    ids[0, 0, 1] = ids[0, 0, 0]  # a repeated id must accumulate both contributions
    assert torch.autograd.gradcheck(lambda x: L.gathered_logprobs(x, ids), (logits,))
    values = L.gathered_logprobs(logits, ids)
    assert torch.allclose(values, torch.log_softmax(logits, -1).gather(-1, ids))
    assert torch.allclose(L.gathered_logprobs(logits.detach(), ids), values)


def test_per_token_clipped_surrogate_and_its_diagnostics_match_the_aggregated_loss():
    torch.manual_seed(0)
    logp = torch.randn(2, 5, requires_grad=True)
    old = logp.detach() + 0.3 * torch.randn(2, 5)
    adv = torch.tensor([1.0, -0.5])
    mask = torch.tensor([[1, 1, 1, 0, 0], [0, 1, 1, 1, 1]], dtype=torch.float32)
    per_token, parts = L.clipped_policy_gradient_per_token(logp, old, adv, eps_low=0.2)
    ratio = (logp - old).exp()
    want = -torch.minimum(ratio * adv[:, None], ratio.clamp(0.8, 1.2) * adv[:, None])
    torch.testing.assert_close(per_token, want)
    loss, stats = L.clipped_policy_gradient_loss(logp, old, adv, mask)
    torch.testing.assert_close(loss, (want * mask).sum() / mask.sum())
    torch.testing.assert_close(stats.clip_fraction, (parts["clip_fraction"] * mask).sum() / mask.sum())


def test_bco_row_losses_pick_the_side_of_each_sequence():
    r = torch.tensor([0.3, -0.2, 1.0])
    chosen = torch.tensor([True, False, True])
    got = L.bco_row_losses(r, chosen, 0.1)
    want = [-math.log(1 / (1 + math.exp(-(0.3 - 0.1)))), -math.log(1 / (1 + math.exp(-0.2 - 0.1))),
            -math.log(1 / (1 + math.exp(-(1.0 - 0.1))))]
    torch.testing.assert_close(got, torch.tensor(want))


@pytest.mark.parametrize("teacher_grad", [False, True])
def test_top_m_distillation_reaches_the_teachers_logits_only_when_asked(teacher_grad):
    torch.manual_seed(1)
    student = torch.randn(1, 3, 12, requires_grad=True)
    teacher = torch.randn(1, 3, 12, requires_grad=True)
    per_token = L.topm_distillation(student, teacher, 4, None, "reverse_kl", support="student", teacher_grad=teacher_grad)
    per_token.sum().backward()
    assert student.grad is not None and student.grad.abs().sum() > 0
    assert (teacher.grad is not None and teacher.grad.abs().sum() > 0) == teacher_grad
