"""Every method's real ``update`` is its batch-level formula, whatever the micro-batch size.

One real multi-turn batch of the tiny model (household/train, 2 tasks x 2 rollouts) is given rewards,
successes, feedback and a mix of agent errors, env faults and clean turns, so every method has
something to weigh. For each method: a fresh student takes ONE plain SGD step (no clip) through
``algorithm.update`` with micro-batch 1 and with micro-batch B; a third fresh student computes the loss
as the paper's batch-level formula, written out below from model forwards and plain tensor algebra,
and steps by hand. Loss and updated weights must agree to 1e-5. A wrong normaliser, a flipped KL
direction, a flipped margin sign, a changed mix formula or a changed VPD reference all move them. The
batch's behaviour log-probs are perturbed (a stale sampler), so GRPO's ratio is not 1 and part of it is
clipped; GRPO, SDPO, SAGE-OPD and LOPD are checked to have a non-zero loss (an all-zero loss would make the
comparison say nothing about the loss's value). LOPD's bank holds experiences of tasks outside the batch.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

import agentgym_opd

from agentgym_opd.algorithm import sequence_logits
from agentgym_opd.distill import aligned_teacher_logits, teacher_inputs, teacher_prefix
from agentgym_opd.losses import group_advantages, token_logprobs
from agentgym_opd.policy.hf import HFPolicy
from agentgym_opd.policy.tiny import default_tiny_model
from agentgym_opd.types import StepError
from algorithms.grpo import GRPO
from algorithms.lopd import LOPD
from algorithms.opd import OPD
from algorithms.opsd import OPSD
from algorithms.sage_opd import SAGEOPD
from algorithms.sdpo import SDPO
from algorithms.sft import SFT
from algorithms.vpd import VPD
from tiny_rollouts import HOUSEHOLD, tiny_household_rollout

LR = 0.05
TOL = 1e-5


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def batch():
    _, batch = tiny_household_rollout(seed=1, max_turns=3, max_new_tokens=6)
    batch.rewards = torch.tensor([1.0, 0.0, 0.0, 1.0])
    for row, episode in enumerate(batch.episodes):
        episode.success = row in (0, 3)
        episode.feedback = "" if episode.success else f"The attempt {row} failed: nothing happened."
        # turn 0: an agent error (Strong); turn 1: clean (Weak by default); turn 2: an env fault (not Strong)
        episode.turns[1].error = None
        episode.turns[2].error = StepError("env_crash", "the backend died")
    assert [len(e.turns) for e in batch.episodes] == [3, 3, 3, 3]
    # the behaviour policy was slightly stale: ratios differ from 1 (some beyond the clip range), so the
    # clipped surrogate's loss is not 0 even where every rollout has as many agent tokens as its sibling
    generator = torch.Generator().manual_seed(7)
    batch.behaviour_logprobs = batch.behaviour_logprobs + 0.3 * torch.randn(batch.behaviour_logprobs.shape,
                                                                            generator=generator) * batch.loss_mask
    return batch


@pytest.fixture(scope="module")
def teacher_path(tmp_path_factory):
    """A separate teacher: the tiny model with perturbed weights (same tokenizer)."""
    torch.manual_seed(5)
    teacher = HFPolicy.from_pretrained(default_tiny_model())
    with torch.no_grad():
        for p in teacher.model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    path = tmp_path_factory.mktemp("teacher") / "model"
    teacher.model.save_pretrained(path)
    teacher.tokenizer.save_pretrained(path)
    return path


def fresh_student():
    return HFPolicy.from_pretrained(default_tiny_model())


def build(cls, config, teacher_path, micro_batch_size):
    student = fresh_student()
    teacher = None
    if teacher_path is not None:
        teacher = HFPolicy.from_pretrained(teacher_path)
        teacher.model.requires_grad_(False)
    torch.manual_seed(11)  # LOPD's composer initialisation
    optimizer = torch.optim.SGD([p for p in student.model.parameters() if p.requires_grad], lr=LR)
    return cls(dict(config), student, teacher, optimizer=optimizer, grad_clip=None, micro_batch_size=micro_batch_size)


def params_of(algo) -> dict[str, torch.Tensor]:
    out = {f"student.{n}": p.detach().clone() for n, p in algo.model.named_parameters()}
    if hasattr(algo, "composer"):
        out.update({f"composer.{n}": p.detach().clone() for n, p in algo.composer.named_parameters()})
    return out


def hand_step(algo, loss: torch.Tensor) -> dict[str, torch.Tensor]:
    """Plain SGD by hand on every optimiser group (each with its own learning rate)."""
    groups = [(group["lr"], group["params"]) for group in algo.optimizer.param_groups]
    params = [p for _, ps in groups for p in ps]
    grads = torch.autograd.grad(loss, params, allow_unused=True)
    with torch.no_grad():
        k = 0
        for lr, ps in groups:
            for p in ps:
                if grads[k] is not None:
                    p.sub_(lr * grads[k])
                k += 1
    return params_of(algo)


def check_method(cls, config, batch, hand_loss, teacher_path=None, prepare=None):
    """update() with micro-batch 1 and B equals the hand formula's loss and SGD step."""
    results = []
    for micro in (1, len(batch)):
        algo = build(cls, config, teacher_path, micro)
        if prepare:
            prepare(algo)
        metrics = algo.update(batch)
        results.append((metrics, params_of(algo)))
    algo = build(cls, config, teacher_path, len(batch))
    if prepare:
        prepare(algo)
    loss = hand_loss(algo, batch)
    want = hand_step(algo, loss)
    for metrics, got in results:
        assert metrics["loss"] == pytest.approx(float(loss), abs=TOL)
        for name, value in want.items():
            torch.testing.assert_close(got[name], value, atol=TOL, rtol=0, msg=lambda m: f"{cls.__name__} {name}: {m}")
    return float(loss), results[0][0]


