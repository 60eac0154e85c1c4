"""Tracks: a record ranks only against records from the same starting point (student, teacher, protocol)."""

from __future__ import annotations

from agentgym_opd.action_parsing import ONE_ACTION_PROMPT
from evaluation.leaderboard import Leaderboard
from evaluation.leaderboard_tracks import BENCH_PROTOCOL, Track
from evaluation.records import env_args_label
from test_leaderboard import make_record

STUDENT, TEACHER = "household-student-64x2-1000steps", "household-teacher-128x2-1500steps"
OPTIONS = {"status_line": True, "turn_counter": True}


def bench_record(algorithm: str, success: float, *, budget: int = 64, student: str = STUDENT,
                 teacher: str | None = None, seed: int = 0) -> dict:
    """A record as the bench writes it: no protocol field, the bench's settings in its config."""
    section = {"bench": {"max_new_tokens": 16, "max_turns": 20, "budget_episodes": budget, "env_args": OPTIONS}}
    return make_record(algorithm, seed, success, algorithm_config=section, student=student, teacher=teacher)


def bench_protocol_record(algorithm: str, success: float, *, student: str, teacher: str | None = None) -> dict:
    """A record `agentgym-opd eval` writes under exactly the bench's protocol and env options."""
    protocol = {"temperature": 0.0, "top_p": 1.0, "samples": 1, "max_new_tokens": 16, "max_turns": 20, "backend": "hf",
                "action_parser": "text", "system_prompt": ONE_ACTION_PROMPT, "max_context_tokens": 4096,
                "env_args": env_args_label(OPTIONS)}
    return make_record(algorithm, 0, success, protocol=protocol, student=student, teacher=teacher)


def the_bench(board: Leaderboard) -> None:
    board.add(bench_record("warm_start", 0.28, budget=64))
    board.add(bench_record("teacher", 0.80, student=TEACHER))
    board.add(bench_record("grpo", 0.30))
    board.add(bench_record("opd", 0.33, teacher=TEACHER))
    board.add(bench_record("opd", 0.36, teacher=TEACHER, budget=256))


def test_the_untrained_tiny_model_under_the_benchs_protocol_gets_its_own_track(tmp_path):
    board = Leaderboard(tmp_path / "lb")
    the_bench(board)
    board.add(bench_protocol_record("base", 0.95, student="tiny"))  # better than every bench row, from another start
    tables = board.family_tables(board.rows(board.load_records()))

    bench, tiny = tables
    assert bench.track == Track("household", STUDENT, TEACHER, BENCH_PROTOCOL)
    assert sorted(m.algorithm for m in bench.methods) == ["grpo", "opd", "opd", "teacher", "warm_start"]
    assert tiny.track == Track("household", "tiny", None, BENCH_PROTOCOL)
    assert [m.algorithm for m in tiny.methods] == ["base"]

    board.build()
    md = (tmp_path / "lb" / "LEADERBOARD.md").read_text()
    bench_section, tiny_section = md.split(f"## {tiny.track.title}")
    assert "| base |" not in bench_section.split(f"## {bench.track.title}")[1]
    assert "| 1 | base |" in tiny_section
    html = (tmp_path / "lb" / "index.html").read_text()
    assert f'id="{bench.track.slug}"' in html and f'id="{tiny.track.slug}"' in html


def test_another_teacher_is_another_track_and_a_teacherless_method_joins_its_students_track(tmp_path):
    board = Leaderboard(tmp_path / "lb")
    the_bench(board)
    board.add(bench_protocol_record("my_opd", 0.5, student=STUDENT, teacher="a-bigger-teacher"))
    board.add(bench_protocol_record("my_rl", 0.31, student=STUDENT))  # no teacher: competes with GRPO
    tracks = {t.track: [m.algorithm for m in t.methods] for t in board.family_tables(board.rows(board.load_records()))}

    assert tracks[Track("household", STUDENT, "a-bigger-teacher", BENCH_PROTOCOL)] == ["my_opd"]
    assert "my_rl" in tracks[Track("household", STUDENT, TEACHER, BENCH_PROTOCOL)]


def test_the_budget_is_a_column_not_part_of_the_name(tmp_path):
    board = Leaderboard(tmp_path / "lb")
    the_bench(board)
    board.build()
    lines = (tmp_path / "lb" / "LEADERBOARD.md").read_text().splitlines()
    column = next(line for line in lines if line.startswith("| # |")).split(" | ").index("rollout episodes")
    ranked = [line for line in lines if line.startswith("| ") and line[2].isdigit()]  # the ranked table's lines
    opd = [line for line in ranked if line.split(" | ")[1] == "opd"]
    assert len(opd) == 2 and not any("episodes)" in line for line in lines)
    assert {line.split(" | ")[column] for line in opd} == {"64", "256"}


