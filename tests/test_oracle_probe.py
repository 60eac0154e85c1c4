"""The oracle probe: the observable expert's labels on the student's own sampled states, as training rows."""

from __future__ import annotations

import pytest

from agentgym_opd.policy.hf import HFPolicy
from agentgym_opd.policy.tiny import default_tiny_model
from agentgym_opd.registry import make
from evaluation.bench.base_training import action_spans
from probe_scripts import import_probe

oracle_examples = import_probe("oracle_probe").oracle_examples


@pytest.mark.slow
def test_first_labels_are_the_experts_one_action_at_the_students_state():
    """`first` keeps exactly the first action the expert takes after the student's turns (the same rows as
    `continuation`, whose later turns stay in the loss); `demonstration` is the expert's episode, all in the loss."""
    policy = HFPolicy.from_pretrained(default_tiny_model())
    env = make("household/train")
    tasks = env.task_ids()[:3]
    first = oracle_examples(policy, tasks, labels="first", cuts=2, env_args={})
    whole = oracle_examples(policy, tasks, labels="continuation", cuts=2, env_args={})
    assert 0 < len(first) <= len(whole) == 6  # the same sampled rollouts and cuts (seeded)
    decode = policy.tokenizer.decode
    whole_by_ids = {tuple(ids): mask for ids, mask in whole}
    for ids, mask in first:
        whole_mask = whole_by_ids[tuple(ids)]
        spans, whole_spans = action_spans(mask), action_spans(whole_mask)
        assert len(spans) == 1 and spans[0] == whole_spans[0]
        assert sum(mask[:spans[0][0]]) == 0  # the student's own turns before it: out of the loss
    demos = oracle_examples(policy, tasks, labels="demonstration", cuts=2, env_args={})
    assert len(demos) == 3
    for (ids, mask), task_id in zip(demos, tasks):
        said = [decode(ids[a:b], skip_special_tokens=True).strip() for a, b in action_spans(mask)]
        assert said == env.get_task(task_id).privileged["demonstration"]
    with pytest.raises(ValueError, match="labels must be one of"):
        oracle_examples(policy, tasks, labels="gold", cuts=1, env_args={})