def mask_of(batch) -> torch.Tensor:
    return batch.loss_mask[:, 1:].float()


def full_forward(algo, batch):
    """Student logits, sampled-token log-probs and mask of the whole batch (one forward, no micro-batching)."""
    return sequence_logits(algo.model, batch, slice(0, len(batch)))


def reverse_kl(student_logits, teacher_logits):
    """KL(p_S || p_T) per token over the full vocabulary, written out."""
    ls, lt = F.log_softmax(student_logits, -1), F.log_softmax(teacher_logits.detach(), -1)
    return (ls.exp() * (ls - lt)).sum(-1)


def teacher_view_logits(model, algo, batch, contexts, width):
    prefixes = [teacher_prefix(algo.student, batch.episodes[r], c) if c else None for r, c in enumerate(contexts)]
    return aligned_teacher_logits(model, teacher_inputs(batch, slice(0, len(batch)), prefixes, 0), width)


# ----------------------------------------------------------------------------------------------------
# One test per method
# ----------------------------------------------------------------------------------------------------


def test_sft_step_is_the_token_mean_cross_entropy(batch):
    def hand(algo, batch):
        _, logp, mask = full_forward(algo, batch)
        return -(logp * mask).sum() / mask.sum()

    check_method(SFT, {}, batch, hand)


@pytest.mark.parametrize("aggregation", ["token_mean", "seq_mean_token_mean"])
def test_grpo_step_is_the_clipped_surrogate_with_its_aggregation(batch, aggregation):
    def hand(algo, batch):
        _, logp, mask = full_forward(algo, batch)
        old = batch.behaviour_logprobs[:, 1: logp.shape[1] + 1]
        adv = group_advantages(batch.rewards, batch.group_ids)[:, None]
        ratio = (logp - old).exp()
        per_token = -torch.minimum(ratio * adv, ratio.clamp(0.8, 1.2) * adv)
        if aggregation == "token_mean":
            return (per_token * mask).sum() / mask.sum()
        return ((per_token * mask).sum(1) / mask.sum(1)).mean()

    loss, metrics = check_method(GRPO, {"aggregation": aggregation}, batch, hand)
    assert abs(loss) > 1e-3 and 0 < metrics["clip_fraction"] < 1  # a real signal, partly clipped


def test_opd_step_is_the_token_mean_reverse_kl_to_the_teacher(batch, teacher_path):
    def hand(algo, batch):
        logits, _, mask = full_forward(algo, batch)
        teacher = teacher_view_logits(algo.teacher.model, algo, batch, [None] * len(batch), logits.shape[1] + 1)
        return (reverse_kl(logits, teacher) * mask).sum() / mask.sum()

    check_method(OPD, {}, batch, hand, teacher_path)


def test_opsd_default_renormalises_over_the_teachers_top_m_without_a_tail(batch):
    m = 8

    def hand(algo, batch):
        logits, _, mask = full_forward(algo, batch)
        contexts = [algo.teacher_context(batch, r) for r in range(len(batch))]
        teacher = teacher_view_logits(algo.model, algo, batch, contexts, logits.shape[1] + 1)
        ids = teacher.topk(m, -1).indices
        ls = F.log_softmax(logits.gather(-1, ids), -1)  # renormalised over the M ids: no tail bucket
        lt = F.log_softmax(teacher.gather(-1, ids), -1)
        kl = (ls.exp() * (ls - lt)).sum(-1)
        return (kl * mask).sum() / mask.sum()

    check_method(OPSD, {"top_m": m}, batch, hand)


