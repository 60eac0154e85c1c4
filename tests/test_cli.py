"""The command line: listing envs and algorithms, and a person playing an env through stdin."""

from __future__ import annotations

import pytest
import json
import subprocess
import sys


def cli(*args: str, stdin: str = "", cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "agentgym_opd.cli", *args], input=stdin, capture_output=True,
                          text=True, timeout=120, cwd=cwd)


def test_envs_lists_the_embedded_worlds_with_descriptions(tmp_path):
    out = cli("envs", "--json", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    listed = {e["id"]: e["description"] for e in json.loads(out.stdout)}
    for env_id in ("household/train", "household/valid_seen", "household/valid_unseen"):
        assert env_id in listed and listed[env_id]
    table = cli("envs", cwd=tmp_path).stdout
    assert any(line.startswith("household/valid_unseen ") for line in table.splitlines())


def test_play_by_numbers_and_text_until_the_episode_ends(tmp_path):
    from agentgym_opd import make

    env = make("household/valid_unseen")
    _, info = env.reset(seed=0)
    walkthrough = info["task"].privileged["walkthrough"]
    # the first action by its number in the admissible list, the rest typed, then garbage is never reached
    first = info["admissible_actions"].index(walkthrough[0])
    keys = "\n".join([str(first), *walkthrough[1:]]) + "\n"
    out = cli("play", "household/valid_unseen", "--seed", "0", stdin=keys, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "admissible actions:" in out.stdout and f"> {walkthrough[0]}" in out.stdout
    assert "episode over" in out.stdout and "success=True" in out.stdout


def test_play_shows_errors_and_quits_cleanly(tmp_path):
    out = cli("play", "household/train", "--seed", "1", stdin="fly to the moon\nquit\n", cwd=tmp_path)
    assert out.returncode == 0 and "(error: [invalid_action]" in out.stdout


def test_unknown_env_id_suggests_close_matches(tmp_path):
    out = cli("play", "household/valid_unsen", stdin="", cwd=tmp_path)
    assert out.returncode == 2 and "household/valid_unseen" in out.stderr and "Traceback" not in out.stderr


@pytest.mark.slow
def test_algos_lists_every_method_as_a_table_and_as_json(tmp_path):
    out = cli("algos", "--json", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    listed = {a["id"]: a["description"] for a in json.loads(out.stdout)}
    assert {"sft", "grpo", "opd", "opsd", "sdpo", "lopd", "sage_opd", "vpd"} <= set(listed)
    assert all(listed.values())
    assert any(line.startswith("opd ") for line in cli("algorithms", cwd=tmp_path).stdout.splitlines())


@pytest.mark.slow
def test_play_takes_env_options_as_env_arg_like_train_and_eval(tmp_path):
    # status_line=true restates the task after every step: visible right after the first action
    out = cli("play", "household/train", "--seed", "1", "--env-arg", "status_line=true", stdin="look\nquit\n", cwd=tmp_path)
    plain = cli("play", "household/train", "--seed", "1", stdin="look\nquit\n", cwd=tmp_path)
    assert out.returncode == 0 and plain.returncode == 0, out.stderr + plain.stderr
    assert "You are not carrying anything" in out.stdout and "You are not carrying anything" not in plain.stdout
    bad = cli("play", "household/train", "--env-arg", "status_line", cwd=tmp_path)
    assert bad.returncode != 0 and "--env-arg expects KEY=VALUE" in bad.stderr


def _wait_for(stream, text: str, limit_s: float = 120.0) -> str:
    """Read a child's output until `text` shows up (the child is then blocked where the test wants it)."""
    import os
    import select
    import time

    seen, deadline = "", time.monotonic() + limit_s
    while text not in seen:
        ready, _, _ = select.select([stream], [], [], max(deadline - time.monotonic(), 0))
        chunk = os.read(stream.fileno(), 4096).decode() if ready else ""
        if not chunk:
            raise AssertionError(f"{text!r} never came; got {seen[-500:]!r}")
        seen += chunk
    return seen


@pytest.mark.slow
def test_a_reader_that_leaves_the_pipe_ends_the_listing_quietly(tmp_path):
    # `agentgym-opd envs | head -1`: head closes the pipe; the listing must not end in a BrokenPipe traceback
    for args in (["envs"], ["envs", "--json"], ["algos"]):
        proc = subprocess.Popen([sys.executable, "-m", "agentgym_opd.cli", *args], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, cwd=tmp_path)
        proc.stdout.close()  # the reader is gone before the first line is written
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 141, (args, err.decode())  # 128 + SIGPIPE, as `yes | head` reports for yes
        assert b"Traceback" not in err and b"Exception ignored" not in err and b"BrokenPipe" not in err


def test_ctrl_c_prints_one_line_and_exits_130(tmp_path):
    import signal

    proc = subprocess.Popen([sys.executable, "-m", "agentgym_opd.cli", "play", "household/train"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=tmp_path)
    _wait_for(proc.stdout, "\n> ")  # waiting for the player's first action
    proc.send_signal(signal.SIGINT)
    # wait before closing stdin: communicate() would send EOF at once, and on a loaded machine the child can read
    # that EOF (a normal end of input, exit 0) before the signal is delivered
    proc.wait(timeout=60)
    err = proc.stderr.read()
    proc.stdin.close()
    assert proc.returncode == 130, err.decode()
    assert err.decode().strip().splitlines() == ["interrupted; a played episode is not saved"]


def interrupt_on_third_reply(text: str, finish_reason: str):
    """An action parser that stands in for Ctrl-C on the third reply of a run (the first episode has ended)."""
    _REPLIES["n"] += 1
    if _REPLIES["n"] == 3:
        raise KeyboardInterrupt
    return "look", None


_REPLIES = {"n": 0}


@pytest.mark.slow
def test_ctrl_c_in_eval_keeps_the_finished_episodes_and_says_where(tmp_path, capsys):
    from agentgym_opd.cli import main
    from evaluation.records import validate_record

    _REPLIES["n"] = 0
    out = tmp_path / "rec.json"
    code = main(["eval", "--policy", "tiny", "--env", "household/valid_unseen", "--episodes", "2", "--max-turns", "2",
                 "--max-new-tokens", "8", "--num-envs", "1", "--device", "cpu", "--no-progress", "--out", str(out),
                 "--action-parser", "test_cli:interrupt_on_third_reply"])
    err = capsys.readouterr().err
    assert code == 130 and "Traceback" not in err
    (line,) = [x for x in err.splitlines() if x.startswith("interrupted")]
    assert line == (f"interrupted; seed 0 stopped after 1 episodes; its partial record (protocol.partial = true) "
                    f"is kept at {out}, the episodes at {tmp_path / 'rec.episodes.jsonl'}")
    record = validate_record(json.loads(out.read_text()))
    assert record["n_episodes"] == 1 and record["protocol"]["partial"] is True
    assert not list(tmp_path.glob("*.tmp"))  # written through a temporary file, which is gone


def test_an_interrupted_training_names_the_checkpoint_to_resume_from(tmp_path):
    from agentgym_opd.commands.train import kept_run_folder

    assert "no checkpoint was saved yet" in kept_run_folder(tmp_path)
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "latest").write_text("step_20")
    assert kept_run_folder(tmp_path) == (f"{tmp_path} keeps config.yaml, metrics.jsonl and checkpoints up to "
                                         f"step_20; continue with the same command plus --resume {tmp_path}")


def test_version_is_the_installed_package_version(tmp_path):
    from importlib.metadata import version

    out = cli("--version", cwd=tmp_path)
    assert out.returncode == 0 and out.stdout.strip() == f"agentgym-opd {version('agentgym-opd')}"


def test_play_refuses_an_action_number_out_of_range_and_asks_again(tmp_path):
    from agentgym_opd import make

    env = make("household/train")
    _, info = env.reset(seed=1)
    count = len(info["admissible_actions"])
    out = cli("play", "household/train", "--seed", "1", stdin=f"{count}\n0\nquit\n", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert f"(no action number {count}: pick 0-{count - 1}, or type an action)" in out.stdout
    assert "(error:" not in out.stdout  # the number was not sent to the env as an action
    assert f"> {info['admissible_actions'][0]}" in out.stdout  # the prompt came back and took a valid number


def test_leaderboard_build_reports_episode_pages_in_one_line(tmp_path, capsys):
    import shutil
    from pathlib import Path

    from agentgym_opd.cli import main

    published = sorted((Path(__file__).resolve().parents[1] / "leaderboard" / "records").glob("*.json"))
    with_episodes = [p for p in published if json.loads(p.read_text()).get("episodes")][:3]
    assert len(with_episodes) == 3
    (tmp_path / "records").mkdir()
    for path in with_episodes:
        shutil.copy(path, tmp_path / "records" / path.name)
    assert main(["leaderboard", "--root", str(tmp_path), "build"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert f"wrote 3 episode pages under {tmp_path / 'episodes'}" in lines
    assert not [line for line in lines if line.endswith(".html") and "/episodes/" in line]
    assert len(list((tmp_path / "episodes").glob("*.html"))) == 3


def test_an_action_number_is_read_only_when_it_picks_an_admissible_action():
    from agentgym_opd.cli import _action_number

    assert _action_number("3", 5) == 3 and _action_number("007", 10) == 7 and _action_number("0", 1) == 0
    assert _action_number("5", 5) is None and _action_number("99", 5) is None
    assert _action_number("9" * 5000, 5) is None  # too long for int(): out of range, no ValueError
