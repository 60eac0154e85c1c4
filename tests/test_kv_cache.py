"""The in-place KV cache and copy-free GQA attention give exactly the stock Transformers numbers."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.cache_utils import DynamicLayer

from agentgym_opd.policy.base import SamplingParams
from agentgym_opd.policy.hf import HFPolicy
from agentgym_opd.policy.kv_cache import SlabLayer, slab_cache
from agentgym_opd.policy.tiny import default_tiny_model


def test_slab_layer_holds_what_dynamic_layer_holds_through_growth_selection_and_crop():
    torch.manual_seed(0)
    slab, stock = SlabLayer(), DynamicLayer()
    for t in (300, 1, 1, 70, 1):  # the first chunk fills past the initial room; later ones force a growth
        k, v = torch.randn(3, 2, t, 4), torch.randn(3, 2, t, 4)
        got, want = slab.update(k, v), stock.update(k, v)
        assert all(torch.equal(a, b) for a, b in zip(got, want))
    assert slab.get_seq_length() == stock.get_seq_length() == 373
    keep = torch.tensor([2, 0])
    slab.batch_select_indices(keep)
    stock.batch_select_indices(keep)
    slab.crop(-5)
    stock.crop(-5)
    k, v = torch.randn(2, 2, 1, 4), torch.randn(2, 2, 1, 4)
    got, want = slab.update(k, v), stock.update(k, v)
    assert all(torch.equal(a, b) for a, b in zip(got, want)) and slab.get_seq_length() == 369



def test_slab_values_lend_decode_attention_their_zero_tailed_buffer_until_a_tensor_is_assigned():
    """A decode step's values are a view into the slab; `bmm` copies such a view whole (its rows are not
    contiguous), so the layer lends `decode_attention` the buffer itself, whose slots past the view are zero. An
    assigned tensor (a crop keeps a view of the old buffer, stale slots included) lends nothing."""
    from agentgym_opd.policy.kv_cache import SLAB_BUFFER, decode_attention

    torch.manual_seed(0)
    slab = SlabLayer()
    keys, values = slab.update(torch.randn(2, 3, 40, 8), torch.randn(2, 3, 40, 8))
    buffer = getattr(values, SLAB_BUFFER)
    assert buffer.shape[2] > 40 and buffer.is_contiguous() and not buffer[:, :, 40:].any()
    assert torch.equal(buffer[:, :, :40], values)
    assert getattr(keys, SLAB_BUFFER).shape[2] == buffer.shape[2]  # the keys lend theirs too (their tail unread)
    q = torch.randn(2, 9, 1, 8)
    lent = decode_attention(q, keys, values, None)
    plain = decode_attention(q, keys.clone(), values.clone(), None)
    torch.testing.assert_close(lent, plain, rtol=1e-6, atol=1e-6)
    slab.crop(30)
    _, values = slab.update(torch.randn(2, 3, 1, 8), torch.randn(2, 3, 1, 8))
    assert getattr(values, SLAB_BUFFER, None) is None or not getattr(values, SLAB_BUFFER)[:, :, 31:].any()


def test_the_slab_stores_keys_in_the_values_dtype():
    """Under autocast the rotary embedding hands the cache float32 keys beside bf16 values; the slab keeps both in
    bf16 (what attention under autocast reads), so the cache is a third smaller and no prefill casts it again."""
    slab = SlabLayer()
    keys, values = slab.update(torch.randn(2, 3, 5, 8), torch.randn(2, 3, 5, 8).bfloat16())
    assert keys.dtype == values.dtype == torch.bfloat16
    keys, _ = slab.update(torch.randn(2, 3, 1, 8), torch.randn(2, 3, 1, 8).bfloat16())
    assert keys.shape[2] == 6 and keys.dtype == torch.bfloat16
    keys, values = SlabLayer().update(torch.randn(1, 3, 4, 8), torch.randn(1, 3, 4, 8))  # float32 stays float32
    assert keys.dtype == values.dtype == torch.float32


def test_a_slab_layers_rows_copy_its_buffers_whole_and_append_in_place():
    """`SlabLayer.rows` (a prefill group's or a shrinking decode's copy of some rows) holds exactly those rows'
    keys and values, lends its values' zero tail, and has the source's spare room: an append writes in place."""
    from agentgym_opd.policy.kv_cache import SLAB_BUFFER

    torch.manual_seed(0)
    slab = SlabLayer()
    keys, values = slab.update(torch.randn(4, 3, 40, 8), torch.randn(4, 3, 40, 8))
    index = torch.tensor([3, 1])
    rows = slab.rows(index)
    torch.testing.assert_close(rows.keys, keys[index], rtol=0, atol=0)
    torch.testing.assert_close(rows.values, values[index], rtol=0, atol=0)
    buffer = rows._v
    new_keys, new_values = rows.update(torch.randn(2, 3, 3, 8), torch.randn(2, 3, 3, 8))
    assert rows._v is buffer and new_values.shape[2] == 43  # appended in place, no new buffer
    assert not getattr(new_values, SLAB_BUFFER)[:, :, 43:].any()
    assert SlabLayer().rows(index) is None  # nothing to copy yet


def _gqa_model(initializer_range: float = 0.02) -> LlamaForCausalLM:
    """A 2-layer GQA Llama. At the default init its attention barely moves the logits; a test of what a row
    attends to takes ``initializer_range=0.3``, where a wrong key changes the sampled tokens."""
    torch.manual_seed(1)
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         attn_implementation="sdpa", initializer_range=initializer_range)
    return LlamaForCausalLM(config).eval()


def test_gqa_attention_without_copies_equals_stock_sdpa_forward_and_backward():
    stock, shared = _gqa_model(), _gqa_model()
    tokenizer_dir = default_tiny_model()
    from transformers import AutoTokenizer

    HFPolicy(shared, AutoTokenizer.from_pretrained(tokenizer_dir))  # switches it to the copy-free attention
    assert shared.config._attn_implementation == "gqa_sdpa" and stock.config._attn_implementation == "sdpa"
    ids = torch.randint(0, 64, (3, 20))
    mask = torch.ones_like(ids)
    mask[0, :6] = 0  # left padding: the masked path, where stock SDPA repeats the KV heads
    outs = []
    for model in (stock, shared):
        model.zero_grad()
        logits = model(input_ids=ids, attention_mask=mask).logits
        logits[mask.bool()].logsumexp(-1).sum().backward()
        outs.append((logits.detach(), model.model.layers[0].self_attn.k_proj.weight.grad.clone()))
    assert torch.allclose(outs[0][0], outs[1][0], atol=1e-6)
    assert torch.allclose(outs[0][1], outs[1][1], atol=1e-5)


@pytest.mark.slow
def test_a_session_on_the_slab_cache_samples_what_a_whole_sequence_forward_samples():
    """Many turns of one session (the cache grows past its first room) equal fresh generation each turn."""
    from transformers import AutoTokenizer

    policy = HFPolicy(_gqa_model(), AutoTokenizer.from_pretrained(default_tiny_model()))
    policy.stop_token_ids = []
    session = policy.session()
    assert type(session.cache.layer_class_to_replicate) is type(slab_cache().layer_class_to_replicate)
    params = SamplingParams(max_new_tokens=40, temperature=1.0)
    seqs = [[1, 2, 3, 4, 5] * 20, [7, 8, 9] * 30]
    for turn in range(4):
        seeds = [turn * 10 + r for r in range(2)]
        got = session.generate([0, 1], seqs, params, seeds=seeds)
        want = policy.generate(seqs, params, seeds=seeds)
        for g, w in zip(got, want):
            assert g.token_ids == w.token_ids
            assert max(abs(a - b) for a, b in zip(g.logprobs, w.logprobs)) < 1e-4
        seqs = [s + g.token_ids + [11, 12, 13] for s, g in zip(seqs, got)]
    assert session.cache.get_seq_length() > 256


def test_released_rows_leave_no_columns_behind_and_the_others_sample_as_before():
    """A long row released: the columns only it used are dropped, the short row that stays and a row that
    joins afterwards sample exactly what a fresh forward over their whole sequences samples."""
    from transformers import AutoTokenizer

    policy = HFPolicy(_gqa_model(), AutoTokenizer.from_pretrained(default_tiny_model()))
    policy.stop_token_ids = []
    session = policy.session()
    params = SamplingParams(max_new_tokens=8, temperature=1.0)
    long_row, short_row = [3, 4, 5, 6] * 30, [9, 10]
    first = session.generate(["long", "short"], [long_row, short_row], params, seeds=[1, 2])
    width_before = session.mask.shape[1]
    session.release(["long"])
    assert session.mask.shape[1] < width_before and session.cache.get_seq_length() == session.mask.shape[1]
    short_seq = short_row + first[1].token_ids + [7]
    joined = [1, 2, 3, 4, 5]
    got = session.generate(["short", "new"], [short_seq, joined], params, seeds=[5, 6])
    want = policy.generate([short_seq, joined], params, seeds=[5, 6])
    for g, w in zip(got, want):
        assert g.token_ids == w.token_ids and max(abs(a - b) for a, b in zip(g.logprobs, w.logprobs)) < 1e-4


def test_a_compacted_session_with_grouped_prefill_samples_as_before():
    """Rows fed very different amounts each turn (one sits a turn out) are prefilled in groups on copies of their
    cache and leave holes; the session compacts its cache, and every row still samples what a fresh forward over
    its whole sequence samples, including a row asked again with nothing new (its last id un-fed and fed again
    after the slots moved)."""
    from transformers import AutoTokenizer

    import agentgym_opd.policy.hf as hf

    policy = HFPolicy(_gqa_model(initializer_range=0.3), AutoTokenizer.from_pretrained(default_tiny_model()))
    policy.stop_token_ids = []
    session = policy.session()
    params = SamplingParams(max_new_tokens=6, temperature=1.0)
    seqs = {"a": [3, 4, 5] * 20, "b": [9, 10], "c": [6, 7] * 5}
    removed, grouped = [], []
    compact, row_cache = hf.KVSession._compact, hf.KVSession._row_cache

    def counting_compact(self):
        before = self.mask.shape[1]
        compact(self)
        removed.append(before - self.mask.shape[1])

    def counting_row_cache(self, index):
        grouped.append(len(index))
        return row_cache(self, index)

    hf.KVSession._compact, hf.KVSession._row_cache = counting_compact, counting_row_cache
    try:
        for turn in range(5):
            keys = ["a", "b", "c"] if turn != 2 else ["a", "c"]  # b sits turn 2 out: a hole column per position
            seeds = [turn * 10 + i for i in range(len(keys))]
            got = session.generate(keys, [seqs[k] for k in keys], params, seeds=seeds)
            want = policy.generate([seqs[k] for k in keys], params, seeds=seeds)
            for key, g, w in zip(keys, got, want):
                assert g.token_ids == w.token_ids and max(abs(x - y) for x, y in zip(g.logprobs, w.logprobs)) < 1e-4
                long_one = "a" if turn % 2 == 0 else "c"  # the longest observation moves between rows, as in a game
                seqs[key] = seqs[key] + g.token_ids + ([1, 2] * 15 if key == long_one else [5])
        again = session.generate(["b"], [seqs["b"]], params, seeds=[99])  # nothing new since its last call
        assert again[0].token_ids == policy.generate([seqs["b"]], params, seeds=[99])[0].token_ids
    finally:
        hf.KVSession._compact, hf.KVSession._row_cache = compact, row_cache
    assert sum(removed) > 0  # holes were dropped
    assert grouped and max(grouped) < 3  # some calls prefilled groups of rows, not the whole batch
    assert session.cache.get_seq_length() == session.mask.shape[1]


def test_steps_go_on_with_the_unfinished_rows_and_sample_as_the_whole_batch_would(monkeypatch):
    """Rows that stop at different steps: once at most a quarter of them still decode, the steps run on a copy of
    their cache, and their columns join the session's cache at the end of the call. Every row samples the same
    tokens and log-probs as with the whole batch stepping to the end, turn after turn (so the joined columns
    hold the right keys in the right slots)."""
    from transformers import AutoTokenizer

    import agentgym_opd.policy.hf as hf

    policy = HFPolicy(_gqa_model(initializer_range=0.3), AutoTokenizer.from_pretrained(default_tiny_model()))
    policy.stop_token_ids = list(range(0, 64, 5))  # a fifth of the vocabulary ends a row: rows end at many steps
    params = SamplingParams(max_new_tokens=10, temperature=1.0)
    step_rows: list[int] = []  # rows in each one-token forward of the session
    forward = policy.model.forward

    def recording_forward(*args, **kwargs):
        ids = kwargs["input_ids"]
        if ids.shape[1] == 1:
            step_rows.append(ids.shape[0])
        return forward(*args, **kwargs)

    keys = [f"row{i}" for i in range(8)]
    seqs = {k: [3 + i, 4, 7 + 2 * i] * (2 + i) for i, k in enumerate(keys)}
    session, shrink_below = policy.session(), hf.SHRINK_BELOW
    for turn in range(4):
        seeds = [turn * 100 + i for i in range(len(keys))]
        monkeypatch.setattr(policy.model, "forward", recording_forward)
        got = session.generate(keys, [seqs[k] for k in keys], params, seeds=seeds)
        monkeypatch.setattr(policy.model, "forward", forward)
        monkeypatch.setattr(hf, "SHRINK_BELOW", 0.0)  # the reference: the whole batch steps to the end
        want = policy.generate([seqs[k] for k in keys], params, seeds=seeds)
        monkeypatch.setattr(hf, "SHRINK_BELOW", shrink_below)
        for key, g, w in zip(keys, got, want):
            assert g.token_ids == w.token_ids and g.finish_reason == w.finish_reason
            assert max(abs(x - y) for x, y in zip(g.logprobs, w.logprobs)) < 1e-4
            seqs[key] = seqs[key] + g.token_ids + [1, 2, 3][: 1 + turn % 3]
    assert min(step_rows) <= len(keys) * shrink_below < max(step_rows)  # the steps went on with a few rows, not all
    assert session.cache.get_seq_length() == session.mask.shape[1]


@pytest.mark.parametrize("mask_kind", ["none", "bool", "bool per head", "additive"])
def test_decode_attention_is_sdpa_with_grouped_heads(mask_kind):
    """The one-token decode path (bf16 on CPU) computes SDPA's function: in float32 it equals SDPA with
    `enable_gqa` (head grouping, scale and masks right), and in bf16 it stays within the rounding of its bf16
    scores of a float64 reference (HF eager attention's numerics; the fused kernel is 5-8x slower there)."""
    from agentgym_opd.policy.kv_cache import decode_attention

    torch.manual_seed(0)
    b, heads, kv_heads, length, d = 5, 9, 3, 37, 16
    q, k, v = torch.randn(b, heads, 1, d) * 2, torch.randn(b, kv_heads, length, d) * 2, torch.randn(b, kv_heads, length, d)
    keep = torch.rand(b, 1, 1, length) > 0.3
    keep[..., -1] = True  # a decode step always sees its own token
    mask = {"none": None, "bool": keep, "bool per head": keep.expand(b, heads, 1, length).clone(),
            "additive": torch.zeros(b, 1, 1, length).masked_fill(~keep, float("-inf"))}[mask_kind]
    reference = torch.nn.functional.scaled_dot_product_attention(
        q.double(), k.double(), v.double(), attn_mask=None if mask is None else mask if mask.dtype == torch.bool else mask.double(),
        enable_gqa=True).transpose(1, 2)
    exact = decode_attention(q, k, v, mask)
    assert exact.shape == (b, 1, heads, d)
    torch.testing.assert_close(exact.double(), reference, rtol=1e-5, atol=1e-5)
    bf16 = decode_attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), None if mask is None else mask if mask.dtype == torch.bool else mask.bfloat16())
    assert bf16.dtype == torch.bfloat16 and (bf16.double() - reference).abs().max() < 0.1


