"""The household base models: what they learn from, and a build that is deterministic and cached."""

from __future__ import annotations

import dataclasses
import json
import random

import pytest

from agentgym_opd.distill import CONTEXT_HEADER, privileged_text
from agentgym_opd.registry import make
from evaluation.bench.base_data import choose_kind, context_plan, with_mistakes
from evaluation.bench.base_models import STUDENT_SPEC, TEACHER_SPEC, BaseModelSpec, build_base_model, ensure_base_model
from evaluation.bench.base_training import learning_rate

MINI = BaseModelSpec("mini", hidden=16, layers=1, heads=2, steps=2, batch_size=2, warmup_steps=1, train_tasks=6,
                     context_share=0.5, max_turns=40)


def test_the_teacher_is_larger_and_trained_longer_than_the_student():
    assert TEACHER_SPEC.hidden * TEACHER_SPEC.layers > STUDENT_SPEC.hidden * STUDENT_SPEC.layers
    assert TEACHER_SPEC.steps > STUDENT_SPEC.steps
    assert STUDENT_SPEC.key() != dataclasses.replace(STUDENT_SPEC, lr=1e-3).key()  # every setting is in the key


def test_plain_episodes_follow_the_observable_expert_and_context_episodes_use_their_context():
    env = make("household/train", num_tasks=12, max_turns=40)
    task = env.get_task(env.task_ids()[4])
    rng = random.Random(0)
    context, actions = context_plan(task, "none", env, rng)
    assert context is None and actions == task.privileged["demonstration"]
    context, actions = context_plan(task, "walkthrough", env, rng)
    assert context == privileged_text(task) and actions == task.privileged["walkthrough"]
    context, actions = context_plan(task, "sibling", env, rng)
    assert context.startswith(CONTEXT_HEADER) and "A successful attempt at this task." in context
    assert actions == task.privileged["demonstration"]
    context, actions = context_plan(task, "feedback", env, rng)
    assert "Feedback on your previous attempt: Task not completed" in context
    with pytest.raises(ValueError, match="unknown context kind"):
        context_plan(task, "gossip", env, rng)
    kinds = [choose_kind(random.Random(i), 0.35) for i in range(400)]
    assert 0.25 < 1 - kinds.count("none") / 400 < 0.45 and {"walkthrough", "sibling", "feedback"} <= set(kinds)


def test_settings_added_later_change_the_key_only_when_set():
    """A cached model keeps its key when a later field is left unset; setting it always makes a new key."""
    # an earlier bench student (850 steps)
    older = dataclasses.replace(STUDENT_SPEC, steps=850, context_weights=None, schedule_steps=None)
    plain = dataclasses.asdict(older)
    assert "mistake_share" in plain and "context_weights" in plain
    keys = {older.key(), dataclasses.replace(older, mistake_share=0.5).key(),
            dataclasses.replace(older, context_weights=(0.8, 0.1, 0.1)).key()}
    assert len(keys) == 3
    assert older.key() == "b3cbf30e04"  # its cache key from before both fields existed
    annealed = dataclasses.replace(STUDENT_SPEC, steps=1200, schedule_steps=None)  # the bench's student before this one
    assert annealed.key() == "58398ef161"  # its cache key from before schedule_steps existed
    assert STUDENT_SPEC.key() == "a25d7777da"  # the bench's student since 2026-12-05
    kinds = [choose_kind(random.Random(i), 1.0, (1.0, 0.0, 0.0)) for i in range(50)]
    assert set(kinds) == {"walkthrough"}


def test_a_longer_schedule_stops_the_build_before_the_learning_rate_decays():
    """``schedule_steps`` sets the cosine's length: the build stops partway, its learning rate still high."""
    spec = BaseModelSpec("s", hidden=8, layers=1, heads=1, steps=1000, lr=1.0, warmup_steps=0)
    halfway = dataclasses.replace(spec, schedule_steps=2000)
    assert learning_rate(999, spec) == pytest.approx(0.1, abs=1e-4)  # annealed to a tenth of the peak
    assert learning_rate(999, halfway) == pytest.approx(0.55, abs=1e-3)  # half the cosine: 0.1 + 0.9 / 2
    assert learning_rate(0, halfway) == learning_rate(0, spec) == 1.0
    assert halfway.key() != spec.key()


