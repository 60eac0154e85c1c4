"""The base pair's training: AdamW on next-token cross-entropy over the agent's tokens, a warm-up and a cosine
schedule, one unpadded row at a time (see `accumulate_batch_gradient` for why)."""

from __future__ import annotations

import math
import random
from pathlib import Path
from typing import Any

from evaluation.bench.base_models import BaseModelSpec


def learning_rate(step: int, spec: BaseModelSpec) -> float:
    """Linear warm-up, then cosine decay to a tenth of the peak at ``schedule_steps`` (default: ``steps``)."""
    if step < spec.warmup_steps:
        return spec.lr * (step + 1) / spec.warmup_steps
    horizon = spec.schedule_steps or spec.steps
    progress = (step - spec.warmup_steps) / max(1, horizon - spec.warmup_steps)
    return spec.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0))))


def action_spans(loss_mask: list[int]) -> list[tuple[int, int]]:
    """[start, end) of each run of agent tokens (one action and its end-of-turn token)."""
    spans, i = [], 0
    while i < len(loss_mask):
        if loss_mask[i]:
            j = i
            while j < len(loss_mask) and loss_mask[j]:
                j += 1
            spans.append((i, j))
            i = j
        else:
            i += 1
    return spans


def token_weights(loss_mask: list[int], decision_weight: float) -> list[float]:
    """Per-token loss weights: 1 on agent tokens, ``decision_weight`` on the first token of each action (the
    decision: most of an action is copied from the observation, the verb is chosen, and the rare choices
    such as taking the wanted object are the ones a small model misses), 0 elsewhere."""
    weights = [float(m) for m in loss_mask]
    for start, _ in action_spans(loss_mask):
        weights[start] = decision_weight
    return weights


def accumulate_batch_gradient(model: Any, rows: list[tuple[list[int], list[int]]], decision_weight: float = 1.0) -> float:
    """Backpropagate the batch's weighted token-mean cross-entropy on its agent tokens (`token_weights`);
    returns the loss.

    One row at a time, unpadded: with no attention mask attention takes its fused causal kernel (about twice
    as fast on CPU as a padded batch), and the rows' gradients add up to the batch mean's. The LM head runs
    only where a loss is taken (the agent's tokens, ~10% of positions): for a small model the vocabulary
    projection is most of the compute."""
    import torch

    weights = [token_weights(m, decision_weight)[1:] for _, m in rows]
    total = sum(sum(w) for w in weights)  # the batch's weighted loss tokens: the mean is over all of them
    batch_loss = 0.0
    for (seq, m), w in zip(rows, weights):
        ids = torch.tensor([seq])
        where = torch.tensor(m[1:], dtype=torch.bool)
        hidden = model.model(input_ids=ids).last_hidden_state[0, :-1]
        per_token = torch.nn.functional.cross_entropy(model.lm_head(hidden[where]), ids[0, 1:][where], reduction="none")
        loss = (per_token * torch.tensor(w)[where]).sum() / total
        loss.backward()
        batch_loss += float(loss.detach())
    return batch_loss


def train_on_examples(model: Any, examples: list[tuple[list[int], list[int]]], spec: BaseModelSpec, *,
                      progress: bool = True, progress_file: Path | None = None) -> list[float]:
    """AdamW on seeded mini-batches; returns the loss of every step. ``progress_file`` gets the number of
    steps done every 10 steps (overwritten; a reader in another process turns it into a bar with an ETA)."""
    import torch
    from tqdm import tqdm

    torch.manual_seed(spec.seed)
    rng = random.Random(f"base-model-batches/{spec.seed}")
    model.train()
    optimiser = torch.optim.AdamW(model.parameters(), lr=spec.lr, weight_decay=0.01)
    losses = []
    order: list[int] = []
    bar = tqdm(range(spec.steps), desc=f"base model {spec.name}", unit="step", disable=not progress)
    for step in bar:
        if len(order) < spec.batch_size:
            fresh = list(range(len(examples)))
            rng.shuffle(fresh)
            order += fresh
        rows = [examples[order.pop()] for _ in range(spec.batch_size)]
        for group in optimiser.param_groups:
            group["lr"] = learning_rate(step, spec)
        optimiser.zero_grad(set_to_none=True)
        step_loss = accumulate_batch_gradient(model, rows, spec.decision_weight)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimiser.step()
        losses.append(step_loss)
        bar.set_postfix(loss=f"{losses[-1]:.3f}")
        if progress_file is not None and ((step + 1) % 10 == 0 or step + 1 == spec.steps):
            progress_file.write_text(f"{step + 1}\n", encoding="utf-8")
    model.eval()
    return losses
