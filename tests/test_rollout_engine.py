"""The KV-reusing rollout engine against today's (frozen under benchmarks/), and its per-row seed contract."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

import agentgym_opd
from agentgym_opd.policy.base import SamplingParams
from agentgym_opd.policy.hf import HFPolicy
from agentgym_opd.policy.tiny import default_tiny_model
from agentgym_opd.rollout import RolloutEngine

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from _baseline_engine import BaselinePolicy, BaselineRolloutEngine  # noqa: E402

ENV = "household/valid_unseen"


def first_line(text: str, finish_reason: str):
    """Accept whatever the untrained model says, so every turn reaches the env and the env judges it."""
    return next((ln.strip() for ln in text.splitlines() if ln.strip()), "look"), None


@pytest.fixture(scope="module")
def policy():
    return HFPolicy.from_pretrained(default_tiny_model())


def _collect(engine, n: int, seed: int, max_turns: int = 4):
    envs = [agentgym_opd.make(ENV, max_turns=max_turns) for _ in range(n)]
    tasks = envs[0].task_ids()[:n]
    return engine.collect(envs, tasks, seed=seed)


@pytest.mark.slow
def test_greedy_plays_the_same_actions_as_todays_engine(policy):
    """Same household episodes, greedy: same actions, same token ids, behaviour log-probs within 1e-4."""
    sampling = SamplingParams(max_new_tokens=10, temperature=0.0)
    kwargs = dict(max_context_tokens=4096, system_prompt="Act in the house.", action_parser=first_line)
    new = _collect(RolloutEngine(policy, sampling, **kwargs), 6, seed=3)
    old = _collect(BaselineRolloutEngine(BaselinePolicy(policy), sampling, **kwargs), 6, seed=3)
    assert sum(ep.num_turns for ep in new.episodes) >= 12
    for a, b in zip(new.episodes, old.episodes):
        assert [t.action for t in a.turns] == [t.action for t in b.turns]
        assert a.input_ids == b.input_ids
    assert torch.equal(new.loss_mask, old.loss_mask)
    torch.testing.assert_close(new.behaviour_logprobs, old.behaviour_logprobs, atol=1e-4, rtol=0)


@pytest.mark.slow
def test_a_seed_gives_the_same_tokens_whatever_else_is_in_the_batch(policy):
    """Rollout k of collect(seed=s) uses seed s + k: played alone (seed s + k, one env) it samples the same."""
    engine = RolloutEngine(policy, SamplingParams(max_new_tokens=12, temperature=1.0), action_parser=first_line)
    envs = [agentgym_opd.make(ENV, max_turns=3) for _ in range(5)]
    tasks = envs[0].task_ids()[:5]
    batch = engine.collect(envs, tasks, seed=10)
    for k in (0, 3):
        alone = engine.collect([agentgym_opd.make(ENV, max_turns=3)], [tasks[k]], seed=10 + k)
        assert alone.episodes[0].input_ids == batch.episodes[k].input_ids
    other = engine.collect([agentgym_opd.make(ENV, max_turns=3)], [tasks[0]], seed=99)
    assert other.episodes[0].input_ids != batch.episodes[0].input_ids


@pytest.mark.slow
def test_teacher_rescoring_sees_exactly_the_sampled_ids(policy):
    """The batch's ids at agent positions are the sampled ids, and scoring them reproduces their log-probs."""
    engine = RolloutEngine(policy, SamplingParams(max_new_tokens=8, temperature=1.0), action_parser=first_line)
    batch = _collect(engine, 3, seed=1, max_turns=3)
    for row, ep in enumerate(batch.episodes):
        sampled = [tok for t in ep.turns for tok in t.action_token_ids]
        agent = [tok for tok, m in zip(ep.input_ids, ep.loss_mask) if m]
        assert agent == sampled
        scores = policy.score([ep.input_ids[:1]], [ep.input_ids[1:]])[0].logprobs
        mask = torch.tensor(ep.loss_mask[1:], dtype=torch.bool)
        torch.testing.assert_close(scores[mask], batch.behaviour_logprobs[row, 1:len(ep.input_ids)][mask],
                                   atol=1e-4, rtol=0)


@pytest.mark.slow
def test_session_continuation_equals_encoding_the_whole_sequence(policy):
    """A session row that grew over calls (holes from padding and dropped tokens) samples like a fresh prompt."""
    tok = policy.tokenizer
    prompts = [policy.apply_chat_template([{"role": "user", "content": text}])
               for text in ("go to fridge 1", "open the drawer 2 and look inside it carefully")]
    params = SamplingParams(max_new_tokens=6, temperature=1.0, stop=["e"])  # stop strings cut mid-call
    session = policy.session()
    first = session.generate([0, 1], prompts, params, seeds=[5, 6])
    grown = [p + g.token_ids + tok.encode("<|im_end|>\n<|im_start|>user\nok<|im_end|>\n<|im_start|>assistant\n",
                                          add_special_tokens=False) for p, g in zip(prompts, first)]
    later = session.generate([0, 1], grown, SamplingParams(max_new_tokens=12, temperature=1.0), seeds=[7, 8])
    fresh = policy.generate(grown, SamplingParams(max_new_tokens=12, temperature=1.0), seeds=[7, 8])
    for a, b in zip(later, fresh):
        assert a.token_ids == b.token_ids
        torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-5, rtol=0)
    session.release([0])
    again = session.generate([1], [grown[1] + later[1].token_ids + [5]], params, seeds=[9])
    assert again[0].token_ids == policy.generate([grown[1] + later[1].token_ids + [5]], params, seeds=[9])[0].token_ids
    with pytest.raises(ValueError, match="does not extend"):
        session.generate([1], [prompts[0]], params)


