"""Where a candidate student sits before any bench run: its `warm_start` and `warm_start+context` rows.

The bench's bands are set on these two rows (a warm start in 0.1-0.4 of `valid_unseen`, a context gain of at
least 0.15), and a new student recipe or checkpoint has to pass them before a 14-minute bench is worth running.
This evaluates a model folder exactly as the bench's reference jobs do (greedy, the bench's turns and tokens,
the base pair's env options, each seed's own block of held-out tasks), without and with each task's privileged
context in its prompt, in about a minute on one core:

    python -m evaluation.bench.reference_rows PATH/TO/MODEL [--split household/valid_unseen] [--seeds 0,1,2]
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any


@dataclass
class ReferenceRows:
    """Greedy success per (seed, task), without and with the privileged context."""

    plain: dict[tuple[int, str], float]
    context: dict[tuple[int, str], float]

    @staticmethod
    def rate(outcomes: dict[tuple[int, str], float]) -> float:
        return sum(outcomes.values()) / len(outcomes)

    @property
    def gain(self) -> float:
        return self.rate(self.context) - self.rate(self.plain)


def reference_rows(model: str, settings: Any, env_id: str) -> ReferenceRows:
    """The bench's two reference rows of ``model`` on ``env_id``: every seed's tasks, played once each."""
    from evaluation.bench.episodes import evaluate_every_seed, load_frozen_policy

    policy = load_frozen_policy(model, settings)
    rows = []
    for with_context in (False, True):
        by_seed, by_task, _ = evaluate_every_seed(policy, env_id, settings, with_context=with_context)
        rows.append({(seed, task): float(by_task[task].success) for seed, ids in by_seed.items() for task in ids})
    return ReferenceRows(*rows)


def main(argv: list[str] | None = None) -> int:
    import torch

    from evaluation.bench.settings import BenchSettings

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", help="the student's model folder (e.g. a base model's .../model)")
    parser.add_argument("--split", default="household/valid_unseen")
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated bench seeds (each has its own tasks)")
    parser.add_argument("--eval-episodes", type=int, default=BenchSettings.eval_episodes, help="tasks per seed")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    settings = BenchSettings.full(base_models="auto", seeds=[int(s) for s in args.seeds.split(",")],
                                  eval_episodes=args.eval_episodes)
    rows = reference_rows(args.model, settings, args.split)
    print(f"| {args.split} ({len(rows.plain)} episodes) | warm_start | warm_start+context | gain |\n|---|---|---|---|")
    print(f"| {args.model} | {rows.rate(rows.plain):.3f} | {rows.rate(rows.context):.3f} | {rows.gain:+.3f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
