"""leaderboard.csv carries what the page shows of a row: its track, rank group and paired differences."""

from __future__ import annotations

import csv
import io

import pytest

from evaluation.leaderboard import Leaderboard
from evaluation.leaderboard_ranks import rank_groups, reference_differences
from evaluation.leaderboard_tables import TRACK_CSV_COLUMNS
from test_leaderboard import make_record

TASKS = [f"task-{i:03d}" for i in range(60)]
SECTION = {"bench": {"max_new_tokens": 16, "max_turns": 20, "budget_episodes": 64}}


def record(algorithm: str, solved: range, env_id: str = "household/valid_unseen", teacher: str | None = "t",
           keep_outcomes: bool = True) -> dict:
    extra = {"outcomes": {t: float(i in solved) for i, t in enumerate(TASKS)}} if keep_outcomes else {}
    return make_record(algorithm, 0, len(solved) / len(TASKS), env_id=env_id, n_episodes=len(TASKS), teacher=teacher,
                       algorithm_config=SECTION, **extra)


def csv_rows(board: Leaderboard) -> tuple[list[str], list[dict]]:
    text = (board.root / "leaderboard.csv").read_text()
    return next(csv.reader(io.StringIO(text))), list(csv.DictReader(io.StringIO(text)))


def test_the_csv_gains_track_rank_group_and_paired_columns_with_the_pages_numbers(tmp_path):
    board = Leaderboard(tmp_path / "lb")
    # warm start 20 of 60, OPD the same 20 and 15 more, SFT 22; and each on a second split
    for env_id, shift in (("household/valid_unseen", 0), ("household/valid_seen", 5)):
        board.add(record("warm_start", range(20 + shift), env_id, teacher=None))
        board.add(record("opd", range(35 + shift), env_id))
        board.add(record("sft", range(22 + shift), env_id, teacher=None))
    board.build()
    header, rows = csv_rows(board)
    assert header[:12] == ["env_family", "env_id", "split", "algorithm", "protocol", "student", "teacher", "seeds",
                           "n_episodes", "rollout_episodes", "tokens", "origin"]
    assert tuple(header[-len(TRACK_CSV_COLUMNS):]) == TRACK_CSV_COLUMNS  # added at the end
    assert "vs_opd_paired_ci95_low" in header and "vs_warm_start_paired_diff" in header

    (table,) = board.family_tables(board.rows(board.load_records()))
    md = (board.root / "LEADERBOARD.md").read_text()
    for group, method in zip(rank_groups(table), table.methods):
        row = next(r for r in rows if r["algorithm"] == method.algorithm and r["split"] == "valid_unseen")
        assert row["track"] == table.track.title and row["rank_group"] == group
        line = next(x for x in md.splitlines() if x.startswith(f"| {group} | {method.algorithm} |"))
        for ref, diff in reference_differences(table, method).items():
            cells = [row[f"vs_{ref}_paired_{part}"] for part in ("diff", "ci95_low", "ci95_high", "n")]
            if diff is None:
                assert cells == ["", "", "", ""]
                continue
            assert [float(c) for c in cells] == pytest.approx([diff.mean, diff.low, diff.high, diff.n], abs=1e-6)
            assert f"| {diff.text()} |" in line  # the number the page and LEADERBOARD.md show
    opd = next(r for r in rows if r["algorithm"] == "opd" and r["split"] == "valid_unseen")
    assert float(opd["vs_warm_start_paired_diff"]) == pytest.approx(15 / 60)
    # another split's row: its own paired difference, but no rank group (the track ranks by valid_unseen)
    seen = next(r for r in rows if r["algorithm"] == "opd" and r["split"] == "valid_seen")
    assert seen["rank_group"] == "" and seen["track"] == opd["track"]
    assert float(seen["vs_warm_start_paired_diff"]) == pytest.approx(15 / 60) and seen["vs_opd_paired_diff"] == ""


def test_rows_without_outcomes_leave_the_paired_cells_empty(tmp_path):
    board = Leaderboard(tmp_path / "lb")
    board.add(record("warm_start", range(20), teacher=None, keep_outcomes=False))
    board.add(record("opd", range(35), keep_outcomes=False))
    board.build()
    _, rows = csv_rows(board)
    for row in rows:
        assert row["rank_group"] and all(row[c] == "" for c in TRACK_CSV_COLUMNS[2:])
