"""Token sampling shared by backends that sample in Python (the HF backend).

Kept apart from the model code so the rule "which distribution were the log-probs taken from" is in one
place. Each row draws from its own `torch.Generator`, so a row's tokens depend on its own seed only, not on
which other prompts happen to share the batch: that is what makes a rollout reproducible by seed.
"""

from __future__ import annotations

import torch

from agentgym_opd.policy.base import SamplingParams


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


def draw(logits: torch.Tensor, params: SamplingParams, generators: list[torch.Generator | None]) -> torch.Tensor:
    """Pick one token per row: argmax when temperature is 0, else inverse-CDF with the row's generator."""
    if params.temperature == 0:
        return logits.argmax(-1)
    probs = torch.softmax(sampling_logits(logits, params), dim=-1)
    cdf = probs.cumsum(-1)
    u = torch.stack([torch.rand((), generator=g, dtype=cdf.dtype) for g in generators]) * cdf[:, -1]
    picked = torch.searchsorted(cdf, u[:, None]).squeeze(-1)
    return picked.clamp(max=logits.shape[-1] - 1)


def row_generators(batch: int, seed: int | None, seeds: list[int | None] | None) -> list[torch.Generator]:
    """One generator per row: explicit per-row seeds win, else seed+row, else a random seed."""
    gens = []
    for row in range(batch):
        s = seeds[row] if seeds is not None else (None if seed is None else seed + row)
        if s is None:
            s = int(torch.randint(0, 2**62, ()).item())
        g = torch.Generator()
        g.manual_seed(int(s))
        gens.append(g)
    return gens
