"""Training provenance (issue 38, item 3): a trained record states the training behind its policy, a record from
a dirty tree is refused unless marked, and `leaderboard reproduce` reruns the training before the evaluation."""

from __future__ import annotations

import copy
import csv
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from agentgym_opd.cli import main
from agentgym_opd.run_provenance import OUTPUT_PLACEHOLDER, model_folder, train_command, weights_files_sha256
from evaluation.leaderboard import Leaderboard
from evaluation.records import RecordError, validate_record
from evaluation.training_provenance import check_training
from test_leaderboard import make_record
from test_leaderboard_publish import no_models  # noqa: F401 (a fixture: import-bench without checkpoints)

CLI = [sys.executable, "-m", "agentgym_opd.cli"]
TRAIN = ["train", "--algo", "opd", "--env", "household/train", "--student", "tiny", "--teacher", "tiny",
         "--env-arg", "num_tasks=4", "--no-progress", "model.device=cpu", "train.steps=2", "rollout.tasks_per_step=1",
         "rollout.max_turns=2", "rollout.max_new_tokens=4"]
EVAL = ["eval", "--env", "household/valid_unseen", "--episodes", "2", "--max-turns", "2", "--max-new-tokens", "4",
        "--device", "cpu", "--no-progress"]


def training(**over) -> dict:
    """A well-formed ``provenance.training`` (the starting model a named one, hashed as it is here)."""
    value = {"command": ["agentgym-opd", "train", "--algo", "opd", "--output-dir", OUTPUT_PLACEHOLDER],
             "config": {"algorithm": "opd", "model": {"student": "tiny"}, "train": {"steps": 2}, "algo": {}},
             "models": [{"role": "student", "name": "tiny", "sha256": "a" * 64}], "seed": 0,
             "code_revision": "abc1234", "device": "cpu", "budget": {"steps": 2, "rollout_episodes": 2, "tokens": 9}}
    value.update(over)
    return value


def with_training(record: dict, value: dict, command: list[str] | None = None) -> dict:
    record["provenance"] = {"packages": {"python": "3"}, "tasks_sha256": "0" * 64, "chat_template_sha256": None,
                            "weights_sha256": None, "seeds": [record["seed"]], "device": "cpu", "training": value,
                            "command": command or ["agentgym-opd", *EVAL, "--policy", "runs/x/checkpoints/step_2"]}
    return record


def test_the_train_command_names_no_output_folder():
    argv = ["--algo", "opd", "--output-dir", "runs/mine", "output_dir=/home/me/x", "--resume=runs/mine", "train.lr=1"]
    assert train_command(argv) == ["agentgym-opd", "train", "--algo", "opd", "--output-dir", OUTPUT_PLACEHOLDER,
                                   f"output_dir={OUTPUT_PLACEHOLDER}", f"--resume={OUTPUT_PLACEHOLDER}", "train.lr=1"]


@pytest.mark.parametrize("mutate, words", [
    (lambda t: t.pop("seed"), "exactly the keys"),
    (lambda t: t.update(command=["sh", "-c", "x"]), "'command'"),
    (lambda t: t.update(command=["agentgym-opd", "train", "a\x1b[2J"]), "'command'"),
    (lambda t: t["models"].append({"role": "teacher", "name": "t\n", "sha256": None}), "'models'"),
    (lambda t: t["models"][0].update(sha256="not-a-hash"), "'models'"),
    (lambda t: t.update(models=[{"role": "s", "name": "x", "sha256": None}] * 17), "'models'"),
    (lambda t: t["config"].update(big="x" * 30_000), "characters of JSON"),
    (lambda t: t["config"].update(deep=json.loads("[" * 10 + "]" * 10)), "deeper"),
    (lambda t: t["config"].update({"bad\u202ekey": 1}), "printable name"),
    (lambda t: t["config"].update(prompt="line\x07bell"), "printable text"),
    (lambda t: t["budget"].update(steps=-1), "'budget'"),
    (lambda t: t["budget"].update(tokens=True), "'budget'"),
    (lambda t: t.update(code_revision=""), "'code_revision'"),
    (lambda t: t.update(seed=2**63), "'seed'"),
])
def test_a_records_training_provenance_is_bounded_and_printable(mutate, words):
    value = training()
    assert check_training(value) is None
    mutate(value)
    assert words in (check_training(value) or "")
    with pytest.raises(RecordError, match="provenance"):
        validate_record(with_training(make_record(), value))