def test_bf16_decode_steps_take_the_decode_path_and_match_a_whole_sequence_forward(monkeypatch):
    """Under bf16 autocast a cached one-token step goes through `decode_attention`, and its logits are those of a
    whole-sequence forward (the fused kernel) at that position, within bf16 rounding, with the same argmax."""
    import agentgym_opd.policy.kv_cache as kv
    from transformers import AutoTokenizer

    from agentgym_opd.policy.precision import enable_autocast

    policy = HFPolicy(enable_autocast(_gqa_model(), "bfloat16"), AutoTokenizer.from_pretrained(default_tiny_model()))
    calls = []
    real = kv.decode_attention
    monkeypatch.setattr(kv, "decode_attention", lambda *a, **k: calls.append(1) or real(*a, **k))
    ids = torch.randint(0, 64, (3, 12))
    with torch.no_grad():
        out = policy.model(input_ids=ids, use_cache=True)
        assert not calls  # a prefill is not a decode step
        nxt = out.logits[:, -1:].argmax(-1)
        step = policy.model(input_ids=nxt, past_key_values=out.past_key_values, use_cache=True).logits[:, -1]
        assert calls, "a one-token bf16 step must take the decode path"
        whole = policy.model(input_ids=torch.cat([ids, nxt], 1)).logits[:, -1]
    torch.testing.assert_close(step, whole, rtol=0.02, atol=0.02)
    assert torch.equal(step.argmax(-1), whole.argmax(-1))
