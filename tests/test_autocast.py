"""`model.autocast`: every forward of a policy's model (whole model, body, head) under torch.autocast, float32
weights and float32 logits; on the tiny model, so it runs anywhere CPU bf16 autocast does."""

from __future__ import annotations

import copy

import pytest
import torch

from agentgym_opd.config import ModelConfig
from agentgym_opd.policy.hf import final_hidden_states, output_logits
from agentgym_opd.policy.loading import load_student
from agentgym_opd.policy.precision import autocast_dtype, autocast_of, enable_autocast



def _projection_dtypes(model) -> list[torch.dtype]:
    """Record the output dtype of every Linear inside the body during the next forwards."""
    seen: list[torch.dtype] = []
    for module in model.get_decoder().modules():
        if isinstance(module, torch.nn.Linear):
            module.register_forward_hook(lambda m, a, out: seen.append(out.dtype))
    return seen


@pytest.fixture
def tiny():
    return load_student("tiny", ModelConfig(), trainable=True)


def test_without_autocast_everything_is_float32(tiny):
    seen = _projection_dtypes(tiny.model)
    out = tiny.model(input_ids=torch.tensor([[1, 2, 3]]))
    assert out.logits.dtype == torch.float32 and set(seen) == {torch.float32}
    assert autocast_of(tiny.model) is None


def test_autocast_runs_projections_in_bf16_keeps_weights_and_logits_float32(tiny):
    ids = torch.tensor([[5, 6, 7, 8, 9]])
    reference = tiny.model(input_ids=ids).logits
    enable_autocast(tiny.model, "bfloat16")
    seen = _projection_dtypes(tiny.model)
    out = tiny.model(input_ids=ids)
    assert torch.bfloat16 in seen and out.logits.dtype == torch.float32
    assert all(p.dtype == torch.float32 for p in tiny.model.parameters())
    # bf16 products, not another model: the log-probs agree closely
    diff = (out.logits.log_softmax(-1) - reference.log_softmax(-1)).abs().max()
    assert 0 < float(diff.detach()) < 0.1
    # the gradient reaches float32 weights
    out.logits.log_softmax(-1)[0, :-1].gather(-1, ids[:, 1:].T).sum().backward()
    grads = [p.grad for p in tiny.model.parameters() if p.grad is not None]
    assert grads and all(g.dtype == torch.float32 for g in grads)
    # autocast ends with the forward: code after it computes in float32
    assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.float32


def test_the_chunked_scoring_path_autocasts_too(tiny):
    enable_autocast(tiny.model, "bfloat16")
    seen = _projection_dtypes(tiny.model)
    ids = torch.tensor([[5, 6, 7]])
    hidden = final_hidden_states(tiny.model, ids, torch.ones_like(ids))
    logits = output_logits(tiny.model, hidden)
    assert torch.bfloat16 in seen and logits.dtype == torch.float32


def test_a_deep_copy_autocasts_its_own_weights(tiny):
    """An EMA teacher is a deep copy: it must autocast and run its own weights, not the original's."""
    enable_autocast(tiny.model, "bfloat16")
    twin = copy.deepcopy(tiny.model)
    with torch.no_grad():
        for p in twin.parameters():
            p.mul_(0.5)
    ids = torch.tensor([[5, 6, 7]])
    seen = _projection_dtypes(twin)
    assert not torch.allclose(twin(input_ids=ids).logits, tiny.model(input_ids=ids).logits)
    assert torch.bfloat16 in seen and autocast_of(twin) == torch.bfloat16


def test_enable_is_idempotent_and_the_config_key_applies_it():
    policy = load_student("tiny", ModelConfig(autocast="bfloat16"), trainable=False)
    assert autocast_of(policy.model) == torch.bfloat16
    hooks = len(policy.model._forward_pre_hooks)
    enable_autocast(policy.model, "bfloat16")
    assert len(policy.model._forward_pre_hooks) == hooks


def test_an_unknown_setting_is_a_clear_error():
    with pytest.raises(ValueError, match="use none, bfloat16 or float16"):
        autocast_dtype("int8")
    assert autocast_dtype("none") is None


def test_a_whole_decode_runs_in_one_autocast_context(tiny):
    """Each hooked forward would otherwise open and close its own context, which drops autocast's cache of the
    weights' bf16 casts: every one-token forward would cast every weight again (decoding measured 0.75x float32).
    A probe hook registered before the autocast hooks sees whether a context is already open."""
    from agentgym_opd.policy.base import SamplingParams

    outer: list[bool] = []
    tiny.model.register_forward_pre_hook(lambda module, args: outer.append(_autocast_on()))
    enable_autocast(tiny.model, "bfloat16")
    tiny.generate([[5, 6, 7], [8, 9]], SamplingParams(max_new_tokens=4, temperature=0.0))
    assert len(outer) >= 4 and all(outer)
    outer.clear()
    tiny.model(input_ids=torch.tensor([[5, 6, 7]]))  # a single forward outside decoding opens its own
    assert outer == [False]


def _autocast_on() -> bool:
    try:
        return torch.is_autocast_enabled("cpu")
    except TypeError:  # older torch
        return torch.is_autocast_cpu_enabled()
