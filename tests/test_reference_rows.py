"""The reference rows of a candidate student: the bench's own tasks per seed, without and with context."""

from __future__ import annotations

import pytest

from agentgym_opd.policy.tiny import default_tiny_model
from evaluation.bench.episodes import eval_env_args, eval_task_ids, evaluate_policy, load_frozen_policy
from evaluation.bench.reference_rows import main, reference_rows
from evaluation.bench.settings import BenchSettings

SPLIT = "household/valid_unseen"


@pytest.mark.slow
def test_rows_cover_each_seeds_own_tasks_and_match_the_benchs_evaluation(capsys):
    settings = BenchSettings.full(base_models="auto", seeds=[0, 1], eval_episodes=2, max_turns=3)
    model = str(default_tiny_model())
    rows = reference_rows(model, settings, SPLIT)
    seed_tasks = {seed: eval_task_ids(SPLIT, settings, seed) for seed in (0, 1)}
    assert not set(seed_tasks[0]) & set(seed_tasks[1])  # each seed adds its own held-out tasks
    pairs = {(seed, task) for seed, ids in seed_tasks.items() for task in ids}
    assert set(rows.plain) == set(rows.context) == pairs and len(pairs) == 4
    # the same greedy play as the bench's evaluation of one seed alone
    episodes, _ = evaluate_policy(load_frozen_policy(model, settings), SPLIT, settings,
                                  env_args=eval_env_args(SPLIT, settings), tasks=seed_tasks[1])
    assert {(1, e.task.id): float(e.success) for e in episodes} == {k: v for k, v in rows.plain.items() if k[0] == 1}
    assert rows.gain == rows.rate(rows.context) - rows.rate(rows.plain)
    assert main([model, "--seeds", "0", "--eval-episodes", "1"]) == 0
    out = capsys.readouterr().out
    assert "warm_start+context" in out and "(1 episodes)" in out
