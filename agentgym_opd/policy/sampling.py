"""Token sampling shared by backends that sample in Python (the HF backend).

Kept apart from the model code so the rule "which distribution were the log-probs taken from" is in one
place.

Per-row seeds without per-row generators: row r's uniform number at decoding step s is a hash of
``(seed_r, s)`` (a counter-based generator, like Philox or JAX's keys), computed for all rows in one
tensor expression. A row's tokens therefore depend on its own seed and on nothing else in the batch, and
the whole batch is sampled in one vectorised call (inverse CDF with ``searchsorted``), with no Python
loop over rows.
"""

from __future__ import annotations

from typing import Sequence

import torch

from agentgym_opd.policy.base import SamplingParams

_MASK32 = 0xFFFFFFFF


def sampling_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Apply temperature, top-k and top-p to [B, V] logits (filtered entries become -inf)."""
    scaled = logits / params.temperature if params.temperature > 0 else logits
    if params.top_k and params.top_k < scaled.shape[-1]:
        kth = torch.topk(scaled, params.top_k, dim=-1).values[..., -1:]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_logits, order = torch.sort(scaled, dim=-1, descending=True)
        cum = torch.softmax(sorted_logits, dim=-1).cumsum(-1)
        drop_sorted = (cum - torch.softmax(sorted_logits, dim=-1)) >= params.top_p  # keep the token crossing top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        scaled = scaled.masked_fill(drop, float("-inf"))
    return scaled


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer finaliser (good avalanche) on int64 tensors holding values in [0, 2**32).

    Products may wrap around int64; only their low 32 bits are kept, and those are exact either way.
    """
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & _MASK32
    x = x ^ (x >> 15)
    x = (x * 0x846CA68B) & _MASK32
    return x ^ (x >> 16)


def row_seed_words(seeds: Sequence[int], device: torch.device | str = "cpu") -> torch.Tensor:
    """``[B, 2]`` int64: the low and high 32-bit words of each row's seed taken modulo 2**64."""
    words = [[s & _MASK32, (s >> 32) & _MASK32] for s in (int(s) % (1 << 64) for s in seeds)]
    return torch.tensor(words, dtype=torch.int64, device=device).reshape(-1, 2)


def row_uniforms(seed_words: torch.Tensor, step: int) -> torch.Tensor:
    """``[B]`` float64 uniforms in [0, 1): a pure function of each row's seed and the step (53 random bits)."""
    lo, hi = seed_words[:, 0], seed_words[:, 1]
    key = _mix32(lo ^ _mix32(hi ^ 0x9E3779B9))
    a = _mix32(key ^ ((2 * step) & _MASK32))
    b = _mix32(_mix32(key ^ 0x85EBCA6B) ^ ((2 * step + 1) & _MASK32))
    bits = (a >> 5) * (1 << 26) + (b >> 6)  # 27 + 26 bits
    return bits.to(torch.float64) / float(1 << 53)


def draw(logits: torch.Tensor, params: SamplingParams, seed_words: torch.Tensor, step: int) -> torch.Tensor:
    """Pick one token per row: argmax when temperature is 0, else inverse CDF at the row's uniform."""
    if params.temperature == 0:
        return logits.argmax(-1)
    probs = torch.softmax(sampling_logits(logits, params), dim=-1)
    cdf = probs.cumsum(-1)
    u = row_uniforms(seed_words.to(cdf.device), step).to(cdf.dtype) * cdf[:, -1]
    picked = torch.searchsorted(cdf, u[:, None]).squeeze(-1)
    return picked.clamp(max=logits.shape[-1] - 1)


def row_seeds(batch: int, seed: int | None, seeds: Sequence[int | None] | None) -> list[int]:
    """One seed per row: explicit per-row seeds win, else seed+row, else a random seed."""
    out = []
    for row in range(batch):
        s = seeds[row] if seeds is not None else (None if seed is None else seed + row)
        out.append(int(torch.randint(0, 2**62, ()).item()) if s is None else int(s))
    return out
