"""Episode traces: real tiny-model rollouts, traced with the divergence the method's own loss computes."""

from __future__ import annotations

import pytest
import torch

from agentgym_opd.policy.hf import HFPolicy
from agentgym_opd.policy.tiny import default_tiny_model
from algorithms.grpo import GRPO
from algorithms.opd import OPD
from algorithms.sage_opd import SAGEOPD
from evaluation.episode_trace import MAX_EPISODES, capture_traces, check_episodes, clip_text
from evaluation.records import RecordError, validate_record
from test_leaderboard import make_record
from tiny_rollouts import tiny_household_rollout


@pytest.fixture(scope="module")
def setup():
    torch.set_num_threads(1)
    student, batch = tiny_household_rollout(seed=3, max_turns=3, max_new_tokens=6)
    teacher = HFPolicy.from_pretrained(default_tiny_model())
    torch.manual_seed(1)
    with torch.no_grad():  # moved weights: a teacher that disagrees with the student
        for p in teacher.model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return student, teacher, batch


def masked_values(values, batch, rows, mask, row, turn):
    turn_of = batch.turn_index[rows][:, 1: mask.shape[1] + 1]
    on = (mask[row] > 0) & (turn_of[row] == turn)
    return values[row][on].tolist()


def test_opd_trace_holds_the_losss_per_token_divergence_turn_by_turn(setup):
    student, teacher, batch = setup
    algo = OPD({}, student, teacher)
    traces = capture_traces(algo, batch, limit=2)
    rows = slice(0, 2)
    with torch.no_grad():
        per_token, mask, *_ = algo.distillation_terms(batch, rows, algo.prepare(batch))
    assert len(traces) == 2 and check_episodes(traces) is None
    for r, trace in enumerate(traces):
        episode = batch.episodes[r]
        assert trace["task_id"] == episode.task.id and len(trace["turns"]) == episode.num_turns
        for k, turn in enumerate(trace["turns"]):
            assert turn["action"] == episode.turns[k].action
            assert turn["error_kind"] == (episode.turns[k].error.kind if episode.turns[k].error else None)
            expected = masked_values(per_token, batch, rows, mask, r, k)
            assert len(turn["tokens"]) == len(episode.turns[k].action_token_ids) == len(expected) > 0
            assert turn["divergence"] == pytest.approx(expected, abs=1e-5)
            assert turn["turn_weight"] is None and turn["turn_label"] is None
        assert trace["signal"] == "reverse_kl"
    assert any(d > 0.01 for t in traces for turn in t["turns"] for d in turn["divergence"])  # teacher differs
    # the teacher's most likely token at each agent position, from the same teacher logits the loss used
    with torch.no_grad():
        _, _, _, teacher_logits, _ = algo.distillation_terms(batch, rows, algo.prepare(batch))
    top = teacher_logits[0, : mask.shape[1]].argmax(-1)
    first_turn = [int(t) for t, on, k in zip(top.tolist(), mask[0].tolist(), batch.turn_index[0, 1:].tolist())
                  if on > 0 and k == 0]
    assert traces[0]["turns"][0]["teacher_top"] == [student.tokenizer.decode([t]) for t in first_turn]
    assert all(len(turn["teacher_top"]) == len(turn["tokens"]) for t in traces for turn in t["turns"])
    assert traces[0]["first_prompt"] == clip_text(batch.episodes[0].initial_observation)
    validate_record(make_record(episodes=traces))  # a record holds them as they are


def test_sage_opd_trace_carries_its_turn_labels_and_weights(setup):
    student, teacher, batch = setup
    algo = SAGEOPD({"judge": "errors_only", "default_label": "weak", "alpha": 0.5}, student, teacher)
    traces = capture_traces(algo, batch, limit=2)
    rows = slice(0, 2)
    with torch.no_grad():
        state = algo.prepare(batch)
        _, mask, _, teacher_logits, _ = algo.distillation_terms(batch, rows, state)
        weights = state.weights[rows][:, : mask.shape[1]] * mask
    for r, trace in enumerate(traces):
        for k, turn in enumerate(trace["turns"]):
            error = batch.episodes[r].turns[k].error
            assert turn["turn_label"] == ("strong" if error is not None else "weak")
            assert turn["turn_weight"] == pytest.approx(masked_values(weights, batch, rows, mask, r, k)[0], abs=1e-5)
            assert 0 < turn["turn_weight"] <= 1


def test_methods_without_a_teacher_trace_tokens_only(setup):
    student, _, batch = setup
    traces = capture_traces(GRPO({}, student), batch, limit=1)
    turn = traces[0]["turns"][0]
    assert turn["tokens"] and turn["divergence"] is None and traces[0]["signal"] is None


def test_traces_are_bounded_by_the_schema():
    turn = {"action": "go", "observation": "ok", "error_kind": None, "error_message": None, "tokens": ["go"],
            "divergence": [0.5], "turn_weight": None, "turn_label": None}
    episode = {"task_id": "t", "success": False, "score": 0.0, "signal": "reverse_kl", "turns": [turn]}
    validate_record(make_record(episodes=[episode]))
    cases = [
        ([episode] * (MAX_EPISODES + 1), "at most 8"),
        ([{**episode, "turns": [{**turn, "divergence": [0.5, 0.1]}]}], "one number"),
        ([{**episode, "turns": [{**turn, "divergence": [-1.0]}]}], "one number"),
        ([{**episode, "turns": [{**turn, "error_kind": "hacked"}]}], "error_kind"),
        ([{**episode, "turns": [{**turn, "observation": "x" * 5000}]}], "at most 2000"),
        ([{**episode, "turns": [{**turn, "turn_label": "maybe"}]}], "turn_label"),
        ([{**episode, "extra": 1}], "exactly the keys"),
    ]
    for episodes, message in cases:
        with pytest.raises(RecordError, match=message):
            validate_record(make_record(episodes=episodes))
    assert len(clip_text("y" * 5000)) == 2000 and clip_text("y" * 5000).endswith("more characters]")
