"""SFT and GRPO on the real tiny model and the embedded household env (CPU, a few steps each)."""

from __future__ import annotations

import pytest
import torch

import agentgym_opd
from agentgym_opd.algorithm import sequence_logprobs
from agentgym_opd.config import ConfigError, load_config
from agentgym_opd.policy.base import SamplingParams
from agentgym_opd.policy.hf import HFPolicy
from agentgym_opd.policy.tiny import default_tiny_model
from agentgym_opd.registry import algorithm_registry
from agentgym_opd.rollout import RolloutEngine
from agentgym_opd.trainer import DEFAULT_SYSTEM_PROMPT, Trainer
from algorithms.grpo import GRPO, GRPOConfig
from algorithms.sft import expert_batch
from tiny_rollouts import accept_any

ENV = "household/train"


def test_algorithms_are_registered_with_their_descriptions():
    assert {"sft", "grpo"} <= set(algorithm_registry.ids())
    assert algorithm_registry.spec("grpo").description.startswith("Group-relative policy optimisation")


@pytest.mark.parametrize("expert", ["observable", "walkthrough"])
def test_sft_expert_episode_has_the_rollout_token_view_of_the_expert(expert):
    policy = HFPolicy.from_pretrained(default_tiny_model())
    env = agentgym_opd.make(ENV, num_tasks=3, max_turns=40)
    engine = RolloutEngine(policy, SamplingParams(max_new_tokens=8), system_prompt=DEFAULT_SYSTEM_PROMPT)
    tasks = env.task_ids()[:2]
    batch = expert_batch(policy, env, tasks, engine_template=engine, expert=expert)
    eot = policy.tokenizer.convert_tokens_to_ids("<|im_end|>")
    for row, (task_id, ep) in enumerate(zip(tasks, batch.episodes)):
        privileged = env.get_task(task_id).privileged
        # the observable expert searches (it cannot see where the object lies); the walkthrough walks straight there
        actions = privileged["demonstration"] if expert == "observable" else privileged["walkthrough"]
        assert ep.success and [t.action for t in ep.turns] == actions
        for k, action in enumerate(actions):  # agent tokens of turn k: the action's ids plus end-of-turn
            got = [i for i, m, t in zip(ep.input_ids, ep.loss_mask, ep.turn_index) if m and t == k]
            assert got == policy.tokenizer.encode(action, add_special_tokens=False) + [eot]
        assert batch.loss_mask[row].sum() == sum(len(t.action_token_ids) for t in ep.turns)
        # the same bookkeeping as an on-policy rollout: the context decodes to the chat of the history
        text = policy.tokenizer.decode(ep.input_ids)
        assert text.count("<|im_start|>assistant") == len(actions) and DEFAULT_SYSTEM_PROMPT in text
    if expert == "observable":
        assert any(len(ep.turns) > len(env.get_task(t).privileged["walkthrough"]) for t, ep in zip(tasks, batch.episodes))


def test_sft_with_context_clones_the_walkthrough_the_context_spells_out():
    policy = HFPolicy.from_pretrained(default_tiny_model())
    env = agentgym_opd.make(ENV, num_tasks=2, max_turns=40)
    engine = RolloutEngine(policy, SamplingParams(max_new_tokens=8), system_prompt=DEFAULT_SYSTEM_PROMPT)
    batch = expert_batch(policy, env, env.task_ids(), engine_template=engine, context_fraction=1.0)
    for task_id, ep in zip(env.task_ids(), batch.episodes):
        assert "Actions that solve this task" in policy.tokenizer.decode(ep.input_ids)
        assert [t.action for t in ep.turns] == env.get_task(task_id).privileged["walkthrough"]


