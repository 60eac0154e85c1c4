"""Result records and the leaderboard: schema validation, refusal of bad records, rendering, the CLI."""

from __future__ import annotations

import copy
import json
import subprocess
import sys

import pytest

from evaluation.leaderboard import Leaderboard
from evaluation.records import RecordError, validate_record


def make_record(algorithm="opd", seed=0, success=0.5, env_id="household/valid_unseen", **over):
    record = {
        "schema_version": 1,
        "env_id": env_id,
        "split": env_id.split("/")[1],
        "metrics": {"success_rate": {"mean": success, "stderr": 0.05}, "mean_turns": {"mean": 12.0 - 4 * success, "stderr": 0.5}},
        "n_episodes": 100,
        "algorithm": algorithm,
        "algorithm_config": {"lr": 1e-4},
        "student": "tiny-llama",
        "teacher": None if algorithm in ("grpo", "sft") else "smollm2-135m",
        "code_revision": "abc1234",
        "seed": seed,
        "wall_time_s": 12.5,
        "created": "2026-12-02T18:00:00+00:00",
        "curve": [{"rollouts": 0, "success_rate": 0.1}, {"rollouts": 256, "success_rate": success}],
    }
    record.update(over)
    return record


@pytest.mark.parametrize(
    "mutate, field",
    [
        (lambda r: r.pop("env_id"), "env_id"),
        (lambda r: r.update(n_episodes=0), "n_episodes"),
        (lambda r: r.update(n_episodes="100"), "n_episodes"),
        (lambda r: r["metrics"].update(success_rate={"mean": 0.5}), "metrics"),
        (lambda r: r["metrics"].update(success_rate={"mean": float("nan"), "stderr": 0.1}), "metrics"),
        (lambda r: r.update(schema_version=2), "schema_version"),
        (lambda r: r.update(created="yesterday"), "created"),
        (lambda r: r.update(teacher=""), "teacher"),
        (lambda r: r.update(curve=[{"rollouts": "x"}]), "curve"),
        (lambda r: r.update(colour="red"), "colour"),
    ],
)
def test_schema_violations_name_the_field(mutate, field):
    record = make_record()
    mutate(record)
    with pytest.raises(RecordError, match=repr(field) if field != "colour" else "colour"):
        validate_record(record)


def test_corrupt_duplicate_and_invalid_records_leave_the_board_as_it_was(tmp_path):
    board = Leaderboard(tmp_path / "lb")
    board.add(make_record("opd", 0, 0.6))
    board.add(make_record("grpo", 0, 0.4))
    board.build()
    before = {p.name: p.read_bytes() for p in (tmp_path / "lb").rglob("*") if p.is_file()}

    with pytest.raises(RecordError, match="identical content"):
        board.add(make_record("opd", 0, 0.6))
    with pytest.raises(RecordError, match="same run"):
        board.add(make_record("opd", 0, 0.7))
    with pytest.raises(RecordError, match="'wall_time_s'"):
        board.add(make_record("sdpo", 0, 0.7, wall_time_s=-1))
    corrupt = tmp_path / "corrupt.json"
    corrupt.write_text('{"schema_version": 1, "env_id": ')
    with pytest.raises(RecordError, match="cannot read a JSON record"):
        board.add(corrupt)
    after = {p.name: p.read_bytes() for p in (tmp_path / "lb").rglob("*") if p.is_file()}
    assert after == before

    # a corrupt file dropped straight into records/ stops the build before anything is rewritten
    (tmp_path / "lb" / "records" / "zz-broken.json").write_text("{not json")
    with pytest.raises(RecordError, match="zz-broken.json"):
        board.build()
    assert (tmp_path / "lb" / "LEADERBOARD.md").read_bytes() == before["LEADERBOARD.md"]


def test_tables_aggregate_seeds_and_mark_the_best(tmp_path):
    board = Leaderboard(tmp_path / "lb")
    for seed, s in enumerate([0.5, 0.7]):
        board.add(make_record("opd", seed, s))
    board.add(make_record("grpo", 0, 0.3))
    board.add(make_record("opd", 0, 0.9, env_id="tooluse/valid_unseen"))
    board.build()
    md = (tmp_path / "lb" / "LEADERBOARD.md").read_text()
    assert "## household" in md and "## tooluse" in md
    opd_row = next(line for line in md.splitlines() if "| household/valid_unseen | opd |" in line)
    # mean of seed means 0.6; stderr across seeds = std([0.5, 0.7]) / sqrt(2) = 0.1
    assert "**0.600 +- 0.100**" in opd_row and "| 0,1 | 200 |" in opd_row
    grpo_row = next(line for line in md.splitlines() if "| household/valid_unseen | grpo |" in line)
    assert "0.300 +- 0.050" in grpo_row and "**0.300" not in grpo_row
    # mean_turns: lower is better, so opd (12 - 2.4 = 9.6) is bold and grpo (10.8) is not
    assert "**9.600" in opd_row and "**10.800" not in grpo_row
    csv_text = (tmp_path / "lb" / "leaderboard.csv").read_text().splitlines()
    assert csv_text[0].startswith("env_family,env_id,split,algorithm") and len(csv_text) == 4


