"""The command line: listing envs and algorithms, and a person playing an env through stdin."""

from __future__ import annotations

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


def test_algos_lists_every_method_as_a_table_and_as_json(tmp_path):
    out = cli("algos", "--json", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    listed = {a["id"]: a["description"] for a in json.loads(out.stdout)}
    assert {"sft", "grpo", "opd", "opsd", "sdpo", "lopd", "sage_opd", "vpd"} <= set(listed)
    assert all(listed.values())
    assert any(line.startswith("opd ") for line in cli("algorithms", cwd=tmp_path).stdout.splitlines())


def test_play_takes_env_options_as_env_arg_like_train_and_eval(tmp_path):
    # status_line=true restates the task after every step: visible right after the first action
    out = cli("play", "household/train", "--seed", "1", "--env-arg", "status_line=true", stdin="look\nquit\n", cwd=tmp_path)
    plain = cli("play", "household/train", "--seed", "1", stdin="look\nquit\n", cwd=tmp_path)
    assert out.returncode == 0 and plain.returncode == 0, out.stderr + plain.stderr
    assert "You are not carrying anything" in out.stdout and "You are not carrying anything" not in plain.stdout
    bad = cli("play", "household/train", "--env-arg", "status_line", cwd=tmp_path)
    assert bad.returncode != 0 and "--env-arg expects KEY=VALUE" in bad.stderr
