"""Rollout engine on real multi-turn episodes of the embedded household env with the tiny model."""

from __future__ import annotations

import pytest
import torch

import agentgym_opd
from agentgym_opd.action_parsing import parse_json_action, parse_text_action
from agentgym_opd.policy.base import SamplingParams
from agentgym_opd.policy.hf import HFPolicy
from agentgym_opd.policy.tiny import default_tiny_model
from agentgym_opd.rollout import RolloutEngine

ENV = "household/train"


def any_text(text: str, finish_reason: str):
    """Accept whatever the (untrained) model says, so every turn reaches the env and the env judges it."""
    line = next((ln.strip() for ln in text.splitlines() if ln.strip()), "look")
    return line, None


@pytest.fixture(scope="module")
def policy():
    return HFPolicy.from_pretrained(default_tiny_model())


@pytest.fixture(scope="module")
def batch(policy):
    engine = RolloutEngine(policy, SamplingParams(max_new_tokens=12, seed=0), max_context_tokens=4096,
                           system_prompt="Act in the house. One action per turn.", action_parser=any_text)
    return engine.collect(ENV, reset_seeds=[0, 1, 2], group_size=2, seed=5, max_turns=4)


def test_real_multi_turn_episodes(batch):
    assert len(batch) == 6
    for ep in batch.episodes:
        assert ep.task.env_id == ENV
        assert ep.num_turns == 4 and ep.turns[-1].truncated  # untrained model never solves it: turn limit
        assert all(t.action_token_ids and len(t.action_token_ids) == len(t.logprobs) for t in ep.turns)
        assert all(isinstance(t.prompt, list) and t.prompt[-1]["role"] == "user" for t in ep.turns)
        assert ep.turns[1].prompt[-1]["content"] == ep.turns[0].observation
    assert batch.group_ids.tolist() == [0, 0, 1, 1, 2, 2]
    assert batch.episodes[0].task.id == batch.episodes[1].task.id


def test_student_score_reproduces_behaviour_logprobs_token_for_token(policy, batch):
    """Teacher re-scoring alignment: score the whole episode sequence once; agent tokens must match."""
    for row, ep in enumerate(batch.episodes):
        ids = ep.input_ids
        scores = policy.score([ids[:1]], [ids[1:]])[0].logprobs  # logprob of token i+1 given ids[:i+1]
        mask = torch.tensor(ep.loss_mask[1:], dtype=torch.bool)
        behaviour = batch.behaviour_logprobs[row, 1: len(ids)][mask]
        torch.testing.assert_close(scores[mask], behaviour, atol=1e-4, rtol=0)
        flat = [lp for t in ep.turns for lp in t.logprobs]
        torch.testing.assert_close(behaviour, torch.tensor(flat), atol=0, rtol=0)


def test_loss_mask_and_turn_index(policy, batch):
    tok = policy.tokenizer
    for row, ep in enumerate(batch.episodes):
        L = len(ep.input_ids)
        assert len(ep.loss_mask) == len(ep.turn_index) == L
        assert batch.attention_mask[row].sum() == L and batch.loss_mask[row, L:].sum() == 0
        for k, turn in enumerate(ep.turns):  # agent tokens of turn k are exactly its sampled ids, in order
            got = [i for i, m, t in zip(ep.input_ids, ep.loss_mask, ep.turn_index) if m and t == k]
            assert got == turn.action_token_ids
        assert all((m == 1) == (t >= 0) for m, t in zip(ep.loss_mask, ep.turn_index))
        context_text = tok.decode([i for i, m in zip(ep.input_ids, ep.loss_mask) if not m])
        assert ep.initial_observation[:40] in context_text and ep.turns[0].observation[:30] in context_text
        assert context_text.count("<|im_start|>assistant") == ep.num_turns
    assert batch.num_agent_tokens == sum(len(t.action_token_ids) for e in batch.episodes for t in e.turns)


def test_incremental_sequence_decodes_to_the_chat_template_of_the_history(policy, batch):
    """The incrementally built ids render the same conversation the chat template would."""
    tok = policy.tokenizer
    for ep in batch.episodes:
        messages = [dict(m) for m in ep.turns[-1].prompt]
        messages.append({"role": "assistant", "content": tok.decode(ep.turns[-1].action_token_ids)})
        expected = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=False)
        assert tok.decode(ep.input_ids) == expected