def test_mistakes_are_rejected_by_the_env_and_masked_out_of_the_loss():
    env = make("household/train", num_tasks=30, max_turns=40)
    rng = random.Random(3)
    seen_mistake = False
    for task_id in env.task_ids():
        task = env.get_task(task_id)
        demo = list(task.privileged["demonstration"])
        actions, mistakes = with_mistakes(env, task, demo, rng, max_turns=40)
        assert len(actions) <= 40 and [a for i, a in enumerate(actions) if i not in mistakes] == demo
        env.reset(options={"task_id": task_id})
        for i, action in enumerate(actions):
            _, _, terminated, _, info = env.step(action)
            assert (info.get("error") is not None) == (i in mistakes), (task_id, i, action)
        assert terminated  # the expert still solves the task after every mistake
        seen_mistake |= bool(mistakes)
    assert seen_mistake

    from agentgym_opd.policy.scripted import TemplateTokens
    from evaluation.bench.base_data import training_examples

    spec = dataclasses.replace(MINI, train_tasks=8, context_share=0.0, mistake_share=1.0)
    plain = dataclasses.replace(spec, mistake_share=0.0)
    tokens = TemplateTokens.tiny()
    with_them, without = training_examples(tokens, spec), training_examples(tokens, plain)
    assert any(len(a[0]) > len(b[0]) for a, b in zip(with_them, without))  # longer histories: the mistakes
    for (ids, mask), (plain_ids, plain_mask) in zip(with_them, without):
        trained = [tokens.tokenizer.decode([t for t, m in zip(ids, mask) if m])]
        assert trained == [tokens.tokenizer.decode([t for t, m in zip(plain_ids, plain_mask) if m])]


@pytest.mark.slow
def test_student_histories_are_masked_and_the_expert_takes_over_where_the_student_left(tmp_path, monkeypatch):
    """history_share: the episode opens with a student's own sampled turns (masked out of the loss) and goes on
    with the observable expert's continuation from that state, which solves the task."""
    from agentgym_opd.policy.scripted import TemplateTokens
    from evaluation.bench.base_data import after_student, training_examples

    env = make("household/train", num_tasks=20, max_turns=40)
    rng = random.Random(5)
    for task_id in env.task_ids():
        task = env.get_task(task_id)
        env.reset(options={"task_id": task_id})
        student = []  # a student that wanders: admissible commands, typos and invented names
        for _ in range(rng.randrange(1, 15)):
            student.append(rng.choice([rng.choice(sorted(env.world.admissible())), "take cup 9 from shelf 7", "go tto desk 1"]))
            env.step(student[-1])
        task_id_out, context, actions, masked = after_student(env, task, student, rng, max_turns=40)
        assert task_id_out == task_id and context is None
        k = len(masked)
        assert masked == set(range(k)) and actions[:k] == student[:k] and len(actions) <= 40
        env.reset(options={"task_id": task_id})
        for action in actions:
            *_, terminated, truncated, _ = env.step(action)
        assert terminated and env.checker.check()[0]

    monkeypatch.setenv("AGENTGYM_OPD_CACHE", str(tmp_path / "cache"))
    spec = dataclasses.replace(MINI, train_tasks=6, context_share=0.0, history_share=1.0, history_model=MINI)
    assert spec.key() != MINI.key() != dataclasses.replace(spec, history_model=dataclasses.replace(MINI, steps=3)).key()
    tokens = TemplateTokens.tiny()
    examples = training_examples(tokens, spec)  # builds MINI, samples it on each task, raises if one fails
    plain = training_examples(tokens, dataclasses.replace(spec, history_share=0.0, history_model=None))
    assert len(examples) == len(plain) == 6
    assert any(sum(m) < sum(p) or len(ids) > len(p_ids) for (ids, m), (p_ids, p) in zip(examples, plain))


@pytest.mark.slow
def test_build_is_deterministic_and_cached(tmp_path, monkeypatch):
    import torch
    from safetensors.torch import load_file

    a = build_base_model(MINI, tmp_path / "a", progress=False)
    b = build_base_model(MINI, tmp_path / "b", progress=False)
    wa, wb = load_file(str(a / "model.safetensors")), load_file(str(b / "model.safetensors"))
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    init = dataclasses.replace(MINI, steps=0)
    w0 = load_file(str(build_base_model(init, tmp_path / "c", progress=False) / "model.safetensors"))
    assert any(not torch.equal(wa[k], w0[k]) for k in wa)  # training changed the weights
    assert (a / "tokenizer.json").read_text() == (b / "tokenizer.json").read_text()

    monkeypatch.setenv("AGENTGYM_OPD_CACHE", str(tmp_path / "cache"))
    lines: list[str] = []
    first = ensure_base_model(MINI, progress=False, log=lines.append)
    assert any("built in" in line for line in lines)
    lines.clear()
    assert ensure_base_model(MINI, progress=False, log=lines.append) == first and not lines  # cached: no rebuild
    assert (first.parent / "spec.json").is_file() and MINI.key() in first.parent.name
    # the folder names itself as the bench's records name it; a folder cached before the name file gets it
    from agentgym_opd.policy.loading import MODEL_NAME_FILE, resolve_policy
    from evaluation.bench.base_models import base_label

    assert resolve_policy(str(first)).student == base_label(MINI) == "household-mini-16x1-2steps"
    (first / MODEL_NAME_FILE).unlink()
    ensure_base_model(MINI, progress=False, log=lines.append)
    assert json.loads((first / MODEL_NAME_FILE).read_text()) == {"name": "household-mini-16x1-2steps"}


