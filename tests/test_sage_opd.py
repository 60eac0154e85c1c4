"""SAGE-OPD: turn weights, teacher confidence, the OPD-scale normaliser and the verdict parser against hand
computation; then the error-first labelling, the loss and an update on real multi-turn rollouts of the tiny
model, judged by a real (briefly SFT-trained) tiny teacher; and the CLI."""

from __future__ import annotations

import copy
import json
import math
import subprocess
import sys

import pytest
import torch

import agentgym_opd
from agentgym_opd.policy.base import SamplingParams
from agentgym_opd.policy.hf import HFPolicy
from agentgym_opd.policy.tiny import default_tiny_model
from agentgym_opd.registry import algorithm_registry
from agentgym_opd.rollout import RolloutEngine
from agentgym_opd.trainer import DEFAULT_SYSTEM_PROMPT
from algorithms.opd import OPD
from agentgym_opd.algorithm import LossTerm, term_coefficients, term_normalisers, weighted_sum
from agentgym_opd.distributed import DistContext
from algorithms.sage_judge import error_first_verdicts, judge_prompt, judge_turns, parse_verdict
from algorithms.sage_opd import SAGEOPD, SAGEOPDConfig, label_importance, token_importance, turn_confidence
from algorithms.sft import SFT, concat_batches, expert_batch
from tiny_rollouts import accept_any

ENV = "household/train"


# ----------------------------------------------------------------------------------------------------
# Pure pieces against hand computation
# ----------------------------------------------------------------------------------------------------


def test_labels_map_to_importance_and_each_agent_token_gets_its_turns_weight():
    assert [label_importance(lab, 0.3) for lab in ("skip", "weak", "strong")] == [0.0, 0.3, 1.0]
    turn_of = torch.tensor([[-1, 0, 0, -1, 1, 1, -1], [-1, -1, 0, 1, 2, 2, -1]])
    mask = torch.tensor([[0, 1, 1, 0, 1, 1, 0], [0, 0, 1, 1, 1, 0, 0]], dtype=torch.float32)  # row 1 pos 5 masked
    got = token_importance(turn_of, mask, [[1.0, 0.5], [0.0, 0.5, 1.0]])
    want = torch.tensor([[0, 1, 1, 0, .5, .5, 0], [0, 0, 0, .5, 1, 0, 0]])
    torch.testing.assert_close(got, want)
    with pytest.raises(ValueError, match="do not match"):
        token_importance(turn_of, mask, [[1.0], [0.0, 0.5, 1.0]])


def test_confidence_is_the_mean_top1_teacher_probability_over_each_turns_tokens():
    probs = torch.tensor([[[.1, .1, .1], [.7, .2, .1], [.25, .5, .25], [.1, .1, .8], [.6, .3, .1]]])
    logits = probs.log() + 3.0  # any shift: logits, not probabilities
    turn_of = torch.tensor([[-1, 0, 0, 1, 1]])
    mask = torch.tensor([[0, 1, 1, 1, 0]], dtype=torch.float32)  # the last token of turn 1 carries no loss
    token, per_turn, present = turn_confidence(logits, turn_of, mask)
    torch.testing.assert_close(per_turn, torch.tensor([[(0.7 + 0.5) / 2, 0.8]]))
    torch.testing.assert_close(token, torch.tensor([[0, 0.6, 0.6, 0.8, 0]]))
    assert present.tolist() == [[True, True]]


def test_the_weighted_token_mean_is_the_whole_batchs_for_any_micro_batch_split():
    """The issue's case: an all-Weak row (per-token loss 1) and an all-Strong row (loss 3), two tokens each.
    ``Z sum s l`` over the batch is 7/3; a per-micro-batch Z (each row alone) would give plain OPD's 2.0."""
    per_token = torch.tensor([[1.0, 1.0], [3.0, 3.0]])
    s = torch.tensor([[0.5, 0.5], [1.0, 1.0]])  # i_t * c_t with c = 1
    term = LossTerm(s, "token_mean")
    coef = term_coefficients(term, term_normalisers({"d": term}, DistContext())["d"])
    whole = weighted_sum(per_token, coef)
    split = sum(weighted_sum(per_token[r:r + 1], coef[r:r + 1]) for r in range(2))
    assert math.isclose(float(whole), 7 / 3, rel_tol=1e-6) and math.isclose(float(split), 7 / 3, rel_tol=1e-6)
    z = float(s.new_ones(()).sum() * 4 / s.sum())  # Z = N / sum s: the weighted count equals OPD's
    assert math.isclose(z * float((s * per_token).sum()) / 4, 7 / 3, rel_tol=1e-6)


