"""VPD's phase bookkeeping: which optimiser steps a batch gets (E-step updates, M-steps), the counters that
decide it, and their checkpoint.

Kept apart from :mod:`algorithms.vpd` (the method: feedback C, BCO E-step, KL M-step) because it is
scheduling, not the paper's formula. The rules:

- ``schedule=alternate``: one phase per batch. An E-step is due at the first batch and after every
  ``m_steps_per_e_step`` M-steps; otherwise the batch gets one M-step;
- ``schedule=inner``: every batch gets the E-step, then ``m_steps_per_e_step`` M-steps;
- an E-step is ``e_updates`` optimiser steps at ``e_lr_scale`` times the learning rate;
- ``one_sided=skip``: a due E-step on a batch without chosen or without rejected rows is skipped (and an
  M-step runs instead);
- a batch where no row has a C gets no step at all (nothing to learn);
- the row counts are summed over ranks before planning, so every rank plans the same steps.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agentgym_opd.algorithm import Step


@dataclass
class Phase:
    """Which step the next update runs, from the counters VPD checkpoints."""

    e_steps: int = 0
    m_steps: int = 0
    m_since_e: int = 0

    def e_due(self, m_per_e: int) -> bool:
        return self.e_steps == 0 or self.m_since_e >= m_per_e

    def ran_e(self) -> None:
        self.e_steps += 1
        self.m_since_e = 0

    def ran_m(self) -> None:
        self.m_steps += 1
        self.m_since_e += 1

    def state_dict(self) -> dict[str, int]:
        return vars(self).copy()

    @classmethod
    def from_state(cls, state: dict[str, int]) -> "Phase":
        return cls(**state)


def plan_steps(config: Any, phase: Phase, kept: float, chosen: float,
               rejected: float) -> tuple[list[Step], dict[str, float]]:
    """The batch's optimiser steps and the metrics that say which phase ran.

    ``config``: a :class:`algorithms.vpd.VPDConfig`; ``kept``/``chosen``/``rejected``: the batch's rows with a
    C, successful ones and failed ones among them, summed over every rank."""
    metrics = {"phase_e": 0.0, "phase_m": 0.0, "e_skipped": 0.0, "nothing_to_learn": 0.0}
    if kept == 0:  # no row has any feedback: nothing to learn, and no optimiser step (no drift)
        metrics["nothing_to_learn"] = 1.0
        return [], metrics
    plan: list[Step] = []
    run_e = config.schedule == "inner" or phase.e_due(config.m_steps_per_e_step)
    if run_e and config.one_sided == "skip" and (chosen == 0 or rejected == 0):
        run_e, metrics["e_skipped"] = False, 1.0
    if run_e:
        plan += [Step("e", config.e_lr_scale)] * config.e_updates
        metrics["phase_e"] = 1.0
    if config.schedule == "inner" or not run_e:
        plan += [Step("m")] * (config.m_steps_per_e_step if config.schedule == "inner" else 1)
        metrics["phase_m"] = 1.0
    return plan, metrics
