"""Prefill buckets: independent prompts of different lengths grouped by length before a batched forward.

Why: a batch is padded to its longest prompt, so one batch of prompts from 500 to 1,500 tokens spends a third
of its prefill on padding, and attention over a padded batch builds a ``[rows, L, L]`` mask. Buckets of
similar length, each within a padded-token budget, avoid both (`HFPolicy.generate`, SAGE-OPD's scored judge).
"""

from __future__ import annotations

from typing import Callable, Sequence

PREFILL_TOKEN_BUDGET = 8192
"""Padded prompt tokens one bucket's prefill may hold (rows x its longest prompt): 8 prompts of 1,000 tokens.
Past a handful of rows a bigger batch buys nothing on a CPU (the prefill is compute-bound), and each row
of a bucket pays for the bucket's longest prompt."""


def length_buckets(lengths: Sequence[int], token_budget: int) -> list[list[int]]:
    """Indices of ``lengths`` grouped longest first into buckets of at most ``token_budget`` padded tokens
    (a bucket's row count times its longest length); a prompt longer than the budget is a bucket alone."""
    return _longest_first(lengths, lambda bucket, i: (len(bucket) + 1) * lengths[bucket[0]] <= token_budget)


def _longest_first(lengths: Sequence[int], joins: Callable[[list[int], int], bool]) -> list[list[int]]:
    """Indices of ``lengths`` taken longest first (ties in index order), each joining the current group when
    ``joins(group, index)`` (the group's first index is its longest), else starting the next one."""
    groups: list[list[int]] = []
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        if groups and joins(groups[-1], i):
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups


PREFILL_GROUP_RATIO = 0.5
"""A session's rows join one prefill group while their new text is at least this share of the group's longest."""


def prefill_groups(lengths: Sequence[int], ratio: float = PREFILL_GROUP_RATIO) -> list[list[int]]:
    """Indices of a session call's rows (their new ids' ``lengths``) grouped for prefill: one group when padding
    all to the longest wastes at most a quarter of the chunk, else longest first, a row joining the current group
    while its length is at least ``ratio`` of the group's longest. `KVSession` prefills each group on a copy of its
    rows' cache; the copy costs memory traffic, so the whole batch stays one chunk when padding is small."""
    if not lengths:
        return []
    longest, real = max(lengths), sum(lengths)
    if longest * len(lengths) <= 1.25 * real:
        return [list(range(len(lengths)))]
    return _longest_first(lengths, lambda group, i: lengths[i] >= ratio * lengths[group[0]])
