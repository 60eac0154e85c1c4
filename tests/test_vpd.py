"""VPD on real rollouts of the tiny model: BCO and the reference swap by hand, the E/M schedule, the feedback
sources, and real E- and M-steps (the teacher is the student's own network shown feedback)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest
import torch

from agentgym_opd.algorithm import sequence_logits
from agentgym_opd.config import ConfigError, dataclass_from_dict
from agentgym_opd.distill import aligned_teacher_logits
from agentgym_opd.losses import RunningMean, bco_implicit_reward, bco_loss, token_logprobs
from agentgym_opd.registry import algorithm_registry
from agentgym_opd.algorithm import Step
from agentgym_opd.distill import successful_sibling
from algorithms.vpd import VPD, VPDConfig, context_logprobs, env_feedback, repeat_tasks
from algorithms.vpd_phases import Phase
from tiny_rollouts import HOUSEHOLD as ENV
from tiny_rollouts import tiny_household_rollout



@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """One intra-op thread: the build machine's two cores are shared, and oversubscribed threads run this
    tiny model several times slower than one."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def rollout(one_thread):
    """Two household tasks x two rollouts, two turns each, by the untrained tiny model; row 0 is then
    labelled a success (the untrained model never succeeds, and BCO needs both sides)."""
    policy, batch = tiny_household_rollout(seed=5, max_turns=2, max_new_tokens=6)
    assert all(ep.num_turns == 2 and ep.feedback for ep in batch.episodes)  # real multi-turn episodes, env feedback
    batch.episodes[0].success = True
    return policy, batch


@pytest.fixture()
def fresh(rollout):
    """The rollout's policy with its weights restored after the test."""
    policy, batch = rollout
    state = {k: v.clone() for k, v in policy.model.state_dict().items()}
    yield policy, batch
    policy.model.load_state_dict(state)


