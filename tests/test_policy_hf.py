"""HF backend on the tiny offline model: generate/score agreement, seeds, LoRA adapter-off, save/reload."""

from __future__ import annotations

import math

import pytest
import torch

from agentgym_opd.policy.base import Policy, SamplingParams, tail_logprob
from agentgym_opd.policy.hf import HFPolicy, LoraConfig
from agentgym_opd.policy.tiny import GENERIC_TEXT, build_tiny_model, default_tiny_model


@pytest.fixture(scope="module")
def tiny_path():
    return default_tiny_model()


@pytest.fixture(scope="module")
def policy(tiny_path):
    return HFPolicy.from_pretrained(tiny_path)


def _prompts(policy):
    return [
        policy.apply_chat_template([{"role": "user", "content": "Your task is to: put a clean mug in coffeemachine 1."}]),
        policy.apply_chat_template([{"role": "user", "content": "go to countertop 1"}]),
    ]


def test_policy_satisfies_protocol(policy):
    assert isinstance(policy, Policy)


def test_tiny_model_saves_and_reloads_by_path(tmp_path):
    path = build_tiny_model(tmp_path / "tiny", GENERIC_TEXT * 5, vocab_size=400, hidden=64, layers=1, heads=2)
    a = HFPolicy.from_pretrained(path)
    n_params = sum(p.numel() for p in a.model.parameters())
    assert 50_000 < n_params < 20_000_000
    b = HFPolicy.from_pretrained(path)
    ids = a.apply_chat_template([{"role": "user", "content": "open fridge 1"}])
    assert ids == b.apply_chat_template([{"role": "user", "content": "open fridge 1"}])
    assert a.tokenizer.decode(ids).startswith("<|im_start|>user\nopen fridge 1<|im_end|>")
    sa = a.score([ids], [[5, 6, 7]])[0].logprobs
    sb = b.score([ids], [[5, 6, 7]])[0].logprobs
    assert torch.equal(sa, sb)


@pytest.mark.slow
def test_generate_logprobs_equal_score_of_same_tokens(policy):
    """In ``raw`` mode (temperature-1 log-probs whatever the sampling temperature; the default ``tempered``
    mode is checked against a forward at the rollout's temperature in test_method_temperature.py)."""
    raw = HFPolicy(policy.model, policy.tokenizer, logprobs="raw")
    prompts = _prompts(policy)  # different lengths -> left padding is exercised
    gens = raw.generate(prompts, SamplingParams(max_new_tokens=24, temperature=0.8, top_k=50, seed=3))
    scores = policy.score(prompts, [g.token_ids for g in gens])
    for gen, sc in zip(gens, scores):
        assert len(gen.token_ids) == len(gen.logprobs) == sc.logprobs.shape[0] > 0
        torch.testing.assert_close(torch.tensor(gen.logprobs), sc.logprobs, atol=1e-4, rtol=0)
        assert gen.finish_reason in ("stop", "length")


def test_sampling_logprobs_mode_reports_tempered_distribution(tiny_path, policy):
    tempered = HFPolicy(policy.model, policy.tokenizer, logprobs="sampling")
    raw_policy = HFPolicy(policy.model, policy.tokenizer, logprobs="raw")
    params = SamplingParams(max_new_tokens=8, temperature=0.5, seed=1)
    prompts = _prompts(policy)[:1]
    raw, samp = raw_policy.generate(prompts, params)[0], tempered.generate(prompts, params)[0]
    assert raw.token_ids == samp.token_ids  # same seed, same draw
    assert not torch.allclose(torch.tensor(raw.logprobs), torch.tensor(samp.logprobs))


def test_seed_reproducible_and_independent_of_batch(policy):
    prompts = _prompts(policy)
    params = SamplingParams(max_new_tokens=16, seed=11)
    a = policy.generate(prompts, params)
    b = policy.generate(prompts, params)
    assert [g.token_ids for g in a] == [g.token_ids for g in b]
    alone = policy.generate(prompts[1:], params, seeds=[12])  # row 1 of the batch used seed 11 + 1
    assert alone[0].token_ids == a[1].token_ids
    other = policy.generate(prompts, SamplingParams(max_new_tokens=16, seed=99))
    assert [g.token_ids for g in other] != [g.token_ids for g in a]