def test_add_refuses_a_record_from_a_dirty_tree_and_allow_dirty_publishes_it_marked(tmp_path, capsys):
    root = tmp_path / "lb"
    dirty = tmp_path / "dirty.json"
    dirty.write_text(json.dumps(make_record(code_revision="abc1234+dirty")))
    trained_dirty = tmp_path / "trained_dirty.json"
    trained_dirty.write_text(json.dumps(with_training(make_record(seed=1), training(code_revision="def5678+dirty"))))
    clean = tmp_path / "clean.json"
    clean.write_text(json.dumps(make_record(seed=2)))
    assert main(["leaderboard", "--root", str(root), "add", str(clean), str(dirty), str(trained_dirty)]) == 2
    err = capsys.readouterr().err
    assert "2 records refused, nothing was published" in err
    assert "code_revision abc1234+dirty" in err and "provenance.training.code_revision def5678+dirty" in err
    assert "Commit the changes and rerun from the clean checkout" in err and "--allow-dirty" in err
    assert not (root / "records").exists()  # the clean one was not published either: all or nothing
    assert main(["leaderboard", "--root", str(root), "add", "--allow-dirty", str(clean), str(dirty), str(trained_dirty)]) == 0
    published = sorted(r["code_revision"] for r in Leaderboard(root).load_records())
    assert published == ["abc1234", "abc1234", "abc1234+dirty"]  # the mark is kept in what is published
    # ... and shown: the rows behind a dirty record say so in the Markdown, the page and the CSV
    board = Leaderboard(root)
    outputs = {path.name: text for path, text in board.outputs().items()}
    assert "(dirty tree)" in outputs["LEADERBOARD.md"] and "(dirty tree)" in outputs["index.html"]
    table = list(csv.DictReader(io.StringIO(outputs["leaderboard.csv"])))
    assert {row["dirty_tree"] for row in table} == {"yes"}  # every row pools the dirty seed


def test_reproduce_refuses_before_anything_runs_when_a_starting_model_is_missing_or_differs(tmp_path, capsys):
    tiny_sha = weights_files_sha256(model_folder("tiny"))
    cases = {
        "missing": (training(models=[{"role": "teacher", "name": str(tmp_path / "gone"), "sha256": None}]),
                    "teacher '" + str(tmp_path / "gone") + "' is not available here"),
        "other weights": (training(models=[{"role": "student", "name": "tiny", "sha256": "b" * 64}]),
                          f"student 'tiny' here has other weights (record: bbbbbbbbbbbb, here: {tiny_sha[:12]})"),
        "writes": (training(models=[], config={"model": {}, "algo": {"bank_path": "/tmp/elsewhere"}}),
                   "algo.bank_path='/tmp/elsewhere'"),
    }
    for name, (value, words) in cases.items():
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(with_training(make_record(), value)))
        assert main(["leaderboard", "--root", str(tmp_path / "lb"), "reproduce", str(path)]) == 2, name
        err = capsys.readouterr().err
        assert words in err and "nothing was run" in err, (name, err)


@pytest.mark.slow
def test_a_trained_record_carries_its_training_and_reproduce_retrains_it(tmp_path):
    """train 2 steps -> eval --out -> the record states the training (command, config, hashed starting models,
    budget); reproduce reruns training then evaluation and agrees; a tampered training config disagrees."""
    def cli(*args: str, ok: bool = True) -> subprocess.CompletedProcess:
        out = subprocess.run(CLI + list(args), capture_output=True, text=True, cwd=tmp_path, timeout=900)
        assert (out.returncode == 0) == ok, (args, out.stdout[-2000:], out.stderr[-2000:])
        return out

    cli(*TRAIN, "--output-dir", "runs/opd")
    checkpoint = tmp_path / "runs" / "opd" / "checkpoints" / "step_2"
    written = json.loads((checkpoint / "training.json").read_text())
    tiny = weights_files_sha256(model_folder("tiny"))
    assert written["command"] == ["agentgym-opd", *TRAIN[:1], *TRAIN[1:], "--output-dir", OUTPUT_PLACEHOLDER]
    assert written["models"] == [{"role": "student", "name": "tiny", "sha256": tiny},
                                 {"role": "teacher", "name": "tiny", "sha256": tiny}]
    assert written["config"]["output_dir"] == OUTPUT_PLACEHOLDER and written["config"]["env_args"] == {"num_tasks": 4}
    assert written["budget"] == {"steps": 2, "rollout_episodes": 2, "tokens": written["budget"]["tokens"]}
    assert written["budget"]["tokens"] > 0 and written["device"] == "cpu" and written["seed"] == 0
    run_level = json.loads((tmp_path / "runs" / "opd" / "training.json").read_text())
    assert run_level["budget"] == {"steps": None, "rollout_episodes": None, "tokens": None}

    cli(*EVAL, "--policy", "runs/opd/checkpoints/step_2", "--out", "rec.json")
    record = validate_record(json.loads((tmp_path / "rec.json").read_text()))
    assert record["provenance"]["training"] == written
    path = tmp_path / "published.json"
    path.write_text(json.dumps(record))
    again = cli("leaderboard", "--root", "lb", "reproduce", str(path))
    assert "phase 1/2, training (on cpu, to step_2): agentgym-opd train --config" in again.stdout
    assert "phase 2/2, evaluation (on cpu): agentgym-opd eval" in again.stdout
    assert "same numbers" in again.stdout and "weights: same as the record's" in again.stdout, again.stdout

    # a record whose stated training is not what made its policy: the retrained weights say so
    tampered = copy.deepcopy(record)
    tampered["provenance"]["training"]["config"]["train"]["lr"] = 0.1
    path.write_text(json.dumps(tampered))
    bad = cli("leaderboard", "--root", "lb", "reproduce", str(path), ok=False)
    assert bad.returncode == 1 and "weights: differ from the record's" in bad.stdout, bad.stdout