@pytest.mark.slow
def test_sft_raises_walkthrough_likelihood_and_success_on_training_tasks(tmp_path):
    """Measured (seed 0, 2 training tasks, lr 3e-3, 80 steps): greedy success 0/2 -> 2/2, NLL 6.6 -> <0.01."""
    config = load_config(None, ["algorithm=sft", f"env={ENV}", "model.student=tiny", "model.device=cpu",
                                "train.steps=80", "train.lr=3e-3", "rollout.tasks_per_step=2", "rollout.max_turns=8",
                                "algo.expert=walkthrough",
                                "rollout.max_new_tokens=16", "eval.episodes=2", f"output_dir={tmp_path}"])
    trainer = Trainer(config, env_overrides={"num_tasks": 2}, progress=False)
    before = trainer.evaluate()["success"]
    first = trainer.train_step()
    last = trainer.train()
    after = trainer.evaluate()["success"]
    assert before == 0.0
    assert last["expert_logprob_per_episode"] > first["expert_logprob_per_episode"] + 50
    assert last["nll"] < 0.1 * first["nll"]
    assert after >= 0.5


@pytest.fixture(scope="module")
def grpo_setup():
    """One real group of two rollouts of one household task by the untrained tiny model."""
    torch.manual_seed(0)
    policy = HFPolicy.from_pretrained(default_tiny_model())
    engine = RolloutEngine(policy, SamplingParams(max_new_tokens=8), action_parser=accept_any)
    env_ids = agentgym_opd.make(ENV).task_ids()[:1]
    batch = engine.collect(ENV, env_ids, group_size=2, seed=3, max_turns=2)
    return policy, batch


def _sequence_logprob(policy, batch):
    with torch.no_grad():
        logp, mask = sequence_logprobs(policy.model, batch, slice(0, len(batch)))
    return (logp * mask).sum(dim=1)


@pytest.mark.slow
def test_grpo_update_moves_the_policy_towards_the_rewarded_rollout(grpo_setup):
    policy, batch = grpo_setup
    batch.rewards = torch.tensor([1.0, 0.0])  # rollout 0 "succeeded": positive advantage, rollout 1 negative
    before = _sequence_logprob(policy, batch)
    state = {k: v.clone() for k, v in policy.model.state_dict().items()}
    try:
        algo = GRPO(GRPOConfig(), policy, optimizer=torch.optim.SGD(policy.model.parameters(), lr=0.05), grad_clip=None)
        metrics = algo.update(batch)
        after = _sequence_logprob(policy, batch)
    finally:
        policy.model.load_state_dict(state)
    assert abs(metrics["mean_ratio"] - 1.0) < 1e-3  # behaviour log-probs are the student's own: on-policy
    assert metrics["clip_fraction"] == 0.0 and metrics["zero_advantage_fraction"] == 0.0
    assert after[0] > before[0] + 0.1
    assert after[1] < before[1] - 0.1


def test_grpo_equal_rewards_give_no_gradient(grpo_setup):
    policy, batch = grpo_setup
    batch.rewards = torch.tensor([0.0, 0.0])
    state = {k: v.clone() for k, v in policy.model.state_dict().items()}
    algo = GRPO(GRPOConfig(), policy, optimizer=torch.optim.SGD(policy.model.parameters(), lr=0.05))
    metrics = algo.update(batch)
    assert metrics["zero_advantage_fraction"] == 1.0
    for name, value in policy.model.state_dict().items():
        torch.testing.assert_close(value, state[name], atol=0, rtol=0)


def test_grpo_k3_kl_to_a_frozen_copy_starts_at_zero_and_grows(grpo_setup):
    policy, batch = grpo_setup
    batch.rewards = torch.tensor([1.0, 0.0])
    state = {k: v.clone() for k, v in policy.model.state_dict().items()}
    try:
        algo = GRPO(GRPOConfig(kl_coef=0.05), policy, optimizer=torch.optim.SGD(policy.model.parameters(), lr=0.05))
        first = algo.update(batch)
        second = algo.update(batch)
    finally:
        policy.model.load_state_dict(state)
    assert first["kl"] < 1e-6 and second["kl"] > first["kl"]
    with pytest.raises(ValueError, match="LoRA"):
        GRPO(GRPOConfig(kl_coef=0.1, reference="adapter_off"), policy)


def test_grpo_config_errors_name_the_key():
    with pytest.raises(ConfigError, match="algo.eps_lo"):
        GRPO({"eps_lo": 0.1}, HFPolicy.from_pretrained(default_tiny_model()))
    config = load_config(None, ["algorithm=grpo", f"env={ENV}", "model.student=tiny", "rollout.group_size=1"])
    with pytest.raises(ValueError, match="group_size >= 2"):
        Trainer(config, progress=False)