@pytest.mark.slow
def test_engine_plays_the_same_episodes_over_the_ray_executors_envs(policy):
    """The policy samples here while the envs step in Ray actors: the same episodes as with local envs."""
    ray = pytest.importorskip("ray")
    from agentgym_opd.executors import make_vector_env

    engine = RolloutEngine(policy, SamplingParams(max_new_tokens=8, temperature=1.0), action_parser=first_line)
    tasks = agentgym_opd.make(ENV).task_ids()[:2]
    if not ray.is_initialized():
        ray.init(num_cpus=2, include_dashboard=False)
    remote = make_vector_env(ENV, 2, executor="ray", actor_options={"num_cpus": 0.5}, max_turns=3)
    try:
        over_ray = engine.collect(remote, tasks, seed=7)
    finally:
        remote.close()
    local = engine.collect([agentgym_opd.make(ENV, max_turns=3) for _ in tasks], tasks, seed=7)
    assert [ep.num_turns for ep in over_ray.episodes] == [ep.num_turns for ep in local.episodes] == [3, 3]
    for a, b in zip(over_ray.episodes, local.episodes):
        assert a.input_ids == b.input_ids
        assert [t.observation for t in a.turns] == [t.observation for t in b.turns]
        assert a.metadata["max_turns"] == 3


def test_a_row_joining_a_running_session_samples_like_a_fresh_prompt(policy):
    """A key the session has not seen gets zero-filled cache rows next to the running ones."""
    prompts = [policy.apply_chat_template([{"role": "user", "content": text}]) for text in ("look", "open fridge 1")]
    params = SamplingParams(max_new_tokens=6, temperature=1.0)
    session = policy.session()
    first = session.generate([0], prompts[:1], params, seeds=[1])[0]
    joined = session.generate([0, 1], [prompts[0] + first.token_ids + [5], prompts[1]], params, seeds=[2, 3])
    fresh = policy.generate([prompts[0] + first.token_ids + [5], prompts[1]], params, seeds=[2, 3])
    assert [g.token_ids for g in joined] == [g.token_ids for g in fresh]


def test_scripted_walkthrough_plays_through_the_engine_and_episodes_are_heard_as_they_end(policy):
    """The expert walkthrough is a policy like any other: every episode succeeds, its tokens are the student's
    tokenisation of the expert's actions, and `on_episode` hears short episodes before long ones."""
    from agentgym_opd.policy.scripted import ScriptedPolicy, WalkthroughAgent

    envs = [agentgym_opd.make(ENV) for _ in range(6)]
    tasks = envs[0].task_ids()[:6]
    heard: list[tuple[int, int]] = []
    engine = RolloutEngine(ScriptedPolicy(WalkthroughAgent(fallback=None), like=policy), SamplingParams(max_new_tokens=32))
    batch = engine.collect(envs, tasks, seed=0, on_episode=lambda k, ep: heard.append((k, ep.num_turns)))
    assert all(e.success for e in batch.episodes)
    walkthroughs = [envs[0].get_task(t).privileged["walkthrough"] for t in tasks]
    assert [e.num_turns for e in batch.episodes] == [len(w) for w in walkthroughs]
    assert sorted(heard) == [(k, len(w)) for k, w in enumerate(walkthroughs)]
    assert [n for _, n in heard] == sorted(n for _, n in heard), "an episode is heard when it ends"
    assert len({n for _, n in heard}) > 1, "the check needs episodes of different lengths"
    for episode, walkthrough in zip(batch.episodes, walkthroughs):
        eot = ScriptedPolicy(WalkthroughAgent(), like=policy).end_of_turn
        assert [t.action_token_ids for t in episode.turns] == [
            policy.tokenizer.encode(a, add_special_tokens=False) + eot for a in walkthrough]


@pytest.mark.slow
def test_fewer_slots_than_rollouts_plays_the_same_episodes_with_slots_refilled(policy):
    """Continuous batching: 5 rollouts on 2 slots give exactly the episodes of 5 slots; each ending frees its
    slot for the next waiting rollout, and the session never holds more rows than there are slots."""
    from agentgym_opd.vector import VectorTextEnv

    sampling = SamplingParams(max_new_tokens=6, temperature=1.0)
    engine = RolloutEngine(policy, sampling, action_parser=first_line)
    tasks = agentgym_opd.make(ENV).task_ids()[:5]
    wide = engine.collect(VectorTextEnv.make(ENV, 5, max_turns=3), tasks, seed=4)
    heard: list[int] = []
    narrow_vec = VectorTextEnv.make(ENV, 2, max_turns=3)
    narrow = engine.collect(narrow_vec, tasks, seed=4, on_episode=lambda k, ep: heard.append(k))
    assert sorted(heard) == list(range(5))
    for a, b in zip(wide.episodes, narrow.episodes):
        assert a.task.id == b.task.id and [t.action_token_ids for t in a.turns] == [t.action_token_ids for t in b.turns]
        assert [t.observation for t in a.turns] == [t.observation for t in b.turns]
    assert torch.equal(wide.input_ids, narrow.input_ids) and torch.equal(wide.loss_mask, narrow.loss_mask)