def test_config_rejects_unknown_knob_values_by_name():
    from agentgym_opd.config import ConfigError, dataclass_from_dict

    with pytest.raises(ConfigError, match="algo.judge"):
        dataclass_from_dict(SAGEOPDConfig, {"judge": "oracle"}, path="algo")
    with pytest.raises(ConfigError, match="algo.alpha"):
        dataclass_from_dict(SAGEOPDConfig, {"alpha": 1.5}, path="algo")
    assert dataclass_from_dict(SAGEOPDConfig, {"default_label": "strong"}, path="algo").default_label == "strong"


@pytest.mark.parametrize("text, label", [
    ("Strong", "strong"), ("  **WEAK**.", "weak"), ("skip!", "skip"), ("Label: Strong\n", "strong"),
    ("z=Skip", "skip"), ("I'd say weak, maybe strong", "weak"), ("It was not strong, just weak", "weak"),
    ("strongly", "strong"), ("Skipped", "skip"), ("It isn't strong; weak.", "weak"),
    # a thinking teacher: only the answer after </think> is the verdict
    ("<think>\nOkay, the agent opened the wrong drawer, a strong mistake? No.</think>\n\nWeak", "weak"),
    ("<think>\nOkay</think>\nStrong", "strong"),
])
def test_verdict_parser_reads_messy_answers(text, label):
    assert parse_verdict(text) == label


@pytest.mark.parametrize("text", ["", None, "go to countertop 1", "???", "<|im_end|>", "not strong",
                                  "<think>\nOkay", "Okay", "fine", "This turn is critical.", "a mistake",
                                  "<think>\nOkay, this looks strong to me"])
def test_verdict_parser_returns_none_for_no_label(text):
    assert parse_verdict(text) is None


# ----------------------------------------------------------------------------------------------------
# Real rollouts of the tiny model, a real teacher
# ----------------------------------------------------------------------------------------------------


class CountingTeacher:
    """The real teacher policy, counting its generate calls and prompts (to see who was asked)."""

    def __init__(self, policy: HFPolicy):
        self.policy, self.calls, self.prompts = policy, 0, 0

    def __getattr__(self, name):
        return getattr(self.policy, name)

    def generate(self, prompts, params, seeds=None):
        self.calls += 1
        self.prompts += len(prompts)
        return self.policy.generate(prompts, params, seeds=seeds)


@pytest.fixture(scope="module")
def setup():
    """A real batch with both kinds of turns, and a teacher SFT-trained for a few steps.

    Rows 0-1: the untrained student's own rollouts (3 turns; its actions are garbage, so the env answers
    with invalid_action errors). Rows 2-3: the tasks' expert walkthroughs teacher-forced through the same
    engine and env (every turn accepted, no error). The teacher is the tiny model after 8 SFT steps on
    those walkthroughs, so it differs from the student and is more confident.
    """
    torch.manual_seed(0)
    student = HFPolicy.from_pretrained(default_tiny_model())
    teacher = HFPolicy.from_pretrained(default_tiny_model())
    env = agentgym_opd.make(ENV, num_tasks=2, max_turns=6)
    engine = RolloutEngine(student, SamplingParams(max_new_tokens=8), system_prompt=DEFAULT_SYSTEM_PROMPT,
                           action_parser=accept_any)
    expert = expert_batch(teacher, env, env.task_ids(), engine_template=engine, expert="walkthrough")
    sft = SFT({}, teacher, optimizer=torch.optim.AdamW(teacher.model.parameters(), lr=3e-3))
    for _ in range(8):
        sft.update(expert)
    teacher.model.requires_grad_(False)
    own = engine.collect(ENV, env.task_ids(), seed=5, max_turns=3, num_tasks=2)
    batch = concat_batches([own, expert], pad_id=student.pad_id)
    assert [ep.num_turns for ep in batch.episodes] == [3, 3, 5, 4]
    assert all(t.error is not None for ep in batch.episodes[:2] for t in ep.turns)
    assert all(t.error is None for ep in batch.episodes[2:] for t in ep.turns)
    return student, teacher, batch