def test_sdpo_step_is_the_mix_of_grpo_and_distillation_over_kept_rows(batch):
    w = 0.3

    def hand(algo, batch):
        logits, logp, mask = full_forward(algo, batch)
        contexts = [algo.teacher_context(batch, r) for r in range(len(batch))]
        keep = torch.tensor([c is not None for c in contexts], dtype=torch.float32)[:, None]
        assert 0 < keep.sum() < len(batch), "some rows kept, some masked"
        teacher = teacher_view_logits(algo.self_teacher.copy, algo, batch, contexts, logits.shape[1] + 1)
        distill = (reverse_kl(logits, teacher) * mask * keep).sum() / (mask * keep).sum()
        old = batch.behaviour_logprobs[:, 1: logp.shape[1] + 1]
        adv = group_advantages(batch.rewards, batch.group_ids)[:, None]
        ratio = (logp - old).exp()
        pg = (-torch.minimum(ratio * adv, ratio.clamp(0.8, 1.2) * adv) * mask).sum() / mask.sum()
        return (1 - w) * pg + w * distill

    loss, metrics = check_method(SDPO, {"distill_weight": w}, batch, hand)
    assert abs(metrics["pg_loss"]) > 1e-3 and metrics["distill_loss"] > 1e-3 and abs(loss) > 1e-3


def test_sage_opd_step_is_z_times_the_turn_weighted_opd_loss_over_the_whole_batch(batch, teacher_path):
    alpha = 0.5

    def hand(algo, batch):
        logits, _, mask = full_forward(algo, batch)
        teacher = teacher_view_logits(algo.teacher.model, algo, batch, [None] * len(batch), logits.shape[1] + 1)
        top1 = F.softmax(teacher, -1).amax(-1)
        turn_of = batch.turn_index[:, 1: logits.shape[1] + 1]
        s = torch.zeros_like(mask)
        for r, episode in enumerate(batch.episodes):
            for k, turn in enumerate(episode.turns):
                on = (turn_of[r] == k) & (mask[r] > 0)
                importance = 1.0 if turn.error is not None and turn.error.kind != "env_crash" else alpha
                s[r][on] = importance * top1[r][on].mean()
        n = mask.sum()
        z = n / s.sum()  # the weighted token count equals OPD's
        return z * (s * reverse_kl(logits, teacher)).sum() / n

    loss, metrics = check_method(SAGEOPD, {"judge": "errors_only", "alpha": alpha}, batch, hand, teacher_path)
    assert loss > 1e-3
    assert metrics["turns_error_forced"] == 4 and metrics["turns_defaulted"] == 8  # env faults are not Strong


def test_lopd_step_is_reverse_kl_on_student_top_m_with_tail_plus_the_margin_term(batch):
    m, margin, beta, eta = 8, 0.1, 0.5, 0.05
    config = {"top_m": m, "embedder": "hashing", "beta_init": beta, "margin_value": margin, "dual_lr": eta,
              "num_experiences": 1, "experience_max_tokens": 32}

    def bank(algo):
        algo.work_dir = None
        algo.bank.add_many(other_tasks_experience())  # earlier batches' successes on tasks outside this batch
        generator = torch.Generator().manual_seed(3)
        with torch.no_grad():  # move the frozen teacher away from the student, so KL's direction shows
            for p in algo.frozen_teacher.parameters():
                p.add_(torch.randn(p.shape, generator=generator) * 0.05)

    gaps = {}

    def hand(algo, batch):
        logits, logp, mask = full_forward(algo, batch)
        found = [algo.retrieve(e) for e in batch.episodes]
        batch_tasks = {e.task.id for e in batch.episodes}
        assert all(found) and not any(x.task_id in batch_tasks for f in found for x in f)  # no leak of the batch
        context = [algo.composer.context(e.task.instruction, [x.as_text() for x in f]) for e, f in zip(batch.episodes, found)]
        teacher = []  # row by row, the teacher's whole forward over [latents ; embedded ids]
        for r, latents in enumerate(context):
            length = int(batch.attention_mask[r].sum())
            embeds = torch.cat([latents, algo.frozen_teacher.get_input_embeddings()(batch.input_ids[r, :length])])
            row = algo.frozen_teacher(inputs_embeds=embeds[None]).logits.float()[0, latents.shape[0]:]
            teacher.append(F.pad(row, (0, 0, 0, logits.shape[1] - row.shape[0]))[: logits.shape[1]])
        teacher = torch.stack(teacher)
        ids = logits.detach().topk(m, -1).indices
        ls_all, lt_all = F.log_softmax(logits, -1), F.log_softmax(teacher, -1)
        ls, lt = ls_all.gather(-1, ids), lt_all.gather(-1, ids)
        ls = torch.cat([ls, torch.log1p(-ls.exp().sum(-1, keepdim=True))], -1)  # the tail bucket
        lt = torch.cat([lt, torch.log1p(-lt.exp().sum(-1, keepdim=True))], -1)
        kl = (ls.exp() * (ls - lt)).sum(-1)  # KL(student || teacher): the student's probabilities weigh
        distill = (kl * mask).sum() / mask.sum()
        targets = batch.input_ids[:, 1: logits.shape[1] + 1]
        gap_tok = token_logprobs(teacher, targets) - logp.detach()
        success = torch.tensor([e.success for e in batch.episodes])
        gap = torch.stack([(gap_tok[r] * mask[r]).sum() / mask[r].sum() for r in range(len(batch)) if success[r]]).mean()
        gaps["gap"] = float(gap)
        return distill + beta * (margin - gap)

    loss, metrics = check_method(LOPD, config, batch, hand, prepare=bank)
    assert abs(loss) > 1e-3 and metrics["distill_loss"] > 1e-3 and metrics["margin_weight"] > 0.5
    assert metrics["margin_gap"] == pytest.approx(gaps["gap"], abs=TOL)
    assert metrics["beta"] == pytest.approx(max(0.0, beta + eta * (margin - gaps["gap"])), abs=TOL)


