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

Both give the same numbers as the stock path (same kernels, same order of operations per head).
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


class SlabLayer(DynamicLayer or object):  # type: ignore[misc]
    """A `DynamicLayer` whose `keys` / `values` are views into a buffer that grows in place."""

    def __init__(self, *args: Any, **kwargs: Any):
        self._k: torch.Tensor | None = None
        self._v: torch.Tensor | None = None
        self._nk = self._nv = 0  # filled positions (kept apart: inherited code assigns keys, then values)
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

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any):
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
        return self.keys, self.values

    def _grow(self, key_states: torch.Tensor, value_states: torch.Tensor, needed: int) -> None:
        capacity = needed + max(64, needed // 8)
        b, h, _, d = key_states.shape
        k = key_states.new_empty((b, h, capacity, d))
        v = value_states.new_empty((b, h, capacity, value_states.shape[-1]))
        n = self._nk
        if self._k is not None and self._k.dim() == 4 and n:
            k[:, :, :n] = self._k[:, :, :n]
            v[:, :, :n] = self._v[:, :, :n]  # type: ignore[index]
        self._k, self._v = k, v


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
    is_causal = query.shape[2] > 1 and mask is None and getattr(module, "is_causal", True)
    out = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=mask, dropout_p=dropout, scale=scaling, is_causal=is_causal,
        enable_gqa=groups > 1)
    return out.transpose(1, 2).contiguous(), None


def register_gqa_sdpa() -> None:
    """Make `"gqa_sdpa"` a Transformers attention implementation (idempotent)."""
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.masking_utils import sdpa_mask

    AttentionInterface.register(GQA_SDPA, gqa_sdpa)
    AttentionMaskInterface.register(GQA_SDPA, sdpa_mask)