def weights(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def same_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


# ---------------------------------------------------------------------------------------------------- by hand


def test_bco_reward_delta_and_loss_match_hand_computation():
    q = torch.tensor([[-1.0, -2.0, -0.5, 9.0], [-3.0, -1.0, -2.0, -1.5]])
    ref = torch.tensor([[-1.5, -1.0, -1.0, 0.0], [-2.0, -2.0, -2.0, -1.0]])
    mask = torch.tensor([[1, 1, 1, 0], [0, 1, 1, 1]])  # the 9.0 is padding: it must not count
    beta = 0.5
    r = bco_implicit_reward(q, ref, mask, beta)
    hand = [beta * ((-1 + 1.5) + (-2 + 1) + (-0.5 + 1)), beta * ((-1 + 2) + (-2 + 2) + (-1.5 + 1))]
    torch.testing.assert_close(r, torch.tensor(hand))  # [0.0, 0.25]

    running = RunningMean()
    assert running.update([1.0, 3.0]) == 2.0  # an earlier batch
    delta = running.update(r)  # TRL's order, as VPD does it: fold this batch in, then use it
    assert delta == pytest.approx((1.0 + 3.0 + hand[0] + hand[1]) / 4)

    loss, stats = bco_loss(r[:1], r[1:], delta)  # row 0 chosen, row 1 rejected

    def log_sigmoid(x):
        return -math.log1p(math.exp(-x))

    expected = (-log_sigmoid(hand[0] - delta) - log_sigmoid(-(hand[1] - delta))) / 2
    assert float(loss) == pytest.approx(expected, rel=1e-6)
    assert float(stats.chosen_reward) == pytest.approx(hand[0]) and stats.delta == pytest.approx(delta)
    one_sided, _ = bco_loss(r[:0], r, delta)  # unpaired: only rejected rows still give a loss
    assert float(one_sided) == pytest.approx(sum(-log_sigmoid(-(h - delta)) for h in hand) / 2, rel=1e-6)


def test_config_validates_the_feedback_sources_and_registers():
    assert VPDConfig().sources == ("env",) and VPDConfig(feedback="env+sibling").sources == ("env", "sibling")
    with pytest.raises(ConfigError, match="algo.*feedback"):
        dataclass_from_dict(VPDConfig, {"feedback": "env+oracle"}, path="algo")
    assert "vpd" in algorithm_registry.ids()
    assert VPDConfig().divergence == "reverse_kl" and not VPD.needs_teacher


# ---------------------------------------------------------------------------------------------------- the views


def test_differentiable_teacher_view_scores_the_students_tokens_like_the_distillation_core(rollout):
    policy, batch = rollout
    algo = VPD({}, policy)
    rows = slice(0, len(batch))
    state = algo.prepare(batch)
    inputs = algo.teacher_view(batch, rows, state)
    assert algo.kept_rows(state).tolist() == [1.0] * len(batch) and (inputs.offsets > 0).all()
    _, _, mask = sequence_logits(policy.model, batch, rows)
    width = mask.shape[1] + 1
    targets = batch.input_ids[:, 1:width]
    mine = context_logprobs(policy.model, inputs, targets, width)
    core = token_logprobs(aligned_teacher_logits(policy.model, inputs, width), targets)
    torch.testing.assert_close(mine[mask.bool()], core[mask.bool()], atol=1e-5, rtol=1e-5)
    assert mine.requires_grad


def test_feedback_sources_env_sibling_and_self_critique(rollout):
    policy, batch = rollout
    env_ctx = VPD({}, policy).teacher_context(batch, 1)
    assert batch.episodes[1].feedback in env_ctx and "Task not completed" in env_feedback(batch.episodes[1])
    sib = VPD({"feedback": "sibling"}, policy)
    assert successful_sibling(batch, 1) == 0 and successful_sibling(batch, 0) is None
    assert batch.episodes[0].turns[0].action.strip() in sib.teacher_context(batch, 1)
    assert sib.teacher_context(batch, 0) is None  # a row never sees itself as its sibling
    assert sib.teacher_context(batch, 2) is None  # the other task has no success
    crit = VPD({"feedback": "critique", "critique_tokens": 6}, policy)
    texts = crit.critiques(batch)
    state = crit.prepare(batch)  # the batch's C is decided once: E and M steps see the same critique
    assert len(texts) == len(batch) and len(state.contexts) == len(batch)
    for row, text in enumerate(texts):
        context = state.contexts[row]
        assert (context is None) == (text is None) and (text is None or text in context)


# ---------------------------------------------------------------------------------------------------- real steps


def test_e_step_reference_is_the_student_view_at_its_start_and_is_refreshed_at_the_next(fresh):
    policy, batch = fresh
    algo = VPD({"e_updates": 2}, policy, optimizer=torch.optim.SGD(policy.model.parameters(), lr=0.1))
    state = algo.prepare(batch)
    assert [s.name for s in algo.steps(state)] == ["e", "e"]
    algo.begin_step(batch, state, Step("e"))
    with torch.no_grad():  # pi_ref <- pi_theta: the student's own view of its tokens, without the feedback
        _, want, mask = sequence_logits(policy.model, batch, slice(0, len(batch)))
    torch.testing.assert_close(state.reference[:, : want.shape[1]] * mask, want * mask)
    first = state.reference.clone()
    with torch.no_grad():
        for p in policy.model.parameters():
            p.add_(0.01)
    algo.begin_step(batch, state, Step("e"))  # the E-step's second update: the same reference
    assert torch.equal(state.reference, first) and algo.phase.e_steps == 1
    algo.begin_step(batch, state, Step("e"))  # the next E-step: refreshed from the moved weights
    assert not torch.equal(state.reference, first)
    assert algo.delta.count == 3 * len(batch)  # each E-update folds every kept row's reward into delta


def test_e_step_then_m_steps_train_and_checkpoint_their_counters(fresh):
    policy, batch = fresh
    algo = VPD({"m_steps_per_e_step": 1, "e_updates": 2, "beta": 0.5, "e_lr_scale": 0.5}, policy,
               optimizer=torch.optim.SGD(policy.model.parameters(), lr=0.1))
    start = weights(policy.model)
    first = algo.update(batch)
    assert first["phase_e"] == 1.0 and first["phase_m"] == 0.0 and first["e_steps"] == 1.0
    assert algo.optimizer.param_groups[0]["lr"] == 0.1  # the E-step's scaled lr is put back for the M-steps
    assert not same_weights(weights(policy.model), start)  # the E-step trained the shared network
    assert first["bco_chosen"] == 1.0 and first["bco_rejected"] == 3.0 and first["bco_loss"] < math.log(2)
    second = algo.update(batch)
    assert second["phase_m"] == 1.0 and math.isfinite(second["distill_loss"]) and second["kl"] > 0
    third = algo.update(batch)
    assert third["phase_e"] == 1.0 and third["e_steps"] == 2.0 and third["m_steps"] == 1.0
    state = json.loads(json.dumps(algo.extra_state()))  # checkpointable as plain data
    other = VPD({}, policy)
    other.load_extra_state(state)
    assert other.delta.mean == algo.delta.mean and other.delta.count == algo.delta.count
    assert other.phase == algo.phase


def test_m_step_kl_to_the_feedback_teacher_falls_on_a_fixed_batch(fresh):
    policy, batch = fresh
    algo = VPD({"schedule": "inner", "m_steps_per_e_step": 4}, policy,
               optimizer=torch.optim.SGD(policy.model.parameters(), lr=0.05))
    state = algo.prepare(batch)
    _, before = algo.loss(batch, state, Step("m"))
    metrics = algo.update(batch)  # one E-step, then four M-steps on the same batch
    assert metrics["phase_e"] == 1.0 and metrics["phase_m"] == 1.0
    assert metrics["e_steps"] == 1.0 and metrics["m_steps"] == 4.0
    assert all(math.isfinite(metrics[k]) for k in ("bco_loss", "distill_loss", "kl"))
    assert before["kl"] > 1e-4  # feedback in the prompt changes the network's distribution
    _, after = algo.loss(batch, algo.prepare(batch), Step("m"))
    assert after["kl"] < before["kl"]  # the student view moves towards the teacher view


def test_real_updates_run_an_e_step_first_and_after_every_m_m_steps(fresh):
    policy, batch = fresh
    algo = VPD({"m_steps_per_e_step": 3, "e_updates": 1}, policy,
               optimizer=torch.optim.SGD(policy.model.parameters(), lr=0.01))
    ran = []
    for _ in range(5):
        metrics = algo.update(batch)
        ran.append("E" if metrics["phase_e"] else "M")
    assert "".join(ran) == "EMMME" and algo.phase == Phase(e_steps=2, m_steps=3, m_since_e=0)
    assert repeat_tasks(["a", "b", "c", "d"], 2) == ["a", "a", "b", "b"]
    assert repeat_tasks(["a", "b", "c"], 2) == ["a", "a", "b"]


def test_one_sided_batches_train_unpaired_or_defer_the_e_step(fresh):
    policy, batch = fresh
    batch.episodes[0].success = False
    try:
        unpaired = VPD({}, policy, optimizer=torch.optim.SGD(policy.model.parameters(), lr=0.01)).update(batch)
        assert unpaired["phase_e"] == 1.0 and unpaired["bco_chosen"] == 0.0 and unpaired["bco_rejected"] == 4.0
        skipper = VPD({"one_sided": "skip"}, policy, optimizer=torch.optim.SGD(policy.model.parameters(), lr=0.01))
        deferred = skipper.update(batch)
        assert deferred["e_skipped"] == 1.0 and deferred["phase_m"] == 1.0 and deferred["phase_e"] == 0.0
        assert skipper.phase.e_due(skipper.config.m_steps_per_e_step)  # the E-step stays due
    finally:
        batch.episodes[0].success = True


@pytest.mark.slow
def test_cli_trains_vpd_and_logs_its_phases(tmp_path):
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "agentgym_opd.cli", "train", "--algo", "vpd", "--env", ENV, "--student", "tiny",
           "model.device=cpu", "train.steps=2", "train.lr=1e-3", "rollout.tasks_per_step=1", "rollout.max_turns=2",
           "rollout.max_new_tokens=6", "algo.m_steps_per_e_step=1", "--env-arg", "num_tasks=2",
           "--output-dir", str(out)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [(ln["phase_e"], ln["phase_m"]) for ln in lines] == [(1.0, 0.0), (0.0, 1.0)]
    assert math.isfinite(lines[0]["bco_loss"]) and math.isfinite(lines[1]["kl"])
    assert (out / "checkpoints" / "step_2" / "trainer_state.pt").is_file()
