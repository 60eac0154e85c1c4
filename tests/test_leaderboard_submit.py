"""`leaderboard submit`: records made elsewhere, checked in full, laid out as a pull request's folder, and
published by `add` exactly as previewed; the board itself is only read."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest

from agentgym_opd.cli import main
from evaluation.leaderboard import Leaderboard
from evaluation.leaderboard_ranks import reference_differences
from evaluation.records import record_id
from test_leaderboard import make_record

EVAL = ["eval", "--policy", "random", "--env", "household/valid_seen", "--episodes", "6", "--seeds", "0", "1",
        "--no-progress"]


@pytest.fixture(scope="module")
def submitted(tmp_path_factory) -> dict[int, dict]:
    """Two real records (seeds 0 and 1) as another lab's `agentgym-opd eval --out` writes them from a clean
    checkout: provenance stamped, per-task outcomes kept. (This checkout may have uncommitted changes, which a
    record states as '+dirty'; a lab submits from a commit.)"""
    folder = tmp_path_factory.mktemp("lab")
    assert main([*EVAL, "--out", str(folder / "rec.json")]) == 0
    records = {seed: json.loads((folder / f"rec.seed{seed}.json").read_text()) for seed in (0, 1)}
    for record in records.values():
        record["code_revision"] = record["code_revision"].removesuffix("+dirty")
    return records


def write(folder: Path, records: dict[str, dict]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, record in records.items():
        (folder / name).write_text(json.dumps(record))
    return folder


def published_board(root: Path, submitted: dict[int, dict], student: str = "scripted:random") -> Leaderboard:
    """A board whose track starts from ``student``: a warm start that solved every task the submitted
    records played (same seeds, same task ids: paired) and an OPD row."""
    board = Leaderboard(root)
    for seed, record in submitted.items():
        solved = {task: 1.0 for task in record["outcomes"]}
        board.add(make_record("warm_start", seed, 1.0, env_id="household/valid_seen", student=student, teacher=None,
                              n_episodes=len(solved), outcomes=solved, curve=[]))
        board.add(make_record("opd", seed, 0.5, env_id="household/valid_seen", student=student, teacher="t",
                              n_episodes=len(solved), outcomes={t: float(i % 2) for i, t in enumerate(solved)}))
    board.build()
    return board


def files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def submit_cli(board: Leaderboard, *args: str) -> int:
    return main(["leaderboard", "--root", str(board.root), "submit", *args])


@pytest.mark.slow
def test_a_valid_submission_makes_the_folder_add_publishes_it_as_previewed_and_the_board_is_untouched(
        tmp_path, submitted, capsys):
    board = published_board(tmp_path / "lb", submitted)
    before = files(board.root)
    lab = write(tmp_path / "lab", {f"seed{s}.json": r for s, r in submitted.items()})
    out = tmp_path / "submissions" / "my-lab"
    assert submit_cli(board, str(lab), "--name", "my-lab", "--out", str(out)) == 0, capsys.readouterr().err
    assert files(board.root) == before  # the published board is only read

    names = sorted(p.name for p in (out / "records").iterdir())
    assert names == sorted(f"{record_id(r)}.json" for r in submitted.values())  # the names `add` gives them
    text = (out / "SUBMISSION.md").read_text()
    assert "A new track" not in text and "from scripted:random, teacher t" in text
    assert f"agentgym-opd leaderboard reproduce {out}/records/{record_id(submitted[0])}.json" in text
    assert "Reviewer checklist" in text and f"agentgym-opd leaderboard add {out}/records/*.json" in text

    # the row SUBMISSION.md announces carries the rank group and paired differences the board then gives it
    assert main(["leaderboard", "--root", str(board.root), "add", *map(str, sorted((out / "records").iterdir()))]) == 0
    table = next(t for t in board.family_tables(board.rows(board.load_records())) if t.track.teacher == "t")
    random = next(m for m in table.methods if m.algorithm == "random")
    diffs = reference_differences(table, random)
    assert diffs["warm_start"].paired and diffs["warm_start"].mean == -1.0 and diffs["warm_start"].significant
    row = next(line for line in text.splitlines() if line.startswith("| ") and "| random |" in line)
    assert f"| {diffs['warm_start'].text()} | {diffs['opd'].text()} |" in row
    # and preview.md is that track's table as LEADERBOARD.md renders it after `add`
    board_md = (board.root / "LEADERBOARD.md").read_text()
    preview = (out / "preview.md").read_text()
    section = preview[preview.index("## household"):].rstrip("\n")
    assert section in board_md and "| random |" in section


@pytest.mark.slow
def test_every_problem_of_every_record_is_named_at_once_and_nothing_is_written(tmp_path, submitted, capsys):
    board = published_board(tmp_path / "lb", submitted)
    board.add(copy.deepcopy(submitted[1]))  # already published
    board.build()
    before = files(board.root)
    no_outcomes = {k: v for k, v in submitted[0].items() if k != "outcomes"}
    other_command = copy.deepcopy(submitted[0])  # provenance of another evaluation (9 tasks, not 6)
    other_command["provenance"]["command"][other_command["provenance"]["command"].index("6")] = "9"
    other_seed = copy.deepcopy(submitted[0])
    other_seed["seed"] = 7
    no_provenance = {k: v for k, v in submitted[0].items() if k != "provenance"}
    dirty = {**submitted[0], "code_revision": submitted[0]["code_revision"] + "+dirty"}
    lab = write(tmp_path / "lab", {"a_no_outcomes.json": no_outcomes, "b_other_command.json": other_command,
                                   "c_other_seed.json": other_seed, "d_published.json": submitted[1],
                                   "e_no_provenance.json": no_provenance, "f_dirty.json": dirty})
    out = tmp_path / "sub"
    assert submit_cli(board, str(lab), "--name", "x", "--out", str(out)) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "nothing was written" in err
    for file, problem in [("a_no_outcomes.json", "no per-task 'outcomes'"),
                          ("b_other_command.json", "n_episodes (record: 6, command: 9 = 9 tasks"),
                          ("c_other_seed.json", "do not include the record's seed 7"),
                          ("d_published.json", "duplicate record: identical content is already published"),
                          ("e_no_provenance.json", "no 'provenance'"),
                          ("f_dirty.json", "made from a tree with uncommitted changes")]:
        line = next((x for x in err.splitlines() if file in x and problem in x), None)
        assert line is not None, f"{file}: {problem!r} not in\n{err}"
    assert "leaderboard stamp" in err  # and the fix
    assert not out.exists() and files(board.root) == before


@pytest.mark.slow
def test_a_record_from_another_starting_student_lands_in_a_track_of_its_own(tmp_path, submitted):
    from evaluation.leaderboard_submit import submit

    board = published_board(tmp_path / "lb", submitted, student="household-student")
    folder, changes = submit(board, [str(write(tmp_path / "lab", {"r.json": submitted[0]}) / "r.json")], "lab",
                             tmp_path / "sub")
    assert [c.new_track for c in changes] == [True] and changes[0].table.track.student == "scripted:random"
    text = (folder / "SUBMISSION.md").read_text()
    assert "## Track: household: from scripted:random, no teacher" in text and "**A new track.**" in text
    assert "- (no warm_start row in this track)" in text  # nothing to pair with, and it says why


def test_a_bad_name_an_occupied_folder_and_a_folder_inside_the_board_are_refused(tmp_path):
    from evaluation.leaderboard_submit import submit
    from evaluation.records import RecordError

    board = Leaderboard(tmp_path / "lb")
    with pytest.raises(RecordError, match="--name '../x' must be"):
        submit(board, [], "../x")
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "mine.txt").write_text("keep")
    with pytest.raises(RecordError, match="already exists and is not empty"):
        submit(board, [], "x", tmp_path / "taken")
    with pytest.raises(RecordError, match="inside the published board"):
        submit(board, [], "x", tmp_path / "lb" / "records")
    assert (tmp_path / "taken" / "mine.txt").read_text() == "keep" and not (tmp_path / "lb").exists()


def test_names_from_a_record_cannot_forge_markup_or_rows_in_the_pull_requests_body(tmp_path):
    from evaluation.leaderboard_submit import submission_markdown, track_changes

    provenance = {"packages": {"torch": "2"}, "tasks_sha256": "a" * 64, "chat_template_sha256": None,
                  "weights_sha256": None, "command": ["agentgym-opd", "eval", "--policy", "random", "--env",
                                                      "household/valid_seen"], "seeds": [0], "device": "cpu"}
    hostile = make_record("<img src=x onerror=alert(1)>| 1 | forged", student="[me](javascript:alert(1))",
                          provenance=provenance, outcomes={"t1": 1.0, "t2": 0.0})
    board = Leaderboard(tmp_path / "lb")
    text = submission_markdown(board, "lab", "submissions/lab", [("r.json", hostile)], track_changes(board, [hostile]))
    assert "<img" not in text and "](javascript" not in text
    row = next(line for line in text.splitlines() if line.startswith("| ") and "forged" in line)
    assert len(re.findall(r"(?<!\\)\|", row)) == 9  # the table's 8 cells, none added by the name


def test_a_records_training_must_start_from_the_weights_it_names_and_a_model_not_here_is_left_to_the_reviewer(tmp_path):
    from evaluation.leaderboard_submit import provenance_problems, submission_markdown, track_changes
    from test_training_provenance import training, with_training

    here = with_training(make_record(), training())  # starts from `tiny`, which is here with other weights
    assert any("student 'tiny' here has other weights" in p for p in provenance_problems(here))
    far = with_training(make_record(), training(models=[{"role": "student", "name": "/nowhere/lab-student",
                                                         "sha256": "b" * 64}]))
    assert not any("lab-student" in p for p in provenance_problems(far))  # not the record's fault
    far["code_revision"] += "+dirty"  # submitted with --allow-dirty
    board = Leaderboard(tmp_path / "lb")
    text = submission_markdown(board, "lab", "sub", [("r.json", far)], track_changes(board, [far]))
    assert "The reviewer needs its student /nowhere/lab-student** (weight files sha256 " + "b" * 64 in text
    assert "Reproduce retrains it first" in text and "to step 2" in text
    assert "agentgym-opd leaderboard add sub/records/*.json --allow-dirty" in text and "uncommitted changes" in text
