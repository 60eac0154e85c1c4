"""Comparing two loops on a noisy, shared machine: paired rounds on the CPU clock, the median ratio.

Each round plays the same block of episodes in every mode, back to back, and the order alternates from
round to round, so slow drift (CPU clocks, a neighbour's job) hits the modes alike. Time is this thread's
CPU time (`time.thread_time`), which leaves out the spells when the scheduler runs another process. A
round's ratio compares like with like; the median over rounds and its interquartile range say how sure
the figure is (on the 2-core build machines the IQR of the wrapper overhead is several points wide).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Callable


@dataclass
class PairedTiming:
    """Steps/s of each mode (median over rounds) and the per-round time ratios against `baseline`."""

    rates: dict[str, float]
    ratios: dict[str, list[float]]  # mode -> sorted per-round (time of mode / time of baseline)
    rounds: int

    def overhead(self, mode: str) -> tuple[float, float, float]:
        """(median, first quartile, third quartile) of the extra time `mode` takes over the baseline."""
        r = self.ratios[mode]  # paired_rounds plays at least three rounds
        q1, _, q3 = statistics.quantiles(r, n=4)
        return statistics.median(r) - 1.0, q1 - 1.0, q3 - 1.0


def paired_rounds(modes: dict[str, Callable[[int], int]], seconds: float, baseline: str,
                  block_s: float = 0.05) -> PairedTiming:
    """Play blocks of episodes in every mode for about `seconds` of CPU time in all.

    ``modes[name](k)`` plays episode ``k`` and returns its steps. A block is as many episodes as the
    baseline plays in about `block_s`; round ``i`` plays episodes ``i*block .. (i+1)*block - 1`` in each mode.
    """
    names = list(modes)
    start, block = time.thread_time(), 0
    while time.thread_time() - start < block_s:  # calibrate (and warm up) on the baseline
        modes[baseline](block)
        block += 1
    times: dict[str, list[float]] = {n: [] for n in names}
    steps: dict[str, list[int]] = {n: [] for n in names}
    deadline, first = time.thread_time() + seconds, block
    i = 0
    while i < 3 or time.thread_time() < deadline:
        for name in names if i % 2 == 0 else names[::-1]:
            episode, n, t0 = modes[name], 0, time.thread_time()
            for k in range(first + i * block, first + (i + 1) * block):
                n += episode(k)
            times[name].append(time.thread_time() - t0)
            steps[name].append(n)
        i += 1
    rates = {n: statistics.median(s / t for s, t in zip(steps[n], times[n])) for n in names}
    ratios = {n: sorted(t / b for t, b in zip(times[n], times[baseline])) for n in names if n != baseline}
    return PairedTiming(rates, ratios, i)
