"""Decode-time memory traffic of the HF backend: a KV cache that grows in place, and GQA without copies.

Why: on a CPU a decode step of a small model is bound by memory traffic, not arithmetic. Measured on
SmolLM2-135M (30 layers, 3 KV heads of 9 query heads) at batch 8 and 1,024 cached tokens, a step moved
about 400 KB per cached token per row: Transformers' `DynamicLayer` appends by `torch.cat` (the whole
cache is copied every token), and with an attention mask its SDPA path repeats the KV heads for every
query head (`repeat_kv`: three more copies) before attending. Both are avoidable:

- `SlabLayer` keeps each layer's keys and values in a buffer with spare room along the sequence axis and
  writes new positions in place; the model sees views of the filled part. The buffer grows by an eighth
  (at least 64 positions) when full, so copies are amortised O(1) per token and the spare room stays small.
- `gqa_sdpa` is Transformers' SDPA attention with the KV heads shared through SDPA's own `enable_gqa`
  (no materialised repeat), registered under the name `"gqa_sdpa"` in Transformers' attention registry.

Both give the same numbers as the stock path (same kernels, same order of operations per head), except under
bf16 / fp16 autocast:

- `SlabLayer` stores the keys in the values' dtype. The rotary embedding leaves the keys in float32 while the
  values come out of their projection in bf16, so a float32 key cache was half again the cache's size, and every
  prefill's attention cast all of it to bf16 first (autocast runs SDPA in bf16): storing them in bf16 is the same
  rounding, done once per token.
- A one-token decode step on a CPU: there torch's fused SDPA kernel runs 5-8x slower than in float32 (one thread,
  140 rows x 1,000 cached tokens: 137 ms a layer against 17 ms for two batched matrix products).
  `decode_attention` computes that step as two matrix products instead, over the slab's whole buffers (a bf16
  product copies an operand whose rows are not contiguous, as the filled part of a buffer with spare room is
  not): the scores as keys x query (the tall product is the fast one in bf16: 64 rows x 800 cached tokens, one
  thread, 0.9 ms a layer against 3.0 ms for float32 keys), softmax in float32, the weighted sum of the values.
  Its numbers differ from the fused kernel's within bf16 rounding (`tests/test_kv_cache.py`).
"""

from __future__ import annotations

from typing import Any

import torch
from transformers.cache_utils import DynamicCache

try:  # Transformers >= 4.54 builds caches from layer objects; an older one (e.g. a vLLM venv's) keeps its own
    from transformers.cache_utils import DynamicLayer
except ImportError:  # pragma: no cover - depends on the installed Transformers
    DynamicLayer = None  # type: ignore[assignment,misc]

GQA_SDPA = "gqa_sdpa"
SLAB_BUFFER = "slab_buffer"  # attribute of a `SlabLayer.update` keys / values view: its whole buffer (values: zero
# past the view)