@pytest.mark.slow
def test_cli_add_and_build(tmp_path):
    rec = tmp_path / "r.json"
    rec.write_text(json.dumps(make_record("sdpo", 3, 0.55)))
    cmd = [sys.executable, "-m", "agentgym_opd.cli", "leaderboard", "--root", str(tmp_path / "lb")]
    out = subprocess.run(cmd + ["add", str(rec)], capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "LEADERBOARD.md" in out.stdout and (tmp_path / "lb" / "index.html").exists()
    again = subprocess.run(cmd + ["add", str(rec)], capture_output=True, text=True, cwd=tmp_path)
    assert again.returncode == 2 and "duplicate record" in again.stderr


def test_records_evaluated_under_different_protocols_are_separate_rows(tmp_path):
    from evaluation.leaderboard import Leaderboard
    from evaluation.records import RecordError, validate_record

    def rec(seed, temperature, success):
        return validate_record({
            "schema_version": 1, "env_id": "household/valid_seen", "split": "valid_seen",
            "metrics": {"success_rate": {"mean": success, "stderr": 0.0}}, "n_episodes": 8, "algorithm": "opd",
            "algorithm_config": {}, "student": "tiny", "teacher": None, "code_revision": "abc", "seed": seed,
            "wall_time_s": 1.0, "created": "2026-12-03T00:00:00+00:00",
            "protocol": {"temperature": temperature, "samples": 1}})

    board = Leaderboard(tmp_path / "board")
    board.add(rec(0, 0.0, 0.5))
    board.add(rec(0, 1.0, 0.25))  # same seed, another protocol: not a duplicate
    board.add(rec(1, 0.0, 0.7))
    rows = board.rows(board.load_records())
    assert sorted((r.protocol, r.seeds) for r in rows) == [("samples=1 temperature=0.0", [0, 1]),
                                                            ("samples=1 temperature=1.0", [0])]
    greedy = next(r for r in rows if r.protocol.endswith("0.0"))
    assert greedy.metrics["success_rate"][0] == pytest.approx(0.6)
    table = board.markdown(rows)
    assert "| opd |" in table and "| opd [temperature=1.0] |" in table  # the eval defaults are not spelled out
    with pytest.raises(RecordError, match="protocol"):
        validate_record({**rec(2, 0.0, 0.1), "protocol": {"temperature": [0.1]}})


def test_a_familys_caption_names_what_its_success_rate_is():
    from evaluation.leaderboard import metric_title

    assert metric_title("code", "success_rate") == "success_rate (= pass@1)"
    assert metric_title("searchqa", "success_rate") == "success_rate (= exact match)"
    assert metric_title("household", "success_rate") == "success_rate"
    assert metric_title("code", "pass@1") == "pass@1"


def _files(root) -> dict:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def test_cli_add_publishes_all_files_or_none(tmp_path, capsys):
    """A bad file among good ones, two files of the same run, or a file already published: nothing is
    written, exit 2, and the error names the file; the records and the tables stay exactly as they were."""
    from agentgym_opd.cli import main

    root = tmp_path / "lb"
    files = {}
    for name, record in {"first": make_record("sft", 0, 0.4), "good": make_record("opd", 0, 0.5),
                         "bad": make_record("grpo", 0, 1.5), "same_run": make_record("opd", 0, 0.6)}.items():
        files[name] = tmp_path / f"{name}.json"
        files[name].write_text(json.dumps(record))
    assert main(["leaderboard", "--root", str(root), "add", str(files["first"])]) == 0
    before = _files(root)
    capsys.readouterr()
    for batch, named in [(["good", "bad"], "bad.json: field 'metrics'"),
                         (["good", "same_run"], "same_run.json: duplicate record: "),
                         (["good", "good"], "the same record as"),
                         (["good", "first"], "first.json: duplicate record: identical content is already published")]:
        assert main(["leaderboard", "--root", str(root), "add", *(str(files[n]) for n in batch)]) == 2, batch
        err = capsys.readouterr().err
        assert err.startswith("error: ") and named in err and "nothing was published" in err, err
        assert _files(root) == before, batch
    assert main(["leaderboard", "--root", str(root), "build", "--check"]) == 0
    assert main(["leaderboard", "--root", str(root), "add", str(files["good"])]) == 0  # the good file alone goes in
    assert len(list((root / "records").glob("*.json"))) == 2


def test_the_tables_caption_names_the_interval_a_single_record_gets(tmp_path):
    """One record's success_rate cell is Wilson's interval over its episodes, and the captions say so."""
    from evaluation.leaderboard import wilson_interval
    from evaluation.leaderboard_tables import interval_words

    board = Leaderboard(tmp_path / "lb")
    board.add(make_record("opd", 0, 0.5, n_episodes=10))
    md = board.markdown(board.rows(board.load_records()))
    caption = next(line for line in md.splitlines() if line.startswith("Ranked tables"))
    assert "Wilson's 95% score interval over the row's evaluation episodes pooled over its seeds" in caption
    low, high = wilson_interval(0.5, 10)
    assert f"0.500 [{low:.3f}, {high:.3f}]" in md and f"[{0.5 - 1.96 * 0.05:.3f}" not in md
    board.build()  # the page says the same
    assert interval_words() in (tmp_path / "lb" / "index.html").read_text()


def test_cli_add_warns_about_an_algorithm_nothing_here_registers_and_publishes_it(tmp_path, capsys):
    from agentgym_opd.cli import main

    paths = []
    for algorithm in ("my_lab_opd", "opd", "teacher", "base"):
        paths.append(tmp_path / f"{algorithm}.json")
        paths[-1].write_text(json.dumps(make_record(algorithm, 0, 0.5)))
    assert main(["leaderboard", "--root", str(tmp_path / "lb"), "add", *map(str, paths)]) == 0
    warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and "algorithm 'my_lab_opd' is not registered here" in warnings[0], warnings
    assert "registered: " in warnings[0] and "opd, " in warnings[0] and "sage_opd" in warnings[0]
    assert len(Leaderboard(tmp_path / "lb").load_records()) == 4