def test_unpadded_rows_give_the_padded_batch_gradient(tmp_path):
    """The build backpropagates one unpadded row at a time (attention's fused kernel needs no mask); the gradient
    must be the padded batch's weighted token-mean cross-entropy gradient (the decision token weighted)."""
    import torch
    from transformers import AutoModelForCausalLM

    from evaluation.bench.base_training import accumulate_batch_gradient

    out = build_base_model(dataclasses.replace(MINI, steps=0), tmp_path / "m", progress=False)
    rows = [([5, 9, 12, 7, 30, 31], [0, 0, 0, 1, 1, 1]), ([5, 9, 40, 41, 42, 8, 9, 10, 11], [0, 0, 0, 0, 1, 1, 0, 1, 1])]
    ours = AutoModelForCausalLM.from_pretrained(out)
    our_loss = accumulate_batch_gradient(ours, rows, decision_weight=3.0)

    ref = AutoModelForCausalLM.from_pretrained(out)
    width = max(len(r[0]) for r in rows)
    ids = torch.zeros((2, width), dtype=torch.long)
    attn = torch.zeros((2, width), dtype=torch.long)
    mask = torch.zeros((2, width))
    for i, (seq, m) in enumerate(rows):
        ids[i, :len(seq)], attn[i, :len(seq)], mask[i, :len(m)] = torch.tensor(seq), 1, torch.tensor(m, dtype=torch.float)
    logits = ref(input_ids=ids, attention_mask=attn).logits[:, :-1]
    where = mask[:, 1:] > 0
    # the first token of each action weighs 3 (row 0: position 3; row 1: positions 4 and 7), the others 1
    weight = torch.zeros((2, width))
    weight[0, 3:6], weight[1, 4:6], weight[1, 7:9] = 1.0, 1.0, 1.0
    weight[0, 3] = weight[1, 4] = weight[1, 7] = 3.0
    per_token = torch.nn.functional.cross_entropy(logits[where], ids[:, 1:][where], reduction="none")
    loss = (per_token * weight[:, 1:][where]).sum() / weight.sum()
    loss.backward()
    assert our_loss == pytest.approx(float(loss), abs=1e-6)
    for (name, a), b in zip(ours.named_parameters(), ref.parameters()):
        assert torch.allclose(a.grad, b.grad, atol=1e-7), (name, (a.grad - b.grad).abs().max())


def test_token_weights_mark_each_actions_first_token():
    from evaluation.bench.base_training import token_weights

    assert token_weights([0, 1, 1, 0, 0, 1, 1, 1], 5.0) == [0, 5.0, 1, 0, 0, 5.0, 1, 1]
    assert token_weights([1, 1, 0], 1.0) == [1, 1, 0]


def test_probe_sorts_every_expert_action_into_one_decision_kind(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from probe_scripts import import_probe

    base_model_probe = import_probe("base_model_probe")
    decision_kind, format_probe, probe = base_model_probe.decision_kind, base_model_probe.format_probe, base_model_probe.probe

    assert decision_kind("go to cabinet 2", 3, "You arrive at x. Next to it, you see the cabinet 2.", "g") == "go_neighbour"
    assert decision_kind("go to drawer 1", 5, "You pick up the cup 1.", "put some cup in drawer 1") == "go_target"
    assert decision_kind("go to fridge 1", 5, "You pick up the cup 1.", "cool some cup and put it in drawer 1") \
        == "go_appliance"
    assert decision_kind("take cup 1 from drawer 2", 5, "", "") == "take"
    out = build_base_model(MINI, tmp_path / "m", progress=False)
    model, tokenizer = AutoModelForCausalLM.from_pretrained(out), AutoTokenizer.from_pretrained(out)
    result = probe(model, tokenizer, split="valid_seen", tasks=6)
    env = make("household/valid_seen", num_tasks=6)
    n_actions = sum(len(env.get_task(t).privileged["demonstration"]) for t in env.task_ids())
    assert result["all"]["n"] == n_actions == sum(v["n"] for k, v in result.items() if k != "all")
    assert {"go_first", "take", "put"} <= set(result) and result["go_first"]["n"] == 6
    assert all(0.0 <= v["accuracy"] <= 1.0 for v in result.values())
    assert format_probe(result).count("\n") == len(result) + 1


def test_failed_attempt_feedback_stops_at_the_turn_limit():
    """A demonstration longer than the env's turn limit (ALFWorld's expert takes up to 48 commands) gives the
    feedback of the attempt cut at the limit instead of stepping an episode that is over."""
    import random

    import agentgym_opd
    from evaluation.bench.base_data import failed_attempt_feedback

    env = agentgym_opd.make("household/train", max_turns=2)
    task = next(t for t in (env.get_task(i) for i in env.task_ids()[:50]) if len(t.privileged["demonstration"]) > 3)

    class LastPrefix(random.Random):  # the longest prefix a draw can give: the whole demonstration but its end
        def randrange(self, n, *args, **kwargs):
            return n - 1

    feedback = failed_attempt_feedback(env, task, LastPrefix())
    assert isinstance(feedback, str) and feedback
    env.close()
