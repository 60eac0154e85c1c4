"""Publishing: provenance, the committed leaderboard, third-party records, and `leaderboard reproduce`."""

from __future__ import annotations

import argparse
import copy
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import agentgym_opd
from evaluation.leaderboard import Leaderboard
from evaluation.provenance import env_tasks_sha256, tasks_sha256, weights_sha256
from evaluation.records import RecordError, record_id, validate_record
from test_leaderboard import make_record

REPO = Path(__file__).resolve().parents[1]
COMMITTED = REPO / "leaderboard"
CLI = [sys.executable, "-m", "agentgym_opd.cli"]


def committed_records() -> list[dict]:
    return Leaderboard(COMMITTED).load_records()


# ----------------------------------------------------------------------------------------------------
# The committed leaderboard
# ----------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_committed_page_matches_what_build_makes_from_the_committed_records(tmp_path):
    out = subprocess.run(CLI + ["leaderboard", "--root", str(COMMITTED), "build", "--check"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    # and --check is a real check: a changed record makes the committed outputs stale
    copy_root = tmp_path / "lb"
    shutil.copytree(COMMITTED, copy_root)
    victim = sorted((copy_root / "records").glob("*.json"))[0]
    record = json.loads(victim.read_text())
    record["metrics"]["success_rate"]["mean"] = 0.123456 if record["metrics"]["success_rate"]["mean"] != 0.123456 else 0.5
    victim.write_text(json.dumps(record))
    stale = subprocess.run(CLI + ["leaderboard", "--root", str(copy_root), "build", "--check"], capture_output=True, text=True)
    assert stale.returncode == 1 and "LEADERBOARD.md" in stale.stderr


def test_committed_records_carry_provenance_budget_and_episodes():
    records = committed_records()
    assert records, "leaderboard/records/ is empty"
    algos = {r["algorithm"] for r in records}
    assert {"sft", "grpo", "opd", "sage_opd"} <= algos
    for r in records:
        p = r["provenance"]
        assert p["command"][:2] == ["agentgym-opd", "bench"] or p["command"][:2] == ["agentgym-opd", "eval"]
        assert len(p["tasks_sha256"]) == 64 and p["weights_sha256"] and p["packages"]["torch"] != "not installed"
        assert r.get("origin", "original") in ("original", "reproduced")
    traced = [r for r in records if r.get("episodes") and r["algorithm"] in ("opd", "sage_opd")]
    assert traced and all(any(t["divergence"] for ep in r["episodes"] for t in ep["turns"]) for r in traced)
    assert any(t["turn_weight"] is not None for r in traced if r["algorithm"] == "sage_opd"
               for ep in r["episodes"] for t in ep["turns"])


# ----------------------------------------------------------------------------------------------------
# Provenance
# ----------------------------------------------------------------------------------------------------


def test_task_hash_follows_ids_and_content():
    env = agentgym_opd.make("household/valid_seen")
    ids = env.task_ids()[:3]
    tasks = [env.get_task(t) for t in ids]
    base = tasks_sha256(tasks)
    assert base == env_tasks_sha256("household/valid_seen", ids)
    assert tasks_sha256(tasks[::-1]) != base  # order
    changed = copy.deepcopy(tasks)
    object.__setattr__(changed[1], "instruction", changed[1].instruction + " ")
    assert tasks_sha256(changed) != base  # content, not just ids


@pytest.mark.slow
def test_weights_hash_follows_the_weights():
    import torch

    from agentgym_opd.policy.hf import HFPolicy
    from agentgym_opd.policy.tiny import default_tiny_model

    policy = HFPolicy.from_pretrained(default_tiny_model())
    before = weights_sha256(policy)
    assert before == weights_sha256(policy)
    with torch.no_grad():
        next(policy.model.parameters()).view(-1)[0] += 1e-3
    assert weights_sha256(policy) != before


@pytest.mark.parametrize("quick, flags", [
    (True, []),
    (True, ["--seeds", "5,", "--lr", "0.001", "--algos", "opd,grpo", "--eval-batch", "16"]),
    (False, ["--seeds", "0,1", "--steps", "8", "--env-arg", "num_tasks=6", "--algo-set", "grpo:algo.kl_coef=0.01"]),
    (False, ["--base-models", "off", "--no-references", "--algos", "opd"]),
])
def test_bench_command_rebuilt_from_settings_means_the_same_settings(quick, flags):
    from evaluation.bench.command import add_arguments, settings_from_args
    from evaluation.bench.publish import bench_command

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    settings = settings_from_args(parser.parse_args((["--quick"] if quick else []) + flags + ["--output-dir", "/x"]))
    argv = bench_command(settings.__dict__)
    assert argv[:2] == ["agentgym-opd", "bench"]
    again = settings_from_args(parser.parse_args(argv[2:]))
    assert again.__dict__ == settings.__dict__


# ----------------------------------------------------------------------------------------------------
# Third-party records and reproduction
# ----------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_plugin_methods_record_is_accepted_and_a_different_protocol_is_marked(tmp_path):
    board = Leaderboard(tmp_path / "lb")
    bench_section = {"bench": {"max_new_tokens": 16, "max_turns": 8, "budget_episodes": 64}}
    board.add(make_record("opd", 0, 0.5, algorithm_config=bench_section))
    plugin = make_record("my_lab_opd", 0, 0.6, algorithm_config={"lr": 1e-4},
                         protocol={"temperature": 0.7, "samples": 1, "max_new_tokens": 16, "max_turns": 8,
                                   "action_parser": "text"},
                         budget={"rollout_episodes": 64, "tokens": 9000})
    path = tmp_path / "plugin.json"
    path.write_text(json.dumps(plugin))
    out = subprocess.run(CLI + ["leaderboard", "--root", str(tmp_path / "lb"), "add", str(path)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    md = (tmp_path / "lb" / "LEADERBOARD.md").read_text()
    # another protocol is another track: the plugin's row ranks first in a table of its own, marked, and the
    # bench's OPD row ranks first in the bench's track, unmarked (neither is ranked against the other)
    bench_track, other_track = md.split("## household: from tiny-llama, teacher smollm2-135m, protocol ")[:2]
    assert "the bench's protocol" in bench_track
    opd_row = next(line for line in bench_track.splitlines() if line.startswith("| 1 |"))
    assert "| opd |" in opd_row and "*" not in opd_row and "my_lab_opd" not in bench_track
    plugin_row = next(line for line in other_track.splitlines() if line.startswith("| 1 |"))
    assert "my_lab_opd [max_new_tokens=16 max_turns=8 temperature=0.7] *" in plugin_row and "| 64 | 9000 |" in plugin_row
    html = (tmp_path / "lb" / "index.html").read_text()
    assert '<tr class="differs" data-algorithm="my_lab_opd"' in html and '<tr data-algorithm="opd"' in html


def test_an_eval_record_with_the_benchs_protocol_and_env_options_is_shown_as_the_benchs_and_without_them_is_marked(tmp_path):
    """docs/evaluate-and-publish.md "Publish a result": evaluated with the bench's settings *and* its env options, a row compares
    like the bench's; the same settings without `--env-arg` (other observations) carry the mark."""
    from agentgym_opd.action_parsing import ONE_ACTION_PROMPT
    from evaluation.records import env_args_label

    board = Leaderboard(tmp_path / "lb")
    options = {"status_line": True, "turn_counter": True}
    board.add(make_record("opd", 0, 0.5, algorithm_config={"bench": {"max_new_tokens": 16, "max_turns": 20,
                                                                     "budget_episodes": 64, "env_args": options}}))
    protocol = {"temperature": 0.0, "top_p": 1.0, "samples": 1, "max_new_tokens": 16, "max_turns": 20, "backend": "hf",
                "action_parser": "text", "system_prompt": ONE_ACTION_PROMPT, "max_context_tokens": 4096}
    board.add(make_record("my_opd", 0, 0.6, protocol={**protocol, "env_args": env_args_label({**options, "max_turns": 20})}))
    board.add(make_record("my_opd_plain", 0, 0.4, protocol=protocol))
    board.add(make_record("my_opd_prompt", 0, 0.3, protocol={**protocol, "system_prompt": "Think, then act.",
                                                             "env_args": env_args_label(options)}))
    board.add(make_record("my_opd_short_context", 0, 0.3, protocol={**protocol, "max_context_tokens": 2048,
                                                                    "env_args": env_args_label(options)}))
    board.build()
    lines = (tmp_path / "lb" / "LEADERBOARD.md").read_text().splitlines()
    row = {name: next(line for line in lines if line.startswith("| ") and f"| {name}" in line)
           for name in ("my_opd", "my_opd_plain", "my_opd_prompt", "my_opd_short_context")}
    assert "| my_opd |" in row["my_opd"] and row["my_opd"].endswith("| same as bench |")
    assert "| my_opd_plain [" in row["my_opd_plain"] and "] * |" in row["my_opd_plain"]
    assert "] * |" in row["my_opd_prompt"]  # another system prompt is another protocol too
    assert "] * |" in row["my_opd_short_context"]  # and so is another context budget

    # the same protocol on other tasks than the bench's for that seed (provenance's task hash) is marked too
    def stated(record: dict, tasks: str) -> dict:
        return {**record, "provenance": {"packages": {"torch": "2.13.0"}, "tasks_sha256": tasks * 64,
                                         "chat_template_sha256": None, "weights_sha256": None,
                                         "command": ["agentgym-opd", "eval"], "seeds": [1], "device": "cpu"}}

    board.add(stated(make_record("opd", 1, 0.5, algorithm_config={"bench": {"max_new_tokens": 16, "max_turns": 20,
                                                                            "budget_episodes": 64, "env_args": options}}), "a"))
    same = {**protocol, "env_args": env_args_label(options)}
    board.add(stated(make_record("on_the_benchs_tasks", 1, 0.6, protocol=same), "a"))
    board.add(stated(make_record("on_other_tasks", 1, 0.6, protocol=same), "b"))
    board.build()
    lines = (tmp_path / "lb" / "LEADERBOARD.md").read_text().splitlines()
    assert next(line for line in lines if "| on_the_benchs_tasks |" in line).endswith("| same as bench |")
    other = next(line for line in lines if "| on_other_tasks [" in line and line[2].isdigit())
    assert "] * |" in other and "other tasks than the bench's seeds: eval --bench-tasks" in other
    assert env_args_label({"max_turns": 20}) is None and env_args_label({"b": 1, "a": [1, 2]}) == "a=[1, 2] b=1"
    assert env_args_label({"x": "y" * 300}).startswith("#")  # too long for a cell: its fingerprint


def eval_record(tmp_path: Path, command_tail: list[str]) -> dict:
    """A record written by `agentgym-opd eval`, then stamped with its provenance by `leaderboard stamp`."""
    out = tmp_path / "rec.json"
    proc = subprocess.run(CLI + ["eval", *command_tail, "--out", str(out), "--no-progress"], capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    command = " ".join(["agentgym-opd", "eval", *command_tail])
    stamp = subprocess.run(CLI + ["leaderboard", "stamp", str(out), "--command", command], capture_output=True, text=True, cwd=tmp_path)
    assert stamp.returncode == 0, stamp.stderr
    record = validate_record(json.loads(out.read_text()))
    assert record["provenance"]["command"] == command.split() and record["origin"] == "original"
    return record


@pytest.mark.slow
def test_reproduce_reruns_a_cpu_record_and_gets_the_same_numbers(tmp_path):
    record = eval_record(tmp_path, ["--policy", "random", "--env", "household/valid_seen", "--episodes", "6"])
    env = agentgym_opd.make("household/valid_seen")
    from evaluation.runner import select_tasks

    assert record["provenance"]["tasks_sha256"] == tasks_sha256([env.get_task(t) for t in select_tasks(env.task_ids(), 6)])
    path = tmp_path / "published.json"
    path.write_text(json.dumps(record))
    root = tmp_path / "lb"
    # a rerun is published only beside the record it reproduces: refused before anything runs, then accepted
    early = subprocess.run(CLI + ["leaderboard", "--root", str(root), "reproduce", str(path), "--add"], capture_output=True, text=True)
    assert early.returncode == 2 and "publish it first" in early.stderr and "nothing was run" in early.stderr, early.stderr
    # --allow-dirty: the record states this checkout's revision, which is +dirty while work is uncommitted
    assert subprocess.run(CLI + ["leaderboard", "--root", str(root), "add", str(path), "--no-build", "--allow-dirty"]).returncode == 0
    ok = subprocess.run(CLI + ["leaderboard", "--root", str(root), "reproduce", str(path), "--add", "--allow-dirty"],
                        capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr + ok.stdout
    assert "same numbers" in ok.stdout and "success_rate" in ok.stdout
    reproduced = [r for r in Leaderboard(root).load_records() if r.get("origin") == "reproduced"]
    assert len(reproduced) == 1 and reproduced[0]["reproduces"] == record_id(record)
    assert reproduced[0]["metrics"] == record["metrics"]

    # a published number that the code does not give back is reported with its distance in standard errors
    tampered = copy.deepcopy(record)
    for name in ("mean_turns", "score"):
        tampered["metrics"][name]["mean"] += 1.0
        tampered["metrics"][name]["stderr"] = 0.5
    path.write_text(json.dumps(tampered))
    bad = subprocess.run(CLI + ["leaderboard", "--root", str(root), "reproduce", str(path)], capture_output=True, text=True)
    assert bad.returncode == 1 and "numbers differ" in bad.stdout
    for name in ("mean_turns", "score"):
        line = next(x for x in bad.stdout.splitlines() if x.startswith(name + " "))
        se = (0.5 ** 2 + record["metrics"][name]["stderr"] ** 2) ** 0.5
        assert float(line.split()[-1]) == pytest.approx(-1.0 / se, abs=0.01), line


def test_reproduce_runs_only_the_projects_own_commands(tmp_path):
    record = make_record(provenance={"packages": {"python": "3"}, "tasks_sha256": "0" * 64, "chat_template_sha256": None,
                                     "weights_sha256": None, "command": ["sh", "-c", "touch pwned"], "seeds": [0],
                                     "device": "cpu"})
    path = tmp_path / "r.json"
    path.write_text(json.dumps(record))
    out = subprocess.run(CLI + ["leaderboard", "--root", str(tmp_path / "lb"), "reproduce", str(path)],
                         capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 2 and "no reproducible command" in out.stderr and not (tmp_path / "pwned").exists()
    with pytest.raises(RecordError, match="provenance"):
        validate_record({**record, "provenance": {**record["provenance"], "command": ["agentgym-opd", "eval\n"]}})


@pytest.mark.slow
def test_reproduce_one_committed_bench_record_gives_the_same_number(tmp_path):
    """The issue's must-show: a committed bench record (grpo, held-out split) rerun on CPU, same numbers."""
    record = next(r for r in committed_records() if r["algorithm"] == "grpo" and r["split"] == "valid_unseen")
    path = tmp_path / "grpo.json"
    path.write_text(json.dumps(record))
    out = subprocess.run(CLI + ["leaderboard", "--root", str(tmp_path / "lb"), "reproduce", str(path)],
                         capture_output=True, text=True, timeout=1500)
    assert out.returncode == 0, out.stdout + out.stderr[-2000:]
    assert "same numbers" in out.stdout


@pytest.mark.slow
def test_stamp_hashes_the_evaluated_models_weights_and_chat_template(tmp_path):
    from agentgym_opd.policy.hf import HFPolicy
    from agentgym_opd.policy.tiny import default_tiny_model
    from evaluation.provenance import chat_template_sha256

    record = eval_record(tmp_path, ["--policy", "tiny", "--env", "household/valid_seen", "--episodes", "1",
                                    "--max-new-tokens", "4", "--max-turns", "1", "--device", "cpu"])
    tiny = HFPolicy.from_pretrained(default_tiny_model())
    assert record["provenance"]["weights_sha256"] == weights_sha256(tiny)
    assert record["provenance"]["chat_template_sha256"] == chat_template_sha256(tiny) is not None
    assert record["provenance"]["device"] == "cpu" and record["provenance"]["seeds"] == [0]
    wrong = subprocess.run(CLI + ["leaderboard", "stamp", str(tmp_path / "rec.json"), "--command",
                                  "agentgym-opd eval --policy tiny --env household/valid_unseen"],
                           capture_output=True, text=True, cwd=tmp_path)
    assert wrong.returncode == 2 and "not the command that wrote it" in wrong.stderr
    # the same model under another protocol than the record's: refused, naming the field and both values
    before = (tmp_path / "rec.json").read_bytes()
    other = subprocess.run(CLI + ["leaderboard", "stamp", str(tmp_path / "rec.json"), "--command",
                                  "agentgym-opd eval --policy tiny --env household/valid_seen --episodes 1 "
                                  "--max-new-tokens 16 --max-turns 1 --device cpu"], capture_output=True, text=True, cwd=tmp_path)
    assert other.returncode == 2 and "protocol.max_new_tokens (record: 4, command: 16)" in other.stderr, other.stderr
    # env options change what the model sees: a command with them does not match a record made without them
    options = subprocess.run(CLI + ["leaderboard", "stamp", str(tmp_path / "rec.json"), "--command",
                                    "agentgym-opd eval --policy tiny --env household/valid_seen --episodes 1 "
                                    "--max-new-tokens 4 --max-turns 1 --device cpu --env-arg status_line=true"],
                             capture_output=True, text=True, cwd=tmp_path)
    assert options.returncode == 2 and "protocol.env_args (record: None, command: 'status_line=true')" in options.stderr
    assert (tmp_path / "rec.json").read_bytes() == before


def test_stamp_refuses_a_command_that_disagrees_with_the_record_and_stamps_a_matching_one(tmp_path, capsys):
    """Stamping an 8-episode record with a 100-episode command would make `reproduce` rerun another
    evaluation: refused (exit 2, every file untouched) naming each field, and saying the record already
    carries provenance from `eval --out`."""
    from agentgym_opd.cli import main

    rec, other = tmp_path / "rec.json", tmp_path / "other.json"
    for path, seed in ((rec, 0), (other, 1)):
        assert main(["eval", "--policy", "random", "--env", "household/valid_seen", "--episodes", "8", "--seed", str(seed),
                     "--no-progress", "--out", str(path)]) == 0
    before = {p: p.read_bytes() for p in (rec, other)}
    capsys.readouterr()
    command = "agentgym-opd eval --policy random --env household/valid_seen --episodes {n} --seeds 0 1"
    for wrong, fields in [(command.format(n=100), ["n_episodes (record: 8, command: 100 = 100 tasks x 1 samples"]),
                          (command.format(n=8).replace("random", "walkthrough"),
                           ["algorithm (record: 'random', command: 'walkthrough')", "student (record: 'scripted:random'"]),
                          (command.format(n=8).replace("--seeds 0 1", "--seed 0"), ["other.json", "seed (record: 1, command: seeds [0])"])]:
        assert main(["leaderboard", "stamp", str(rec), str(other), "--command", wrong]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and all(f in err for f in fields), err
        assert "already carries provenance" in err and "nothing was stamped" in err
        assert {p: p.read_bytes() for p in (rec, other)} == before
    assert main(["leaderboard", "stamp", str(rec), str(other), "--command", command.format(n=8)]) == 0
    for path in (rec, other):
        record = validate_record(json.loads(path.read_text()))
        assert record["provenance"]["command"] == command.format(n=8).split() and record["provenance"]["seeds"] == [0, 1]


PLUGIN = '''"""MyOPD: OPD whose per-token signal is the Jensen-Shannon divergence (a third-party plugin method)."""
from dataclasses import dataclass

from agentgym_opd.config import constrained
from algorithms.opd import OPD, OPDConfig


@dataclass
class MyOPDConfig(OPDConfig):
    divergence: str = constrained("jsd", choices=("reverse_kl", "forward_kl", "jsd"), help="per-token divergence")


class MyOPD(OPD):
    Config = MyOPDConfig
'''


@pytest.mark.slow
def test_publish_a_result_end_to_end_with_a_plugin_method(tmp_path):
    """docs/evaluate-and-publish.md "Publish a result", step by step: a plugin package (found through its entry point, as an
    installed distribution is), train, eval, stamp, add next to the bench's rows, build, reproduce."""
    import os

    site = tmp_path / "site"
    (site / "my_lab").mkdir(parents=True)
    (site / "my_lab" / "__init__.py").write_text("")
    (site / "my_lab" / "method.py").write_text(PLUGIN)
    dist = site / "my_lab-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: my-lab\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[agentgym_opd.algorithms]\nmy_opd = my_lab.method:MyOPD\n")
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{site}"}

    def cli(*args: str) -> subprocess.CompletedProcess:
        out = subprocess.run(CLI + list(args), capture_output=True, text=True, cwd=tmp_path, env=env, timeout=900)
        assert out.returncode == 0, (args, out.stderr[-2000:])
        return out

    # the bench's starting point by its short names, as the guide's step 2 (a fresh machine has no cache folders)
    cli("train", "--algo", "my_opd", "--env", "household/train", "--student", "household-student",
        "--teacher", "household-teacher", "--env-arg", "status_line=true", "--env-arg", "goal_in_view=true",
        "--env-arg", "turn_counter=true", "--output-dir", "runs/my_opd", "--no-progress",
        "train.steps=2", "rollout.tasks_per_step=2", "rollout.max_turns=4", "rollout.max_new_tokens=8")
    command = ["eval", "--policy", "runs/my_opd", "--env", "household/valid_unseen", "--episodes", "100",
               "--bench-tasks", "--max-context-tokens", "4096", "--max-new-tokens", "16", "--max-turns", "20", "--env-arg", "status_line=true",
               "--env-arg", "goal_in_view=true", "--env-arg", "turn_counter=true", "--device", "cpu", "--no-progress"]
    cli(*command, "--out", "rec.json")
    cli("leaderboard", "stamp", "rec.json", "--command", " ".join(["agentgym-opd", *command]))
    shutil.copytree(COMMITTED, tmp_path / "lb")
    cli("leaderboard", "--root", "lb", "add", "rec.json", "--allow-dirty")  # this checkout may have uncommitted work
    record = json.loads((tmp_path / "rec.json").read_text())
    assert record["algorithm"] == "my_opd" and record["budget"]["rollout_episodes"] == 4  # 2 steps x 2 tasks
    assert record["student"] == "household-student-64x2-1000steps"  # named as the bench's rows, not by a path
    md = (tmp_path / "lb" / "LEADERBOARD.md").read_text()
    # a checkout with uncommitted work publishes the row marked "(dirty tree)" (--allow-dirty above)
    row = next(line for line in md.splitlines() if ("| my_opd |" in line or "| my_opd (dirty tree) |" in line)
               and line.startswith("| ") and line[2].isdigit())
    # greedy, 16 tokens, 20 turns, text parser, the env's prompt and the bench's env options, on the bench's
    # 100 tasks of seed 0: the bench's protocol, so named like the bench's rows and not marked
    assert " * " not in row and row.endswith("| same as bench |"), row
    assert "my_opd" in (tmp_path / "lb" / "index.html").read_text()
    again = cli("leaderboard", "reproduce", "rec.json")
    # the record carries the training behind it (the checkpoint's training.json): reproduce retrains, then evaluates
    assert record["provenance"]["training"]["models"][0]["name"] == "household-student"
    assert "phase 1/2, training (on cpu, to step_2)" in again.stdout
    assert "same numbers" in again.stdout and "weights: same as the record's" in again.stdout


# ----------------------------------------------------------------------------------------------------
# import-bench: check everything first, skip what is already published
# ----------------------------------------------------------------------------------------------------


def finished_bench(tmp_path: Path, rows: list[tuple[str, int]]) -> Path:
    """A finished bench's output folder (summary.json and records/, as `bench.save_records` names them), with
    no models in it: the tests below stand in for the checkpoints (see `no_models`)."""
    import dataclasses

    from evaluation.bench.results import bench_section
    from evaluation.bench.settings import BenchSettings

    out = tmp_path / "bench"
    settings = BenchSettings.quick(base_models="off", algos=["grpo"], output_dir=str(out))
    (out / "records").mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps({"settings": dataclasses.asdict(settings), "eval_envs": [
        "household/train", "household/valid_seen", "household/valid_unseen"]}))
    for algorithm, seed in rows:
        record = make_record(algorithm, seed, 0.25, algorithm_config={"bench": bench_section(settings)}, n_episodes=4)
        (out / "records" / f"{algorithm}__household_valid_unseen__seed{seed}.json").write_text(json.dumps(record))
    return out


@pytest.fixture
def no_models(monkeypatch):
    """import-bench without checkpoints: no model is loaded (no weights hash) and no episode replayed; the
    calls are counted."""
    import evaluation.bench.episodes
    import evaluation.bench.publish

    calls = {"load": 0, "replay": 0}

    def load(path, settings):
        calls["load"] += 1

    def replay(record, policy, settings, out, tasks, limit):
        calls["replay"] += 1
        return []

    monkeypatch.setattr(evaluation.bench.episodes, "load_frozen_policy", load)
    monkeypatch.setattr(evaluation.bench.publish, "checkpoint_of", lambda out, record, settings: out / record["algorithm"])
    monkeypatch.setattr(evaluation.bench.publish, "replay_traces", replay)
    return calls


def import_bench_cli(root: Path, out: Path) -> int:
    from agentgym_opd.cli import main

    return main(["leaderboard", "--root", str(root), "import-bench", str(out)])


def test_import_bench_twice_publishes_once_and_the_second_run_is_a_no_op(tmp_path, no_models, capsys):
    out = finished_bench(tmp_path, [("warm_start", 0), ("teacher", 0), ("grpo", 0)])
    root = tmp_path / "lb"
    assert import_bench_cli(root, out) == 0
    assert no_models["replay"] == 3 and len(list((root / "records").glob("*.json"))) == 3
    before = _files(root)
    capsys.readouterr()
    assert import_bench_cli(root, out) == 0
    stdout = capsys.readouterr().out
    assert stdout.count("already published: ") == 3 and "added " not in stdout, stdout
    assert no_models["replay"] == 3  # nothing new: no episode replayed again
    assert _files(root) == before


def test_import_bench_skips_a_published_reference_row_and_refuses_a_different_one(tmp_path, no_models, capsys):
    root = tmp_path / "lb"
    out = finished_bench(tmp_path, [("teacher", 0)])
    assert import_bench_cli(root, out) == 0  # an earlier import published the teacher's row
    out = finished_bench(tmp_path, [("teacher", 0), ("warm_start", 0), ("grpo", 0)])  # a bench that has it too
    capsys.readouterr()
    assert import_bench_cli(root, out) == 0
    stdout = capsys.readouterr().out
    assert "already published: " in stdout and "teacher__household_valid_unseen__seed0.json" in stdout, stdout
    assert sorted(r["algorithm"] for r in Leaderboard(root).load_records()) == ["grpo", "teacher", "warm_start"]
    assert subprocess.run(CLI + ["leaderboard", "--root", str(root), "build", "--check"]).returncode == 0

    # the teacher's row measured again by a later bench (`bench --algos sft`): another wall time and date,
    # the same numbers: the same result, skipped, and the new sft row is published
    teacher = out / "records" / "teacher__household_valid_unseen__seed0.json"
    again = json.loads(teacher.read_text())
    again["algorithm_config"]["bench"]["train_wall_time_s"] = 12.0
    teacher.write_text(json.dumps({**again, "wall_time_s": 99.0, "created": "2026-12-06T10:00:00+00:00"}))
    finished_bench(tmp_path, [("sft", 0)])
    capsys.readouterr()
    assert import_bench_cli(root, out) == 0
    assert "already published: " in capsys.readouterr().out
    assert sorted(r["algorithm"] for r in Leaderboard(root).load_records()) == ["grpo", "sft", "teacher", "warm_start"]

    # other numbers for a published run: refused before any model is loaded, and the new sft row of seed 1
    # is not published either
    before, loads = _files(root), no_models["load"]
    changed = json.loads(teacher.read_text())
    changed["metrics"]["success_rate"]["mean"] = 0.5
    teacher.write_text(json.dumps(changed))
    finished_bench(tmp_path, [("sft", 1)])
    assert import_bench_cli(root, out) == 2
    err = capsys.readouterr().err
    published = next(p for p in (root / "records").glob("*.json") if json.loads(p.read_text())["algorithm"] == "teacher")
    assert err.startswith("error: ") and str(teacher) in err and str(published) in err and "nothing was published" in err
    assert "delete the bench's file" in err, err
    assert _files(root) == before and no_models["load"] == loads


def test_a_bench_at_another_budget_publishes_beside_the_first_and_its_reference_rows_are_not_repeated(tmp_path, no_models,
                                                                                                       capsys):
    """The budget is part of a run's identity: grpo at 4x the episodes is another line of the table, named
    with its budget; the warm start, which trains nothing, is the same result and is skipped."""
    root = tmp_path / "lb"
    out = finished_bench(tmp_path, [("warm_start", 0), ("grpo", 0)])
    assert import_bench_cli(root, out) == 0
    summary = json.loads((out / "summary.json").read_text())
    summary["settings"]["steps"] *= 4
    (out / "summary.json").write_text(json.dumps(summary))
    for path in (out / "records").glob("*.json"):
        record = json.loads(path.read_text())
        bench = record["algorithm_config"]["bench"]
        bench["steps"], bench["budget_episodes"] = bench["steps"] * 4, bench["budget_episodes"] * 4
        path.write_text(json.dumps(record))
    capsys.readouterr()
    assert import_bench_cli(root, out) == 0
    stdout = capsys.readouterr().out
    assert "already published: " in stdout and "warm_start__" in stdout and stdout.count("added ") == 1, stdout
    records = Leaderboard(root).load_records()
    assert sorted((r["algorithm"], r.get("budget", {}).get("rollout_episodes")) for r in records) == [
        ("grpo", summary["settings"]["steps"] * summary["settings"]["episodes_per_step"] // 4),
        ("grpo", summary["settings"]["steps"] * summary["settings"]["episodes_per_step"]), ("warm_start", None)]
    md = (root / "LEADERBOARD.md").read_text()
    small = summary["settings"]["steps"] * summary["settings"]["episodes_per_step"] // 4
    # two lines named grpo, told apart by the budget column (the budget is a column, not part of the name)
    column = next(line for line in md.splitlines() if line.startswith("| # |")).split(" | ").index("rollout episodes")
    ranked = [line.split(" | ") for line in md.splitlines() if line.startswith("| ") and line[2].isdigit()]
    assert sorted(cells[column] for cells in ranked if cells[1] == "grpo") == sorted([str(small), str(4 * small)])
    assert "| warm_start |" in md

def _files(root: Path) -> dict:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}