def test_stop_string_and_length_finish(policy):
    prompts = _prompts(policy)[:1]
    gen = policy.generate(prompts, SamplingParams(max_new_tokens=5, seed=0))[0]
    assert gen.finish_reason == "length" and len(gen.token_ids) == 5
    full = policy.generate(prompts, SamplingParams(max_new_tokens=40, seed=0))[0]
    stop_at = full.text[3:5]
    stopped = policy.generate(prompts, SamplingParams(max_new_tokens=40, seed=0, stop=[stop_at]))[0]
    assert stopped.finish_reason == "stop"
    assert stop_at not in stopped.text and len(stopped.token_ids) <= len(full.token_ids)


def test_top_m_scores_and_tail_mass(policy):
    prompts = _prompts(policy)
    cont = [[10, 11, 12, 13], [20, 21]]
    sc = policy.score(prompts, cont, top_m=8)
    for s, c in zip(sc, cont):
        assert s.top_ids.shape == (len(c), 8) and s.top_logprobs.shape == (len(c), 8)
        total = torch.logsumexp(torch.cat([s.top_logprobs, s.tail_logprob[:, None]], dim=-1), dim=-1)
        torch.testing.assert_close(total, torch.zeros(len(c)), atol=1e-5, rtol=0)
        assert (s.top_logprobs[:, :1] >= s.logprobs[:, None] - 1e-6).all()  # top-1 is the max
    near_one = torch.tensor([[math.log(1 - 1e-9), math.log(1e-10)]])
    assert torch.isfinite(tail_logprob(near_one)).all()


def test_score_with_grad_backpropagates(tiny_path):
    pol = HFPolicy.from_pretrained(tiny_path)
    ids = pol.apply_chat_template([{"role": "user", "content": "look"}])
    sc = pol.score([ids], [[30, 31, 32]], grad=True)[0]
    assert sc.logprobs.requires_grad
    (-sc.logprobs.sum()).backward()
    grads = [p.grad for p in pol.model.parameters() if p.grad is not None]
    assert grads and any(g.abs().sum() > 0 for g in grads)


def test_lora_adapter_off_equals_base_model(tiny_path, policy):
    lora = HFPolicy.from_pretrained(tiny_path, lora=LoraConfig(r=4, alpha=8), gradient_checkpointing=True)
    with torch.no_grad():  # make the adapter non-trivial (B is zero-initialised)
        for name, p in lora.model.named_parameters():
            if "lora_B" in name:
                p.add_(0.5)
    prompts = _prompts(policy)
    cont = [[40, 41, 42], [43, 44]]
    base = policy.score(prompts, cont)
    adapted = lora.score(prompts, cont)
    with lora.adapter_disabled():
        off = lora.score(prompts, cont)
    for b, a, o in zip(base, adapted, off):
        torch.testing.assert_close(o.logprobs, b.logprobs, atol=1e-5, rtol=0)
        assert not torch.allclose(a.logprobs, b.logprobs, atol=1e-3)
    trainable = [n for n, p in lora.model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)


def test_misuse_raises_clearly(policy, tmp_path):
    with pytest.raises(FileNotFoundError, match="local checkpoints"):
        HFPolicy.from_pretrained(tmp_path / "missing")
    with pytest.raises(ValueError, match="contexts"):
        policy.score([[1]], [[2], [3]])
    with pytest.raises(ValueError, match="max_new_tokens"):
        SamplingParams(max_new_tokens=0)


