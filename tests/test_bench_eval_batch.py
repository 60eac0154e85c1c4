"""A bench evaluation's batch and progress: `--eval-batch` bounds how many games it plays side by side (its
memory; the games and their outcomes stay the same: an ended game's slot goes to the next task), and it writes
the games ended so far for the bench's progress bar."""

from __future__ import annotations

from pathlib import Path
from unittest import mock

import pytest

import agentgym_opd.vector as vector
from evaluation.bench.episodes import eval_env_args, evaluate_policy, load_frozen_policy
from evaluation.bench.pipeline import run_bench
from evaluation.bench.settings import BenchError, BenchSettings

STUDENT = Path(__file__).resolve().parents[1] / "evaluation/bench/base_pair/student-a25d7777da/model"
UNSEEN = "household/valid_unseen"


def test_an_evaluation_plays_at_most_eval_batch_games_side_by_side_with_the_same_outcomes(monkeypatch):
    slots: list[int] = []
    make = vector.VectorTextEnv.make

    def counted(env_id, num_envs, **kwargs):
        slots.append(num_envs)
        return make(env_id, num_envs, **kwargs)

    monkeypatch.setattr(vector.VectorTextEnv, "make", staticmethod(counted))
    outcomes = {}
    for batch in (None, 2):
        settings = BenchSettings(eval_batch=batch, max_turns=6, device="cpu")
        policy = load_frozen_policy(str(STUDENT), settings)
        episodes, _ = evaluate_policy(policy, UNSEEN, settings, env_args=eval_env_args(UNSEEN, settings),
                                      tasks=_task_ids(settings)[:5])
        outcomes[batch] = [(e.task.id, e.success, [t.action for t in e.turns]) for e in episodes]
    assert slots == [5, 2]  # all five at once by default; two side by side with --eval-batch 2
    assert outcomes[2] == outcomes[None]


def _task_ids(settings: BenchSettings) -> list[str]:
    from evaluation.bench.episodes import make_env

    env = make_env(UNSEEN, settings, eval_env_args(UNSEEN, settings))
    try:
        return list(env.task_ids())
    finally:
        env.close()


def test_an_eval_batch_below_one_game_is_a_setup_error(tmp_path):
    with pytest.raises(BenchError, match="--eval-batch must be at least 1"):
        run_bench(BenchSettings(eval_batch=0, output_dir=str(tmp_path), progress=False))


def test_an_evaluation_writes_the_games_it_has_ended_for_the_progress_bar(tmp_path):
    settings = BenchSettings(max_turns=3, device="cpu")
    policy = load_frozen_policy(str(STUDENT), settings)
    progress = tmp_path / "jobs" / "parts" / "x.progress"
    seen: list[str] = []
    original = Path.write_text

    def spy(self, text, *args, **kwargs):
        if self == progress:
            seen.append(text)
        return original(self, text, *args, **kwargs)

    with mock.patch.object(Path, "write_text", spy):
        evaluate_policy(policy, UNSEEN, settings, env_args=eval_env_args(UNSEEN, settings),
                        tasks=_task_ids(settings)[:3], progress_file=progress)
    assert seen == ["0/3", "1/3", "2/3", "3/3"]
    assert not progress.exists()  # removed once the split is played