@pytest.mark.slow
def test_error_turns_are_strong_without_asking_and_the_rest_go_to_one_judge_call(setup):
    _, teacher, batch = setup
    spy = CountingTeacher(teacher)
    errors = sum(t.error is not None for ep in batch.episodes for t in ep.turns)
    turns = sum(ep.num_turns for ep in batch.episodes)
    verdicts = judge_turns(spy, batch.episodes, SAGEOPDConfig(judge="teacher"))
    assert spy.calls == 1 and spy.prompts == turns - errors  # one batched call, error turns not in it
    for ep, labels, sources, raw in zip(batch.episodes, verdicts.labels, verdicts.sources, verdicts.raw):
        for turn, label, source, answer in zip(ep.turns, labels, sources, raw):
            if turn.error is not None:
                assert (label, source, answer) == ("strong", "error", None)
            else:
                assert isinstance(answer, str)  # asked; its label is the parsed verdict or the default
                assert (source, label) == (("judge", parse_verdict(answer)) if parse_verdict(answer) else ("default", "weak"))
    counts = verdicts.counts()
    assert counts["turns_error_forced"] == errors
    assert counts["turns_judged"] + counts["turns_defaulted"] == turns - errors
    assert math.isclose(sum(counts[f"share_{k}"] for k in ("skip", "weak", "strong")), 1.0)

    quiet = CountingTeacher(teacher)
    only = judge_turns(quiet, batch.episodes, SAGEOPDConfig(judge="errors_only", default_label="skip"))
    assert quiet.calls == 0
    assert only.labels == error_first_verdicts(batch.episodes, "skip").labels


def test_judge_prompt_is_the_teachers_chat_template_with_history_action_and_answer(setup):
    _, teacher, batch = setup
    episode = batch.episodes[0]
    text = teacher.tokenizer.decode(judge_prompt(teacher, episode, 1, history_turns=6, max_tokens=4096))
    assert text.startswith("<|im_start|>system") and text.endswith("<|im_start|>assistant\n")
    assert episode.turns[1].action.strip() in text and episode.turns[1].observation.strip() in text
    assert episode.turns[0].action.strip() in text and "Skip, Weak or Strong" in text
    assert episode.turns[2].observation.strip() not in text or episode.turns[2].observation == episode.turns[1].observation
    short = judge_prompt(teacher, episode, 2, history_turns=6, max_tokens=len(judge_prompt(teacher, episode, 2, 0, 4096)))
    assert "2 earlier turns omitted" in teacher.tokenizer.decode(short)  # history dropped first to fit


def test_loss_is_the_hand_weighted_opd_divergence_on_a_real_rollout(setup):
    student, teacher, batch = setup
    rows = slice(0, len(batch))
    algo = SAGEOPD({"judge": "teacher", "alpha": 0.5}, student, teacher)
    state = algo.prepare(batch)
    loss, metrics = algo.loss(batch, state)
    opd = OPD({}, student, teacher)
    per_token, mask, _, teacher_logits, _ = opd.distillation_terms(batch, rows, opd.prepare(batch))
    labels = state.verdicts.labels
    top1 = torch.softmax(teacher_logits, dim=-1).amax(dim=-1)
    turn_of = batch.turn_index[:, 1: mask.shape[1] + 1]
    numer, denom, confidences = 0.0, 0.0, []
    for row, episode in enumerate(batch.episodes):  # the formula, turn by turn, in plain Python
        for k in range(episode.num_turns):
            tokens = (turn_of[row] == k) & (mask[row] > 0)
            c = float(top1[row][tokens].mean())
            s = label_importance(labels[row][k], 0.5) * c
            numer += s * float(per_token[row][tokens].detach().sum())
            denom += s * int(tokens.sum())
            confidences.append(c)
    n = float(mask.sum())
    z = n / denom
    assert math.isclose(float(loss.detach()), z * numer / n, rel_tol=1e-4)
    assert math.isclose(state.metrics["mean_confidence"], sum(confidences) / len(confidences), rel_tol=1e-4)
    assert 0 < state.metrics["mean_confidence"] < 1 and metrics["kl"] > 1e-3


