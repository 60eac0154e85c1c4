"""`--threads` on eval and train: torch's CPU threads for the command's process, checked before anything runs."""

from __future__ import annotations

import pytest
import torch

from agentgym_opd.cli import main
from agentgym_opd.cpu_threads import apply_threads


@pytest.fixture
def restore_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_eval_runs_on_the_threads_it_is_given(tmp_path, restore_threads, monkeypatch):
    seen = []
    import evaluation.eval_command as eval_command

    real = eval_command._records
    monkeypatch.setattr(eval_command, "_records", lambda *a, **k: (seen.append(torch.get_num_threads()), real(*a, **k))[1])
    torch.set_num_threads(2)
    assert main(["eval", "--policy", "tiny", "--env", "household/valid_unseen", "--episodes", "1", "--max-turns", "1",
                 "--max-new-tokens", "2", "--threads", "1", "--no-progress"]) == 0
    assert seen == [1]


def test_zero_threads_is_an_error_naming_the_fix(tmp_path, restore_threads, capsys):
    code = main(["train", "--algo", "sft", "--env", "household/train", "--student", "tiny", "--threads", "0",
                 f"output_dir={tmp_path / 'run'}"])
    assert code == 2
    assert "--threads needs at least 1 thread, got 0; leave it out for torch's default" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_no_flag_leaves_torch_alone(restore_threads):
    torch.set_num_threads(2)
    apply_threads(None)
    assert torch.get_num_threads() == 2
