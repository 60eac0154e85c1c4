"""A served teacher (``model.teacher_backend=vllm``) whose tokenizer differs from the student's.

The cross-tokenizer path re-tokenises the student's text in the teacher's tokens and sums the teacher's
log-probs over merged spans (:mod:`agentgym_opd.cross_tokenizer`). Served, the teacher's half is vLLM's prompt
log-probs of that view. These tests check that the served teacher gives the in-process teacher's numbers:

- the same view (vLLM's tokenizer wrapper renders the template and encodes the student's text to the same ids);
- aligned span log-probs equal within ``SPAN_TOLERANCE`` absolute (float32 on both sides; a span sums a few
  tokens, each within about 1e-6 of the HF value, see test_policy_vllm.py);
- OPD's per-token loss terms (``algo.estimator=sampled``; relative to their size, since a span's term is its
  teacher log-prob times the student's span log-prob) and KL, SAGE-OPD's turn confidence (the teacher's served
  top-1), and a Trainer step with ``--teacher PATH model.teacher_backend=vllm`` against the same step with the
  HF teacher;
- the full estimator, which needs the teacher's log-probs on the shared vocabulary, is refused with the fix.

Like the other tests here it runs in ``$VLLM_PYTHON`` (this file is also the script):
    VLLM_PYTHON=/path/to/venv/bin/python python -m pytest tests/vllm -q
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

VLLM_PYTHON = os.environ.get("VLLM_PYTHON", sys.executable)
SPAN_TOLERANCE = 1e-4  # span log-probs, KL, confidence: absolute; loss terms: relative (docstring)
ROOT = Path(__file__).resolve().parents[2]


def run_case(tmp_path: Path, case: str) -> dict:
    out = tmp_path / f"{case}.json"
    proc = subprocess.run([VLLM_PYTHON, __file__, str(out), case, str(tmp_path)], capture_output=True, text=True,
                          timeout=900, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(out.read_text())


def test_a_served_teacher_of_another_tokenizer_gives_the_in_process_teachers_aligned_span_logprobs(tmp_path):
    r = run_case(tmp_path, "spans")
    assert r["teacher_is_vllm"] and r["tokenizers_differ"]
    assert r["views_equal"], "the served teacher's tokenizer rendered a different view of the episode"
    assert r["spans"] > 20 and r["uneven_spans"] > 0  # spans of several tokens on a side, not only 1:1
    assert r["span_logprob_gap"] < SPAN_TOLERANCE, r
    assert r["agent_tokens"] > 50 and r["loss_hf"] != 0.0
    assert r["per_token_gap"] < SPAN_TOLERANCE and r["token_kl_gap"] < SPAN_TOLERANCE, r
    assert r["loss_gap"] < SPAN_TOLERANCE * (1 + abs(r["loss_hf"])) and r["kl_gap"] < SPAN_TOLERANCE, r
    assert r["confidence_gap"] < SPAN_TOLERANCE, r
    assert r["full_estimator_error"].startswith("ValueError") and "algo.estimator=sampled" in r["full_estimator_error"]


def test_opd_trains_against_a_served_teacher_of_another_tokenizer(tmp_path):
    """`train --teacher PATH model.teacher_backend=vllm algo.estimator=sampled`: the cross-tokenizer path is
    taken by itself (auto), and the first step's loss equals the step against the same teacher in process."""
    r = run_case(tmp_path, "trainer")
    assert r["teacher_is_vllm"] and r["took_cross_path"] and r["weights_moved"], r
    assert r["loss_gap_vs_hf_teacher"] < SPAN_TOLERANCE * (1 + abs(r["losses"]["hf"])), r


# ----------------------------------------------------------------------------------------------------
# The script half (runs in $VLLM_PYTHON)
# ----------------------------------------------------------------------------------------------------