def test_zero_shot_real_model_rows_sit_together_in_one_table(tmp_path):
    board = Leaderboard(tmp_path / "lb")
    the_bench(board)
    own = {"temperature": 0.0, "samples": 1, "max_new_tokens": 64, "max_turns": 8, "action_parser": "text"}
    board.add(make_record("base", 0, 0.0, env_id="alfworld/valid_unseen", student="smollm2", teacher=None, protocol=own))
    board.add(make_record("base", 0, 0.1, env_id="scienceworld/find-living-thing", student="smollm2", teacher=None,
                          protocol=own))
    board.build()
    md = (tmp_path / "lb" / "LEADERBOARD.md").read_text()
    ranked_part, zero_shot = md.split("## Zero-shot models")
    assert "## alfworld" not in ranked_part and "## scienceworld" not in ranked_part  # no one-row ranked tables
    zero_shot = zero_shot.split("# Every metric")[0]
    assert "| alfworld/valid_unseen | smollm2 | success_rate | 0.000 [" in zero_shot
    assert "| scienceworld/find-living-thing | smollm2 | success_rate | 0.100 [" in zero_shot
    html = (tmp_path / "lb" / "index.html").read_text()
    assert html.count('<table class="zeroshot">') == 1 and "scienceworld/find-living-thing</td>" in html


def test_track_titles_name_the_protocol_or_say_there_is_none():
    assert Track("household", "tiny", None, BENCH_PROTOCOL).title == "household: from tiny, no teacher, the bench's protocol"
    assert Track("bfcl", "smollm2", "t", "parser=x").title == "bfcl: from smollm2, teacher t, protocol parser=x"
    # a scripted agent's rows have no prompt protocol; the title once ended in "protocol " and nothing
    assert Track("household", "walkthrough", None, "").title.endswith("no teacher, no prompt protocol (a scripted agent)")
    # rows of a named bench track (`bench --track NAME`) say whose preset they ran; the name is no part of the key
    named = Track("alfworld", "s", "t", BENCH_PROTOCOL, bench_track="smollm2-alfworld")
    assert named.title == "alfworld: from s, teacher t, the smollm2-alfworld track's protocol"
    assert named == Track("alfworld", "s", "t", BENCH_PROTOCOL) and named.slug == Track("alfworld", "s", "t", "bench").slug


def test_curve_tasks_come_from_the_preset_the_bench_command_names():
    from evaluation.leaderboard_tables import curve_tasks

    def record(*argv, train_env="household/train"):
        return {"provenance": {"training": {"command": ["agentgym-opd", "bench", *argv]}},
                "algorithm_config": {"bench": {"train_env": train_env}}}

    assert curve_tasks(record("--output-dir", "x")) == 32  # the bench's default
    assert curve_tasks(record("--quick")) == 4
    assert curve_tasks(record("--track", "smollm2-alfworld", train_env="alfworld/train")) == 16
    assert curve_tasks(record("--track", "smollm2-alfworld", "--quick", train_env="alfworld/train")) == 2
    assert curve_tasks(record("--track", "no-such-track")) is None  # a track this install does not register
    assert curve_tasks({"provenance": {"command": ["agentgym-opd", "eval"]}}) is None  # not a bench record


def test_a_sage_opd_row_whose_judge_defaulted_is_marked_judge_not_tested(tmp_path):
    """Its turn weights were errors-only weighting: the table must not present that as SAGE-OPD's result."""
    board = Leaderboard(tmp_path / "lb")
    the_bench(board)
    board.add({**bench_record("sage_opd", 0.34, teacher=TEACHER), "training": {"judge_defaulted_share": 0.9}})
    board.add({**bench_record("sage_opd", 0.35, teacher=TEACHER, seed=1), "training": {"judge_defaulted_share": 0.05}})
    board.build()
    md = (tmp_path / "lb" / "LEADERBOARD.md").read_text()
    assert "| sage_opd (judge not tested) |" in md
    assert "sage_opd: judge not tested: 90% of the teacher's verdicts were unreadable" in md
    html = (tmp_path / "lb" / "index.html").read_text()
    assert "(judge not tested)</span>" in html and '<p class="warn">sage_opd: judge not tested: 90%' in html

    readable = Leaderboard(tmp_path / "lb2")
    the_bench(readable)
    readable.add({**bench_record("sage_opd", 0.34, teacher=TEACHER), "training": {"judge_defaulted_share": 0.05,
                                                                                  "judge_modal_label_share": 0.6}})
    readable.build()
    assert "judge not tested" not in (tmp_path / "lb2" / "LEADERBOARD.md").read_text()
