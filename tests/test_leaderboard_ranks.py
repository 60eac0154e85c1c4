"""Ranks from the evidence: pooled Wilson cells, paired differences over the same episodes, rank groups."""

from __future__ import annotations

import csv
import io

import pytest

from evaluation.bench.stats import paired_difference, wilson_interval
from evaluation.leaderboard import Leaderboard
from evaluation.leaderboard_ranks import rank_groups, reference_differences
from evaluation.records import RecordError, validate_record
from test_leaderboard import make_record

TASKS = [f"task-{i:03d}" for i in range(100)]


def outcomes(successes: set[int]) -> dict[str, float]:
    return {t: float(i in successes) for i, t in enumerate(TASKS)}


def bench_like(algorithm: str, solved: set[int], *, with_outcomes: bool = True, teacher: str | None = None) -> dict:
    """One seed's record on the 100 tasks; ``solved``: the indices of the tasks it solved."""
    section = {"bench": {"max_new_tokens": 16, "max_turns": 20, "budget_episodes": 64}}
    record = make_record(algorithm, 0, len(solved) / len(TASKS), algorithm_config=section, teacher=teacher)
    if with_outcomes:
        record["outcomes"] = outcomes(solved)
    return record


# the warm start solves 40 tasks; OPD the same 40 and 12 more: 12 discordant pairs, all one way
WARM, OPD = set(range(40)), set(range(52))


def tables(tmp_path, with_outcomes: bool):
    board = Leaderboard(tmp_path / ("paired" if with_outcomes else "unpaired"))
    board.add(bench_like("warm_start", WARM, with_outcomes=with_outcomes))
    board.add(bench_like("opd", OPD, with_outcomes=with_outcomes, teacher="t"))
    return board, board.family_tables(board.rows(board.load_records()))


def test_paired_evidence_separates_what_the_two_intervals_alone_cannot(tmp_path):
    (table,) = tables(tmp_path, with_outcomes=True)[1]
    assert [m.algorithm for m in table.methods] == ["opd", "warm_start"]
    assert rank_groups(table) == ["1", "2"]  # 12 of 12 discordant pairs: exact McNemar p = 0.0005
    diff = reference_differences(table, table.methods[0])["warm_start"]
    expected = paired_difference(outcomes(OPD), outcomes(WARM))
    assert diff is not None and diff.paired and diff.significant
    assert (diff.mean, diff.low, diff.high) == pytest.approx((expected["mean"], expected["low"], expected["high"]))

    # the same cells without per-episode outcomes: only the unpaired interval, which cannot tell them apart
    (table,) = tables(tmp_path, with_outcomes=False)[1]
    assert rank_groups(table) == ["1-2", "1-2"]
    assert reference_differences(table, table.methods[0])["warm_start"] is None  # '-' in the table, not a guess


def test_rank_groups_and_paired_columns_reach_the_markdown_and_the_page(tmp_path):
    board, _ = tables(tmp_path, with_outcomes=True)
    board.build()
    md = (board.root / "LEADERBOARD.md").read_text()
    opd_line = next(line for line in md.splitlines() if line.startswith("| 1 | opd |"))
    assert "| +0.120 [" in opd_line and "]* |" in opd_line  # vs warm_start, significant
    assert next(line for line in md.splitlines() if line.startswith("| 2 | warm_start |"))
    html = (board.root / "index.html").read_text()
    assert 'class="paired sig"' in html and "vs warm_start" in html


def test_a_cell_has_one_interval_everywhere_wilson_over_the_pooled_episodes(tmp_path):
    board = Leaderboard(tmp_path / "lb")
    for seed, success in enumerate((0.3, 0.4, 0.5)):
        board.add(make_record("grpo", seed, success))
    board.build()
    low, high = wilson_interval(120, 300)  # 30 + 40 + 50 successes of 3 x 100 episodes
    text = f"0.400 [{low:.3f}, {high:.3f}]"
    md = (board.root / "LEADERBOARD.md").read_text()
    assert f"| {text} |" in md and "| 300 |" in md  # the cell and its n
    row = next(csv.DictReader(io.StringIO((board.root / "leaderboard.csv").read_text())))
    assert (float(row["success_rate_ci95_low"]), float(row["success_rate_ci95_high"])) == pytest.approx((low, high), abs=1e-6)
    html = (board.root / "index.html").read_text()
    assert f"<b>0.400</b> <span class=\"ci\">[{low:.2f}, {high:.2f}]</span>" in html


def test_a_row_that_trains_nothing_counts_tasks_replayed_under_several_seeds_once(tmp_path):
    board = Leaderboard(tmp_path / "lb")
    provenance = {"packages": {"torch": "2"}, "tasks_sha256": "a" * 64, "chat_template_sha256": None,
                  "weights_sha256": None, "command": ["agentgym-opd", "bench"], "seeds": [0, 1, 2], "device": "cpu"}
    for seed in range(3):  # the teacher, greedy, on the same 32 tasks under every seed: the same 32 episodes
        record = make_record("teacher", seed, 0.84375, n_episodes=32, provenance=provenance, curve=None,
                             algorithm_config={"bench": {"budget_episodes": 64}})
        board.add({k: v for k, v in record.items() if v is not None})
    (row,) = board.rows(board.load_records())
    mean, low, high = row.interval("success_rate")
    assert row.episodes_behind("success_rate") == 32 and (low, high) == pytest.approx(wilson_interval(27, 32))
    assert high - low > 0.2  # not the zero-width interval of three identical seed means


@pytest.mark.parametrize("bad", [{}, {"t": 1.5}, {"t": "1"}, {"bad\nid": 1.0}, [["t", 1.0]]])
def test_outcomes_that_are_not_task_shares_are_refused(bad):
    with pytest.raises(RecordError, match="'outcomes'"):
        validate_record({**make_record(), "outcomes": bad})
    validate_record({**make_record(), "outcomes": {"t": 1.0, "u": 0.0, "v": 0.5}})


def test_every_record_an_evaluation_makes_keeps_its_per_task_outcomes():
    from evaluation.runner import evaluate_scripted

    record = evaluate_scripted("household/valid_unseen", "walkthrough", episodes=4, num_envs=1, progress=False)
    assert len(record["outcomes"]) == 4 and set(record["outcomes"].values()) <= {0.0, 1.0}
    assert sum(record["outcomes"].values()) / 4 == pytest.approx(record["metrics"]["success_rate"]["mean"])