def other_tasks_experience():
    """Successful traces of household tasks that are not in the test batch (the bank LOPD may retrieve from)."""
    from experience_bank import Experience

    env = agentgym_opd.make(HOUSEHOLD, num_tasks=6)
    tasks = [env.get_task(t) for t in env.task_ids()[2:5]]
    return [Experience(t.env_id, t.id, t.instruction, [(a, "OK.") for a in t.privileged["walkthrough"]]) for t in tasks]


@pytest.mark.parametrize("view", ["student", "teacher"])
def test_vpd_e_step_is_bco_against_the_current_student_policy(batch, view):
    beta = 0.5

    def hand(algo, batch):
        contexts = [algo.teacher_context(batch, r) for r in range(len(batch))]
        width = int(batch.attention_mask.sum(1).max())
        prefixes = [teacher_prefix(algo.student, e, c) for e, c in zip(batch.episodes, contexts)]
        inputs = teacher_inputs(batch, slice(0, len(batch)), prefixes, 0)
        logits = algo.model(input_ids=inputs.input_ids, attention_mask=inputs.attention_mask).logits.float()
        own = token_logprobs(logits[:, :-1], inputs.input_ids[:, 1:])
        index = torch.arange(width - 1)[None, :] + inputs.offsets[:, None]
        q = own.gather(1, index.clamp(0, own.shape[1] - 1))
        with torch.no_grad():
            if view == "student":  # pi_ref <- pi_theta: the student's view x, without C
                _, ref, _ = full_forward(algo, batch)
            else:
                ref = q.detach()
        mask = mask_of(batch)[:, : width - 1]
        r = beta * ((q - ref) * mask).sum(1)
        delta = r.detach().mean()  # the first E-step: delta is this batch's mean reward
        chosen = torch.tensor([e.success for e in batch.episodes])
        per_row = torch.where(chosen, -F.logsigmoid(r - delta), -F.logsigmoid(-(r - delta)))
        return per_row.mean()

    loss, metrics = check_method(VPD, {"e_updates": 1, "beta": beta, "reference_view": view}, batch, hand)
    assert metrics["phase_e"] == 1.0
    if view == "teacher":  # the reference reads the feedback: the reward is exactly 0 at the first update
        assert metrics["bco_reward"] == 0.0 and loss == pytest.approx(2 * 0.34657359, abs=1e-6)
    else:
        assert abs(metrics["bco_reward"]) > 1e-4


def test_vpd_m_step_is_the_token_mean_kl_to_the_feedback_view(batch):
    def hand(algo, batch):
        logits, _, mask = full_forward(algo, batch)
        contexts = [algo.teacher_context(batch, r) for r in range(len(batch))]
        with torch.no_grad():
            teacher = teacher_view_logits(algo.model, algo, batch, contexts, logits.shape[1] + 1)
        return (reverse_kl(logits, teacher) * mask).sum() / mask.sum()

    def m_due(algo):
        algo.phase.e_steps = 1  # an E-step ran already: this update is an M-step

    _, metrics = check_method(VPD, {}, batch, hand, prepare=m_due)
    assert metrics["phase_m"] == 1.0 and metrics["phase_e"] == 0.0