def test_all_skip_gives_a_zero_loss_that_still_backpropagates(setup):
    student, teacher, batch = setup
    algo = SAGEOPD({"judge": "errors_only", "default_label": "skip", "alpha": 0.0}, student, teacher)
    clean = [ep for ep in batch.episodes]
    saved = [[t.error for t in ep.turns] for ep in clean]
    try:
        for ep in clean:
            for t in ep.turns:
                t.error = None  # no error turns: every turn defaults to Skip
        loss, metrics = algo.loss(batch)
    finally:
        for ep, errs in zip(clean, saved):
            for t, e in zip(ep.turns, errs):
                t.error = e
    assert float(loss.detach()) == 0.0
    loss.backward()  # well defined: a graph through the student with zero gradient
    assert all(p.grad is None or float(p.grad.abs().max()) == 0.0 for p in student.model.parameters())
    student.model.zero_grad(set_to_none=True)


def test_env_faults_are_judged_not_forced_strong_and_defaulted_verdicts_are_counted_and_warned(setup):
    from agentgym_opd.types import StepError

    _, teacher, batch = setup
    episode = copy.deepcopy(batch.episodes[0])
    episode.turns[0].error = StepError("env_crash", "the JVM died")
    episode.turns[1].error = StepError("timeout", "the env took too long")
    spy = CountingTeacher(teacher)
    verdicts = judge_turns(spy, [episode], SAGEOPDConfig(judge="teacher", judge_max_new_tokens=2))
    assert spy.prompts == 2 and verdicts.sources[0][2] == "error"  # the two faults went to the judge
    assert all(src in ("judge", "default") for src in verdicts.sources[0][:2])
    counts = verdicts.counts()
    defaulted = sum(src == "default" for src in verdicts.sources[0][:2])
    assert counts["judge_defaulted_share"] == defaulted / 2


def test_a_judge_that_never_answers_a_label_raises_the_defaulted_warning(setup):
    student, teacher, batch = setup

    class Mumbler(CountingTeacher):
        def generate(self, prompts, params, seeds=None):
            return [type("G", (), {"text": "<think>\nOkay, let me see"})() for _ in prompts]

    algo = SAGEOPD({"judge": "teacher"}, student, Mumbler(teacher))
    with pytest.warns(UserWarning, match="no readable verdict"):
        state = algo.prepare(batch)
    assert state.metrics["judge_defaulted_share"] == 1.0


@pytest.mark.slow
def test_one_real_update_moves_the_student_towards_the_teacher_and_logs_the_turn_statistics(setup):
    student, teacher, batch = setup
    state = {k: v.clone() for k, v in student.model.state_dict().items()}
    spy = CountingTeacher(teacher)
    try:
        algo = SAGEOPD({"judge": "teacher"}, student, spy,
                       optimizer=torch.optim.SGD(student.model.parameters(), lr=0.5), micro_batch_size=2)
        first = algo.update(batch)
        second = algo.update(batch)
    finally:
        student.model.load_state_dict(state)
    assert spy.calls == 2  # one judge call per update, shared by both micro-batches
    assert second["kl"] < first["kl"]
    for key in ("share_skip", "share_weak", "share_strong", "turns_judged", "turns_error_forced",
                "turns_defaulted", "judge_defaulted_share", "mean_confidence", "distill_loss", "grad_norm"):
        assert key in first and math.isfinite(first[key])
    assert first["turns_error_forced"] >= 1 and first["share_strong"] > 0