def other_tokenizer_teacher(folder: Path) -> Path:
    """A small random Llama that reads SmolLM2-135M's tokenizer, saved as a folder vLLM can load: a real second
    tokenizer at a tiny model's cost (agreement between the two backends does not depend on training)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    sys.path.insert(0, str(ROOT / "tests"))
    from test_cross_tokenizer import smollm2_tokenizer

    tokenizer = smollm2_tokenizer()
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2, head_dim=32, max_position_embeddings=4096,
                         tie_word_embeddings=True, initializer_range=0.1, bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=tokenizer.eos_token_id)
    folder.mkdir(parents=True, exist_ok=True)
    LlamaForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def _spans_main(result_path: str, work: str) -> None:
    import torch

    sys.path.insert(0, str(ROOT / "tests"))
    from agentgym_opd.cross_tokenizer import CrossTokenizerTeacher, same_tokenizer
    from agentgym_opd.policy.hf import HFPolicy
    from agentgym_opd.policy.vllm_backend import VLLMPolicy, load_vllm_policy
    from agentgym_opd.token_alignment import span_sums
    from algorithms.opd import OPD, OPDConfig
    from tiny_rollouts import tiny_household_rollout

    student, batch = tiny_household_rollout(seed=3, max_turns=3, max_new_tokens=12)
    path = other_tokenizer_teacher(Path(work) / "teacher")
    teachers = {"hf": HFPolicy.from_pretrained(path), "vllm": load_vllm_policy(path, max_model_len=4096, max_logprobs=1)}
    rows = list(range(len(batch)))
    width = batch.input_ids.shape[1] - 1
    out: dict[str, dict] = {}
    for name, teacher in teachers.items():
        cross = CrossTokenizerTeacher(student, teacher, OPDConfig(estimator="sampled"))
        views = cross.views(batch, rows, [""] * len(batch))
        scores = cross.teacher_scores(views, support=False)
        index, _ = cross.alignment(views, rows, width, batch.input_ids)
        teacher_logp = torch.cat([s.logprobs.float() for s in scores]).double()
        _, aligned = span_sums(torch.zeros(len(batch) * width, dtype=torch.float64), teacher_logp, index)
        algo = OPD(OPDConfig(estimator="sampled"), student, teacher)
        state = algo.prepare(batch)
        step = algo.steps(state)[0]
        coef = algo.coefficients(batch, state, step)
        loss, metrics = algo.compute_loss(batch, slice(0, len(batch)), coef, state, step)
        terms = algo.cross.terms(algo.model, batch, slice(0, len(batch)), [""] * len(batch))
        confidence = cross.turn_confidence(batch, slice(0, len(batch)), [""] * len(batch), width + 1)
        out[name] = {"views": [v.ids for v in views], "aligned": aligned, "loss": float(loss.detach()),
                     "kl": float(metrics["kl"]), "per_token": terms.per_token.detach(), "token_kl": terms.kl,
                     "confidence": confidence, "cross": algo.cross is not None,
                     "uneven": sum(not s.one_to_one for v in views for t in v.turns for s in t.spans)}
    try:
        OPD(OPDConfig(), student, teachers["vllm"])
        full_error = "no error"
    except Exception as exc:  # the test checks the type and the advice
        full_error = f"{type(exc).__name__}: {exc}"
    hf, served = out["hf"], out["vllm"]
    Path(result_path).write_text(json.dumps({
        "teacher_is_vllm": isinstance(teachers["vllm"], VLLMPolicy),
        "tokenizers_differ": not same_tokenizer(student, teachers["hf"]) and hf["cross"] and served["cross"],
        "views_equal": hf["views"] == served["views"],
        "spans": int(hf["aligned"].numel()), "uneven_spans": hf["uneven"],
        "span_logprob_gap": float((hf["aligned"] - served["aligned"]).abs().max()),
        "loss_hf": hf["loss"], "loss_gap": abs(hf["loss"] - served["loss"]), "kl_gap": abs(hf["kl"] - served["kl"]),
        # per agent token, relative to the term's size: a span's loss is r_j * log p_S(span_j), so an error of
        # the teacher's span log-prob is multiplied by the student's span log-prob
        "per_token_gap": float(((hf["per_token"] - served["per_token"]).abs() / (1 + hf["per_token"].abs())).max()),
        "token_kl_gap": float((hf["token_kl"] - served["token_kl"]).abs().max()),
        "agent_tokens": int((hf["per_token"] != 0).sum()),
        "confidence_gap": float((hf["confidence"] - served["confidence"]).abs().max()),
        "full_estimator_error": full_error}))


def _trainer_main(result_path: str, work: str) -> None:
    import torch

    from agentgym_opd.config import load_config
    from agentgym_opd.policy.vllm_backend import VLLMPolicy
    from agentgym_opd.trainer import Trainer, algorithm_class

    path = other_tokenizer_teacher(Path(work) / "teacher")
    losses, moved, served, cross = {}, {}, False, {}
    for backend in ("vllm", "hf"):  # the same seed: the same rollouts, so the step-1 losses compare
        overrides = ["algorithm=opd", "env=household/train", f"output_dir={work}/run-{backend}", "model.student=tiny",
                     f"model.teacher={path}", f"model.teacher_backend={backend}", "model.device=cpu",
                     "model.vllm_gpu_memory_utilization=0.08", "model.max_seq_len=1024", "train.steps=1",
                     "train.lr=1e-2", "rollout.tasks_per_step=2", "rollout.max_turns=2", "rollout.max_new_tokens=8",
                     "algo.estimator=sampled"]
        config = load_config(None, overrides, algo_config_cls=algorithm_class("opd").Config)
        trainer = Trainer(config, env_overrides={"num_tasks": 4}, progress=False)
        served = served or isinstance(trainer.teacher, VLLMPolicy)
        cross[backend] = getattr(trainer.algorithm, "cross", None) is not None
        initial = {n: p.detach().clone() for n, p in trainer.student.model.named_parameters()}
        losses[backend] = float(trainer.train()["loss"])
        moved[backend] = any(not torch.equal(initial[n], p) for n, p in trainer.student.model.named_parameters())
    Path(result_path).write_text(json.dumps({
        "teacher_is_vllm": served, "took_cross_path": cross["vllm"] and cross["hf"], "weights_moved": moved["vllm"],
        "loss_gap_vs_hf_teacher": abs(losses["vllm"] - losses["hf"]), "losses": losses}))


if __name__ == "__main__":
    {"spans": _spans_main, "trainer": _trainer_main}[sys.argv[2]](sys.argv[1], sys.argv[3])
