"""The evaluation runner on the embedded household world with scripted agents, and records it writes."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from evaluation.leaderboard import Leaderboard
from evaluation.metrics import summarise
from agentgym_opd.executors import make_vector_env
from agentgym_opd.playing import play_tasks
from agentgym_opd.policy.scripted import ScriptedPolicy
from evaluation.runner import evaluate_scripted, select_tasks


def test_walkthrough_oracle_solves_every_selected_task():
    record = evaluate_scripted("household/valid_unseen", "walkthrough", episodes=24, progress=False)
    assert record["n_episodes"] == 24 and record["split"] == "valid_unseen"
    assert record["metrics"]["success_rate"] == {"mean": 1.0, "stderr": 0.0}
    assert record["metrics"]["error_rate"]["mean"] == 0.0


def test_random_agent_is_reproducible_by_seed_and_reports_pass_at_k():
    a = evaluate_scripted("household/train", "random", episodes=6, samples_per_task=3, seed=4, progress=False, max_turns=8)
    b = evaluate_scripted("household/train", "random", episodes=6, samples_per_task=3, seed=4, progress=False, max_turns=8)
    assert a["metrics"] == b["metrics"] and "pass@1" in a["metrics"] and "pass@5" not in a["metrics"]


def test_errors_are_counted_by_kind():
    vec = make_vector_env("household/train", 2, max_turns=5)
    episodes = play_tasks(ScriptedPolicy(lambda obs, info: "dance wildly"), vec, vec.envs[0].task_ids()[:4])
    assert [e.num_turns for e in episodes] == [5] * 4
    metrics = summarise(episodes)
    assert metrics["error_rate/invalid_action"]["mean"] == 1.0 and metrics["success_rate"]["mean"] == 0.0


def test_task_selection_is_stable_and_spread():
    ids = [f"t{i}" for i in range(10)]
    assert select_tasks(ids, 5) == ["t0", "t2", "t4", "t6", "t8"] and select_tasks(ids, None) == ids
    with pytest.raises(ValueError, match="at least 1"):
        select_tasks(ids, 0)


@pytest.mark.slow
def test_eval_cli_record_goes_onto_the_leaderboard(tmp_path):
    out = tmp_path / "rec.json"
    proc = subprocess.run([sys.executable, "-m", "agentgym_opd.cli", "eval", "--policy", "walkthrough", "--env",
                           "household/valid_seen", "--episodes", "12", "--out", str(out)],
                          capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    record = json.loads(out.read_text())
    assert record["metrics"]["success_rate"]["mean"] == 1.0
    # eval stamps what it writes: the command that made it, ready to publish as it is
    assert record["provenance"]["command"] == ["agentgym-opd", "eval", "--policy", "walkthrough", "--env",
                                               "household/valid_seen", "--episodes", "12", "--out", str(out)]
    assert record["origin"] == "original" and len(record["provenance"]["tasks_sha256"]) == 64
    # beside it, one line per episode as for a model, the first --transcripts (default 10) with every turn
    lines = [json.loads(line) for line in (tmp_path / "rec.episodes.jsonl").read_text().splitlines()]
    assert [line["index"] for line in lines] == list(range(12)) and all(line["success"] for line in lines)
    assert sum("transcript" in line for line in lines) == 10 and lines[0]["transcript"]["turns"][0]["action"]
    board = Leaderboard(tmp_path / "lb")
    board.add(out)
    board.build()
    assert "| household/valid_seen | walkthrough | scripted:walkthrough |" in (tmp_path / "lb" / "LEADERBOARD.md").read_text()


def test_eval_stamps_the_command_as_typed_even_when_an_env_import_rewrites_sys_argv(tmp_path, monkeypatch):
    """ALFWorld's and TextWorld's imports overwrite sys.argv; the record must still name the command typed."""
    from agentgym_opd import cli
    from evaluation import eval_command

    out = tmp_path / "rec.json"
    typed = ["eval", "--policy", "walkthrough", "--env", "household/valid_seen", "--episodes", "2", "--out", str(out)]
    monkeypatch.setattr(sys, "argv", ["agentgym-opd", *typed])
    real_records = eval_command._records

    def records_after_an_import_that_rewrites_argv(*args, **kwargs):
        sys.argv = ["agentgym-opd", "domain"]  # what `import alfworld.agents...` leaves behind
        return real_records(*args, **kwargs)

    monkeypatch.setattr(eval_command, "_records", records_after_an_import_that_rewrites_argv)
    assert cli.main() == 0
    assert json.loads(out.read_text())["provenance"]["command"] == ["agentgym-opd", *typed]
