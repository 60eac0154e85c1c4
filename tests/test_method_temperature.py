"""Rollouts sampled at a temperature T != 1: the behaviour log-probs are those of the distribution sampled from,
``softmax(logits / T)``, and GRPO's and SDPO's importance ratios take their current log-probs at the same T, so
the ratio is 1 at the first step for the policy that sampled (TRL's and verl's convention).

The tiny model samples a real multi-turn household batch at T = 0.5. Checks: the batch records T; its
behaviour log-probs match a teacher-forced forward at T (and not at 1); GRPO's per-token ratio is 1 and its
SGD step equals the hand-written clipped surrogate on ``log_softmax(logits / T)``; SDPO's policy-gradient
log-probs are at T.
"""

from __future__ import annotations

import pytest
import torch

import agentgym_opd
from agentgym_opd.algorithm import sequence_logits, sequence_logprobs
from agentgym_opd.losses import group_advantages, token_logprobs
from agentgym_opd.policy.base import SamplingParams
from agentgym_opd.policy.hf import HFPolicy
from agentgym_opd.policy.tiny import default_tiny_model
from agentgym_opd.rollout import RolloutEngine
from agentgym_opd.trainer import DEFAULT_SYSTEM_PROMPT
from algorithms.grpo import GRPO
from algorithms.sdpo import SDPO
from tiny_rollouts import HOUSEHOLD, accept_any

T = 0.5
LR = 0.05


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def batch():
    torch.manual_seed(0)
    policy = HFPolicy.from_pretrained(default_tiny_model())
    engine = RolloutEngine(policy, SamplingParams(max_new_tokens=6, temperature=T), system_prompt=DEFAULT_SYSTEM_PROMPT,
                           action_parser=accept_any)
    tasks = agentgym_opd.make(HOUSEHOLD).task_ids()[:2]
    batch = engine.collect(HOUSEHOLD, tasks, group_size=2, seed=1, max_turns=2)
    batch.rewards = torch.tensor([1.0, 0.0, 0.0, 1.0])
    return batch


def forward_logprobs(batch, temperature):
    """Teacher-forced log-probs of the batch's tokens under the initial tiny model at ``temperature``."""
    model = HFPolicy.from_pretrained(default_tiny_model()).model
    with torch.no_grad():
        logits, _, mask = sequence_logits(model, batch, slice(0, len(batch)))
    targets = batch.input_ids[:, 1: logits.shape[1] + 1]
    return token_logprobs(logits / temperature, targets), mask


def test_behaviour_logprobs_are_of_the_tempered_distribution_and_the_batch_records_its_temperature(batch):
    assert batch.logprob_temperature == T
    tempered, mask = forward_logprobs(batch, T)
    raw, _ = forward_logprobs(batch, 1.0)
    on = mask.bool()
    behaviour = batch.behaviour_logprobs[:, 1: mask.shape[1] + 1]
    torch.testing.assert_close(behaviour[on], tempered[on], atol=1e-4, rtol=0)
    assert (behaviour[on] - raw[on]).abs().max() > 1e-2  # the temperature-1 distribution is another one


def test_grpo_ratio_is_one_at_the_first_step_and_its_step_is_the_tempered_surrogate(batch):
    student = HFPolicy.from_pretrained(default_tiny_model())
    algo = GRPO({}, student, optimizer=torch.optim.SGD(student.model.parameters(), lr=LR), grad_clip=None,
                micro_batch_size=len(batch))
    with torch.no_grad():
        logp, mask = sequence_logprobs(algo.model, batch, slice(0, len(batch)), batch.logprob_temperature)
    old = batch.behaviour_logprobs[:, 1: logp.shape[1] + 1]
    ratio = (logp - old).exp()[mask.bool()]
    torch.testing.assert_close(ratio, torch.ones_like(ratio), atol=2e-4, rtol=0)
    _, metrics = algo.loss(batch)
    assert metrics["mean_ratio"] == pytest.approx(1.0, abs=2e-4) and metrics["clip_fraction"] == 0.0

    hand = HFPolicy.from_pretrained(default_tiny_model()).model
    logits, _, mask = sequence_logits(hand, batch, slice(0, len(batch)))
    targets = batch.input_ids[:, 1: logits.shape[1] + 1]
    logp = torch.log_softmax(logits / T, -1).gather(-1, targets[..., None]).squeeze(-1)
    adv = group_advantages(batch.rewards, batch.group_ids)[:, None]
    rho = (logp - old).exp()
    loss = (-torch.minimum(rho * adv, rho.clamp(0.8, 1.2) * adv) * mask).sum() / mask.sum()
    grads = torch.autograd.grad(loss, list(hand.parameters()))
    metrics = algo.update(batch)
    assert metrics["loss"] == pytest.approx(float(loss), abs=1e-5)
    for (name, p), g, start in zip(algo.model.named_parameters(), grads, hand.parameters()):
        torch.testing.assert_close(p.detach(), start.detach() - LR * g, atol=1e-5, rtol=0, msg=lambda m: f"{name}: {m}")


def test_sdpo_policy_gradient_log_probs_are_at_the_rollout_temperature(batch):
    student = HFPolicy.from_pretrained(default_tiny_model())
    algo = SDPO({"distill_weight": 0.5, "teacher": "live"}, student)
    for episode in batch.episodes:
        episode.feedback = "Nothing happened."
    state = algo.prepare(batch)
    rows = slice(0, len(batch))
    tempered, mask = forward_logprobs(batch, T)
    on = mask.bool()
    with torch.no_grad():
        chunked = algo.chunked_terms(batch, rows, state).student_logp
        full = algo.distillation_terms(batch, rows, state)[4]
    torch.testing.assert_close(chunked[on], tempered[on], atol=1e-5, rtol=0)
    torch.testing.assert_close(full[on], tempered[on], atol=1e-5, rtol=0)
    with torch.no_grad():
        _, metrics = algo.loss(batch, state)
    assert metrics["pg_mean_ratio"] == pytest.approx(1.0, abs=2e-4)
