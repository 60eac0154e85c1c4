"""Comparing two loops on a noisy, shared machine: short interleaved rounds, the best round of each.

Other processes only ever add time to a round, never remove it, so the fastest round of a mode is the
closest to its true cost (the reasoning behind ``timeit``'s advice to take the minimum). Rounds of the
modes alternate, so slow drift (CPU clocks, a neighbour's job) hits both alike.
"""

from __future__ import annotations

import time
from typing import Callable


def best_round_rates(modes: dict[str, Callable[[int], int]], seconds: float, round_s: float = 0.2) -> dict[str, float]:
    """Steps/s of each mode's fastest round. ``modes[name](k)`` plays episode ``k`` and returns its steps;
    every round restarts at episode 0, so each round of each mode does the same work."""
    rounds = max(3, int(seconds / (round_s * len(modes))))
    best = {name: 0.0 for name in modes}
    for _ in range(rounds):
        for name, episode in modes.items():
            steps, k, start = 0, 0, time.perf_counter()
            while True:
                steps += episode(k)
                k += 1
                elapsed = time.perf_counter() - start
                if elapsed >= round_s:
                    break
            best[name] = max(best[name], steps / elapsed)
    return best