def test_import_bench_states_the_jobs_training_and_refuses_a_dirty_bench_unless_allowed(tmp_path, no_models, capsys):
    from test_leaderboard_publish import finished_bench

    out = finished_bench(tmp_path, [("warm_start", 0), ("grpo", 0)])
    grpo = out / "records" / "grpo__household_valid_unseen__seed0.json"
    grpo.write_text(json.dumps({**json.loads(grpo.read_text()), "code_revision": "abc1234+dirty"}))
    root = tmp_path / "lb"
    assert main(["leaderboard", "--root", str(root), "import-bench", str(out)]) == 2
    err = capsys.readouterr().err
    assert "grpo__household_valid_unseen__seed0.json: made from a tree with uncommitted changes" in err
    assert "--allow-dirty" in err and not (root / "records").exists()
    assert main(["leaderboard", "--root", str(root), "import-bench", str(out), "--allow-dirty"]) == 0
    records = {r["algorithm"]: r for r in Leaderboard(root).load_records()}
    assert "training" not in records["warm_start"]["provenance"]  # a reference row trains nothing in its job
    stated = records["grpo"]["provenance"]["training"]
    assert stated["command"] == records["grpo"]["provenance"]["command"] and stated["command"][1] == "bench"
    assert stated["config"] == records["grpo"]["algorithm_config"] and stated["code_revision"] == "abc1234+dirty"
    assert stated["models"] == [{"role": "student", "name": "tiny-llama", "sha256": None}]  # no warm start kept here
    assert stated["budget"]["steps"] == records["grpo"]["algorithm_config"]["bench"]["steps"]


def test_a_bench_jobs_own_training_json_is_kept_with_its_models_named_as_the_record_names_them(tmp_path):
    """The bench trains through the Trainer, which writes training.json into the job's checkpoint: import-bench
    keeps it (config, hashes) and names its models as the record does, not by their folders in the bench."""
    from evaluation.bench.settings import BenchSettings
    from evaluation.training_provenance import bench_training

    out = tmp_path / "bench"
    checkpoint = out / "runs" / "opd" / "seed0" / "checkpoints" / "step_2"
    (checkpoint / "model").mkdir(parents=True)
    (checkpoint.parent / "latest").write_text("step_2")
    kept = training(command=None, models=[{"role": "student", "name": str(out / "warm_start/model"), "sha256": "c" * 64},
                                          {"role": "teacher", "name": str(out / "teacher/model"), "sha256": "d" * 64}])
    (checkpoint / "training.json").write_text(json.dumps(kept))
    record = make_record("opd", 0)
    settings = BenchSettings.quick(base_models="off", algos=["opd"], output_dir=str(out))
    stated = bench_training(out, record, settings, ["agentgym-opd", "bench", "--quick"], "cpu", 7)
    assert check_training(stated) is None and stated["config"] == kept["config"] and stated["budget"] == kept["budget"]
    assert stated["command"] == ["agentgym-opd", "bench", "--quick"]
    assert stated["models"] == [{"role": "student", "name": "tiny-llama", "sha256": "c" * 64},
                                {"role": "teacher", "name": "smollm2-135m", "sha256": "d" * 64}]
