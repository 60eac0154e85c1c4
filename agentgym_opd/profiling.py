"""Where a training step's time and memory go: rollout, teacher scoring, update.

On-policy distillation is bound by whichever of the three is slowest (published OPD runs spend most of a
step scoring with the teacher), so every step records the seconds and the peak memory of each phase in
``metrics.jsonl`` (``time/<phase>_s``, ``mem/<phase>_peak_mb``). Phases nest: teacher scoring runs inside
the update, and the update's seconds exclude it, so the three times add up to the step.

Peak memory is the CUDA allocator's peak on a GPU, else the process's resident-set high-water mark
(Linux ``VmHWM``, reset per phase through ``/proc/self/clear_refs``); where neither is available the
memory fields are absent.
"""

from __future__ import annotations

import contextlib
import time
from typing import Iterator

import torch

_ACTIVE: "PhaseMeter | None" = None


def _rss_high_water_mb() -> float | None:
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


class PhaseMeter:
    """Seconds and peak memory per named phase of one step (see the module docstring)."""

    def __init__(self, device: str | torch.device = "cpu"):
        self.cuda = torch.device(device).type == "cuda" and torch.cuda.is_available()
        self.seconds: dict[str, float] = {}
        self.peaks: dict[str, float] = {}
        self._stack: list[list] = []  # [name, start time, running peak, seconds of nested phases]
        self._can_reset_rss = True

    # ------------------------------------------------------------------ memory probes
    def _reset_peak(self) -> None:
        if self.cuda:
            torch.cuda.reset_peak_memory_stats()
        elif self._can_reset_rss:
            try:
                with open("/proc/self/clear_refs", "w", encoding="ascii") as fh:
                    fh.write("5")
            except OSError:
                self._can_reset_rss = False

    def _read_peak(self) -> float | None:
        if self.cuda:
            return torch.cuda.max_memory_allocated() / 2**20
        return _rss_high_water_mb() if self._can_reset_rss else None

    # ------------------------------------------------------------------ phases
    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        if self._stack:  # the parent's peak so far is kept before the probe is reset for the child
            parent = self._stack[-1]
            parent[2] = max(filter(None, [parent[2], self._read_peak()]), default=None)
        self._reset_peak()
        self._stack.append([name, time.perf_counter(), None, 0.0])
        try:
            yield
        finally:
            name, start, running, nested = self._stack.pop()
            elapsed = time.perf_counter() - start
            peak = max(filter(None, [running, self._read_peak()]), default=None)
            self.seconds[name] = self.seconds.get(name, 0.0) + elapsed - nested
            if peak is not None:
                self.peaks[name] = max(self.peaks.get(name, 0.0), peak)
            if self._stack:
                parent = self._stack[-1]
                parent[3] += elapsed
                parent[2] = max(filter(None, [parent[2], peak]), default=None)
                self._reset_peak()

    def record(self) -> dict[str, float]:
        out = {f"time/{name}_s": s for name, s in self.seconds.items()}
        out.update({f"mem/{name}_peak_mb": m for name, m in self.peaks.items()})
        return out


@contextlib.contextmanager
def metering(meter: PhaseMeter) -> Iterator[PhaseMeter]:
    """Make ``meter`` the one `phase` reports to while a step runs."""
    global _ACTIVE
    previous, _ACTIVE = _ACTIVE, meter
    try:
        yield meter
    finally:
        _ACTIVE = previous


def phase(name: str) -> contextlib.AbstractContextManager:
    """Time a phase on the step's meter; nothing when no step is being metered (tests, scripts)."""
    return _ACTIVE.phase(name) if _ACTIVE is not None else contextlib.nullcontext()