def test_a_right_padded_batch_runs_without_its_mask_and_gives_the_masked_numbers(tiny_path):
    """final_hidden_states drops a right-padded batch's mask (CPU SDPA's causal kernel is faster): every real
    position's hidden state and every gradient equal the masked forward's, bit for bit; a left-padded batch keeps it."""
    from agentgym_opd.policy.hf import final_hidden_states, right_padded

    model = HFPolicy.from_pretrained(tiny_path).model
    torch.manual_seed(0)
    lengths = [96, 70, 85]
    ids = torch.randint(5, model.config.vocab_size, (3, max(lengths)))
    mask = torch.zeros(3, max(lengths), dtype=torch.long)
    for row, n in enumerate(lengths):
        mask[row, :n] = 1
    assert right_padded(mask) and not right_padded(mask.flip(1)) and right_padded(None)

    def forward(run):
        model.zero_grad(set_to_none=True)
        hidden = run()
        (hidden.float() ** 2 * mask[..., None]).sum().backward()
        return hidden.detach() * mask[..., None], {k: p.grad.clone() for k, p in model.named_parameters()}

    fast = forward(lambda: final_hidden_states(model, ids, mask))
    masked = forward(lambda: model.get_decoder()(input_ids=ids, attention_mask=mask, use_cache=False).last_hidden_state)
    assert torch.equal(fast[0], masked[0])
    assert all(torch.equal(fast[1][k], masked[1][k]) for k in masked[1])
    left = mask.flip(1)  # left padding: positions shift, so the mask must stay; the output is the masked one
    kept = final_hidden_states(model, ids, left)
    assert torch.equal(kept * left[..., None], model.get_decoder()(input_ids=ids, attention_mask=left,
                                                                   use_cache=False).last_hidden_state * left[..., None])


def test_length_buckets_group_by_length_within_the_padded_token_budget():
    from agentgym_opd.policy.batching import length_buckets

    lengths = [100, 900, 120, 1000, 5000, 880]
    buckets = length_buckets(lengths, 2000)
    assert sorted(i for b in buckets for i in b) == list(range(len(lengths)))  # every prompt exactly once
    assert buckets[0] == [4]  # longer than the budget: alone
    for bucket in buckets:
        assert len(bucket) == 1 or len(bucket) * max(lengths[i] for i in bucket) <= 2000
    assert [3, 1] in buckets and [5, 2] in buckets and [0] in buckets  # longest first, each filled before the next


def test_bucketed_prefill_generates_what_one_batch_generates(policy, monkeypatch):
    """Buckets change how prompts are batched, not what any row generates (greedy and seeded sampling)."""
    import agentgym_opd.policy.hf as hf

    texts = ["go to countertop 1", "Your task is to: put a clean mug in coffeemachine 1. " * 3, "open fridge 1",
             "Your task is to: heat some egg and put it in garbagecan 1."]
    prompts = [policy.apply_chat_template([{"role": "user", "content": t}]) for t in texts]
    for params in (SamplingParams(max_new_tokens=12, temperature=0.0), SamplingParams(max_new_tokens=12, seed=5)):
        monkeypatch.setattr(hf, "PREFILL_TOKEN_BUDGET", 10**9)  # one batch
        together = policy.generate(prompts, params)
        monkeypatch.setattr(hf, "PREFILL_TOKEN_BUDGET", 1)  # every prompt alone
        calls = []
        original = hf.KVSession.generate
        monkeypatch.setattr(hf.KVSession, "generate", lambda self, *a, **k: calls.append(1) or original(self, *a, **k))
        alone = policy.generate(prompts, params)
        monkeypatch.setattr(hf.KVSession, "generate", original)
        assert len(calls) == len(prompts)
        assert [g.token_ids for g in together] == [g.token_ids for g in alone]
        assert [g.text for g in together] == [g.text for g in alone]


def test_prefill_groups_keep_one_chunk_when_padding_is_small_and_split_by_length_otherwise():
    from agentgym_opd.policy.batching import prefill_groups

    assert prefill_groups([30, 31, 29]) == [[0, 1, 2]]  # at most a quarter padding: one chunk, no cache copies
    groups = prefill_groups([100, 10, 12, 60, 5])
    assert sorted(i for g in groups for i in g) == [0, 1, 2, 3, 4]
    assert groups == [[0, 3], [2, 1], [4]]  # longest first; a row joins while at least half the group's longest
    assert prefill_groups([]) == []