@pytest.mark.slow
def test_registered_and_runs_from_the_cli_with_a_teacher_checkpoint(setup, tmp_path):
    _, teacher, _ = setup
    assert "sage_opd" in algorithm_registry.ids()
    assert algorithm_registry.spec("sage_opd").description.startswith("OPD whose tokens are weighted per turn")
    teacher_dir = tmp_path / "teacher"
    teacher.model.save_pretrained(teacher_dir)
    teacher.tokenizer.save_pretrained(teacher_dir)
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "agentgym_opd.cli", "train", "--algo", "sage_opd", "--env", ENV, "--student", "tiny",
           "--teacher", str(teacher_dir), "model.device=cpu", "train.steps=2", "rollout.tasks_per_step=2",
           "rollout.max_turns=3", "rollout.max_new_tokens=8", "algo.judge=teacher", "algo.alpha=0.25",
           "--env-arg", "num_tasks=4", "--output-dir", str(out)]
    done = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2]
    assert all(math.isfinite(r["loss"]) and "share_strong" in r and "turns_judged" in r for r in records)


def test_the_defaulted_share_goes_into_the_result_record_with_a_warning_above_the_threshold():
    from evaluation.judge_diagnostics import DEFAULTED_WARN_SHARE, training_diagnostics
    from evaluation.records import validate_record

    assert training_diagnostics([{"loss": 1.0}]) == {}  # not SAGE-OPD: nothing to report
    low = training_diagnostics([{"judge_defaulted_share": 0.0}, {"judge_defaulted_share": 0.1}])
    assert low == {"judge_defaulted_share": pytest.approx(0.05)}
    with pytest.warns(UserWarning, match="defaulted 90%"):
        high = training_diagnostics([{"judge_defaulted_share": 0.8}, {"judge_defaulted_share": 1.0}])
    assert high["judge_defaulted_share"] > DEFAULTED_WARN_SHARE
    record = {"schema_version": 1, "env_id": "household/valid_unseen", "split": "valid_unseen",
              "metrics": {"success_rate": {"mean": 0.5, "stderr": 0.1}}, "n_episodes": 4, "algorithm": "sage_opd",
              "algorithm_config": {}, "student": "tiny", "teacher": "tiny", "code_revision": "abc", "seed": 0,
              "wall_time_s": 1.0, "created": "2026-12-03T00:00:00+00:00", "training": high}
    assert validate_record(record)["training"] == high
    with pytest.raises(ValueError, match="training"):
        validate_record({**record, "training": {"judge_defaulted_share": "lots"}})


def test_a_scored_judge_refuses_a_tokenizer_whose_labels_share_a_first_token(setup):
    _, teacher, batch = setup  # the tiny model's tokenizer starts "Skip" and "Strong" with the same "S"
    with pytest.raises(ValueError, match="algo.judge=teacher"):
        judge_turns(teacher, batch.episodes, SAGEOPDConfig(judge="teacher_scored"))


@pytest.mark.slow
def test_the_scored_judge_takes_smollm2s_likeliest_label_word_for_every_asked_turn(setup):
    """SmolLM2 as the judge (its answers in words are unreadable on these turns): every asked turn gets the label
    whose first token it scores highest, the same as scoring each label's token on its own."""
    from algorithms.sage_judge import judge_prompt, label_first_tokens
    from agentgym_opd.policy.smollm2 import load_smollm2

    _, _, batch = setup
    judge = load_smollm2()
    config = SAGEOPDConfig(judge="teacher_scored")
    verdicts = judge_turns(judge, batch.episodes, config)
    firsts = label_first_tokens(judge)
    assert len(set(firsts)) == 3
    for row, ep in enumerate(batch.episodes):
        for k, turn in enumerate(ep.turns):
            if turn.error is not None:
                assert (verdicts.labels[row][k], verdicts.sources[row][k]) == ("strong", "error")
                continue
            assert verdicts.sources[row][k] == "judge" and verdicts.raw[row][k].startswith("scored skip=")
            prompt = judge_prompt(judge, ep, k, config.judge_history_turns, config.judge_max_prompt_tokens)
            alone = [float(judge.score([prompt], [[token]])[0].logprobs[0]) for token in firsts]
            assert verdicts.labels[row][k] == ("skip", "weak", "strong")[alone.index(max(alone))]
    counts = verdicts.counts()
    assert counts["turns_defaulted"] == 0 and counts["judge_defaulted_share"] == 0.0