@pytest.mark.slow
def test_same_seed_same_tokens_other_seed_differs(policy, batch):
    engine = RolloutEngine(policy, SamplingParams(max_new_tokens=12, seed=0), max_context_tokens=4096,
                           system_prompt="Act in the house. One action per turn.", action_parser=any_text)
    again = engine.collect(ENV, reset_seeds=[0, 1, 2], group_size=2, seed=5, max_turns=4)
    assert [e.input_ids for e in again.episodes] == [e.input_ids for e in batch.episodes]
    assert torch.equal(again.behaviour_logprobs, batch.behaviour_logprobs)
    # rollout k uses seed 5 + k regardless of batch: run rollout 3 alone (task of seed 1, member 1)
    single = engine.collect(ENV, reset_seeds=[1], seed=8, max_turns=4)
    assert single.episodes[0].input_ids == batch.episodes[3].input_ids
    assert batch.episodes[0].input_ids != batch.episodes[1].input_ids  # group members differ


def test_malformed_outputs_become_step_errors_not_exceptions(policy):
    engine = RolloutEngine(policy, SamplingParams(max_new_tokens=4, seed=0))  # always cut off -> over-long
    b = engine.collect(ENV, tasks=[agentgym_opd.make(ENV).task_ids()[0]], max_turns=3)
    ep = b.episodes[0]
    assert ep.num_turns == 3 and ep.turns[-1].truncated
    assert all(t.error is not None and t.error.kind == "parse_error" for t in ep.turns)
    assert "token limit" in ep.turns[0].observation
    assert parse_text_action("   \n ", "stop")[1].kind == "parse_error"  # no action
    assert parse_text_action("I think.\nAction: open fridge 1", "stop") == ("open fridge 1", None)
    assert parse_json_action('{"name": "search", "arguments": {"q": 1}', "stop")[1].kind == "parse_error"
    assert parse_json_action('<tool_call>{"name": "f"', "stop")[1].message.startswith("Unterminated tool call")
    assert parse_json_action('<tool_call>{"name": "f", "arguments": {}}', "stop")[0] == '{"name": "f", "arguments": {}}'
    assert parse_json_action('{"name": "f", "arguments": {}}', "stop") == ('{"name": "f", "arguments": {}}', None)


def test_env_reported_errors_recorded(batch):
    errors = [t.error for e in batch.episodes for t in e.turns if t.error is not None]
    assert errors and all(err.kind in ("invalid_action", "parse_error") for err in errors)


def test_context_budget_ends_episode_as_truncated(policy):
    engine = RolloutEngine(policy, SamplingParams(max_new_tokens=8, seed=0), max_context_tokens=260,
                           action_parser=any_text)
    ep = engine.collect(ENV, reset_seeds=[0], max_turns=30).episodes[0]
    assert ep.metadata["context_truncated"] and ep.turns[-1].truncated and ep.num_turns < 30
    assert len(ep.input_ids) <= 260


def test_misuse_raises(policy):
    engine = RolloutEngine(policy, SamplingParams(max_new_tokens=4))
    with pytest.raises(ValueError, match="exactly one"):
        engine.collect(ENV)
    with pytest.raises(ValueError, match="needs 4 envs"):
        engine.collect([agentgym_opd.make(ENV)], reset_seeds=[0, 1], group_size=2)


def test_turn_limit_counts_parse_error_turns_too(policy):
    """A mix of env-stepped and malformed turns still ends at max_turns."""
    calls = {"n": 0}

    def alternate(text, finish_reason):
        calls["n"] += 1
        return parse_text_action("", "stop") if calls["n"] % 2 else ("look", None)

    engine = RolloutEngine(policy, SamplingParams(max_new_tokens=3, seed=0), action_parser=alternate)
    ep = engine.collect(ENV, reset_seeds=[0], max_turns=3).episodes[0]
    assert ep.num_turns == 3 and ep.turns[-1].truncated
    assert [t.error.kind if t.error else None for t in ep.turns] == ["parse_error", None, "parse_error"]


def test_tooluse_json_env_episode_records_errors_and_aligns(policy):
    engine = RolloutEngine(policy, SamplingParams(max_new_tokens=6, seed=1), action_parser="json")
    b = engine.collect("tooluse/train", reset_seeds=[0, 1], max_turns=2)
    for ep in b.episodes:
        assert ep.num_turns == 2 and all(t.error is not None for t in ep.turns)  # untrained model: no valid call
        got = [i for i, m in zip(ep.input_ids, ep.loss_mask) if m]
        assert got == [i for t in ep.turns for i in t.action_token_ids]