class SlabLayer(DynamicLayer or object):  # type: ignore[misc]
    """A `DynamicLayer` whose `keys` / `values` are views into a buffer that grows in place."""

    def __init__(self, *args: Any, **kwargs: Any):
        self._k: torch.Tensor | None = None
        self._v: torch.Tensor | None = None
        self._nk = self._nv = 0  # filled positions (kept apart: inherited code assigns keys, then values)
        self._v_tail_zero = False
        super().__init__(*args, **kwargs)

    # `DynamicLayer`'s own methods assign whole tensors (reset, crop, batch selection): accept them as the new
    # buffer with no spare room, so every inherited method keeps working.
    @property
    def keys(self) -> torch.Tensor | None:  # type: ignore[override]
        return self._k if self._k is None or self._k.dim() != 4 else self._k[:, :, : self._nk]

    @keys.setter
    def keys(self, value: torch.Tensor | None) -> None:
        self._k = value
        self._nk = value.shape[-2] if value is not None and value.dim() == 4 else 0

    @property
    def values(self) -> torch.Tensor | None:  # type: ignore[override]
        return self._v if self._v is None or self._v.dim() != 4 else self._v[:, :, : self._nv]

    @values.setter
    def values(self, value: torch.Tensor | None) -> None:
        self._v = value
        self._nv = value.shape[-2] if value is not None and value.dim() == 4 else 0
        self._v_tail_zero = False  # an assigned tensor (a crop's view, say) may hold anything past the filled part

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any):
        key_states = key_states.to(value_states.dtype)  # bf16 under autocast, as attention reads them (module doc)
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        n, t = self._nk, key_states.shape[-2]
        if self._nv != n:
            raise RuntimeError(f"KV cache layer out of step: {n} keys but {self._nv} values")
        if self._k is None or self._k.dim() != 4 or min(self._k.shape[-2], self._v.shape[-2]) < n + t:  # type: ignore[union-attr]
            self._grow(key_states, value_states, n + t)
        self._k[:, :, n:n + t] = key_states  # type: ignore[index]
        self._v[:, :, n:n + t] = value_states  # type: ignore[index]
        self._nk = self._nv = n + t
        keys, values = self.keys, self.values
        if keys is not None:  # `decode_attention` reads the whole buffers: no copy
            setattr(keys, SLAB_BUFFER, self._k)
        if self._v_tail_zero and values is not None:
            setattr(values, SLAB_BUFFER, self._v)
        return keys, values

    def rows(self, index: torch.Tensor) -> "SlabLayer | None":
        """A new layer holding the rows ``index`` of this one: each buffer gathered whole, spare room included, so a
        prefill appending to the copy writes in place (one pass over those rows instead of a gather, a new buffer and
        a copy into it). None when this layer holds no buffer."""
        if self._k is None or self._k.dim() != 4 or self._v is None or self._v.dim() != 4:
            return None
        layer = SlabLayer()
        layer.lazy_initialization(self._k, self._v)
        layer._k, layer._v = self._k.index_select(0, index), self._v.index_select(0, index)
        layer._nk = layer._nv = self._nk
        layer._v_tail_zero = self._v_tail_zero
        return layer

    def _grow(self, key_states: torch.Tensor, value_states: torch.Tensor, needed: int) -> None:
        capacity = needed + max(64, needed // 8)
        b, h, _, d = key_states.shape
        k = key_states.new_zeros((b, h, capacity, d))
        v = value_states.new_zeros((b, h, capacity, value_states.shape[-1]))
        n = self._nk
        if self._k is not None and self._k.dim() == 4 and n:
            k[:, :, :n] = self._k[:, :, :n]
            v[:, :, :n] = self._v[:, :, :n]  # type: ignore[index]
        self._k, self._v = k, v
        self._v_tail_zero = True  # appends fill it in order, so every slot past the filled part stays zero


def slab_cache() -> DynamicCache:
    """A `DynamicCache` whose layers are `SlabLayer`s (made lazily, one per decoder layer, as usual)."""
    cache = DynamicCache()
    if DynamicLayer is not None and hasattr(cache, "layer_class_to_replicate"):
        cache.layer_class_to_replicate = SlabLayer
    return cache


def gqa_sdpa(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
             attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
             **kwargs: Any) -> tuple[torch.Tensor, None]:
    """SDPA attention over shared KV heads (`enable_gqa`), mask or not; [B, T, heads, d] out like the stock one."""
    groups = getattr(module, "num_key_value_groups", 1)
    mask = attention_mask
    if mask is not None and mask.dim() == 4:
        mask = mask[:, :, :, : key.shape[-2]]
    if query.shape[2] == 1 and query.device.type == "cpu" and not dropout:
        low = torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else query.dtype
        if low in (torch.bfloat16, torch.float16):  # the fused kernel's slow case (module docstring)
            with torch.autocast("cpu", enabled=False):
                return decode_attention(query, key, value, mask, scaling).to(low), None
    is_causal = query.shape[2] > 1 and mask is None and getattr(module, "is_causal", True)
    out = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=mask, dropout_p=dropout, scale=scaling, is_causal=is_causal,
        enable_gqa=groups > 1)
    return out.transpose(1, 2).contiguous(), None


def decode_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None,
                     scaling: float | None = None) -> torch.Tensor:
    """One new token's attention over the cache, [B, 1, heads, d] out: ``softmax(q k^T * scale + mask) v`` with
    the query heads grouped by the KV head they share (query head i reads KV head i // groups, as `enable_gqa`
    and `repeat_kv` do). Scores in the keys' dtype, softmax in float32, the weighted sum in the values' dtype.
    ``mask``: boolean (True attends) or additive, [B, 1 or heads, 1, kv]. A key or value view from
    `SlabLayer.update` is read through its whole buffer (module docstring)."""
    b, heads, _, d = query.shape
    kv_heads, length = key.shape[1], key.shape[2]
    groups = heads // kv_heads
    scale = d ** -0.5 if scaling is None else scaling
    q = query.reshape(b, kv_heads, groups, d).to(key.dtype)
    keys = getattr(key, SLAB_BUFFER, key)
    scores = torch.matmul(keys, q.transpose(-1, -2)).transpose(-1, -2)[..., :length].float() * scale  # [B, kv, g, L]
    if mask is not None:
        mask = mask.reshape(b, 1, 1, length) if mask.shape[1] == 1 else mask.reshape(b, kv_heads, groups, length)
        scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask.float()
    weights = torch.softmax(scores, dim=-1).to(value.dtype)
    whole = getattr(value, SLAB_BUFFER, None)
    if whole is not None and whole.shape[2] > length:  # zero weights on the buffer's zero tail
        weights, value = torch.nn.functional.pad(weights, (0, whole.shape[2] - length)), whole
    return torch.matmul(weights, value).reshape(b, 1, heads, d)


def register_gqa_sdpa() -> None:
    """Make `"gqa_sdpa"` a Transformers attention implementation (idempotent)."""
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.masking_utils import sdpa_mask

    AttentionInterface.register(GQA_SDPA, gqa_sdpa)
    AttentionMaskInterface.register(GQA_SDPA, sdpa_mask)
