"""Leaderboard records that lie (issue 35): a reproduction of nothing, absurd numbers, a date in the future,
and a command that would publish when `reproduce` reruns it. Each is refused with a message naming the
field and the fix, before anything is written or run."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from evaluation.leaderboard import Leaderboard
from evaluation.records import RecordError, record_id, validate_record
from evaluation.reproduce import WRITING_FLAGS, command_parser, rerun_argv
from test_leaderboard import make_record

CLI = [sys.executable, "-m", "agentgym_opd.cli", "leaderboard"]


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()} if root.exists() else {}


# ---------------------------------------------------------------- a reproduction names its original

def test_a_reproduced_record_must_name_the_record_it_reruns():
    with pytest.raises(RecordError, match="'reproduces' is missing.*must name the record it reruns"):
        validate_record(make_record(origin="reproduced"))
    with pytest.raises(RecordError, match="origin is not 'reproduced'"):
        validate_record(make_record(reproduces="0123456789abcdef"))
    with pytest.raises(RecordError, match="origin is not 'reproduced'"):
        validate_record(make_record(origin="original", reproduces="0123456789abcdef"))
    for bad in ("0123", "0123456789ABCDEF", "../../etc/passwd", 7):
        with pytest.raises(RecordError, match="'reproduces' must be the 16-hex-digit id"):
            validate_record(make_record(origin="reproduced", reproduces=bad))
    assert validate_record(make_record(origin="reproduced", reproduces="0123456789abcdef"))


def test_a_reproduction_is_published_only_beside_the_record_it_reruns(tmp_path):
    board = Leaderboard(tmp_path / "lb")
    original = make_record("opd", seed=1)
    rerun = make_record("opd", seed=1, success=0.52, origin="reproduced", reproduces=record_id(original))
    with pytest.raises(RecordError, match=f"reproduces record {record_id(original)}, which is not published.*publish the original first"):
        board.add(rerun)
    assert _files(tmp_path / "lb") == {}
    board.add(original)
    board.add(rerun)
    assert sorted(r.get("origin", "original") for r in board.load_records()) == ["original", "reproduced"]
    board.build()
    assert "(reproduced)" in (tmp_path / "lb" / "LEADERBOARD.md").read_text()


def test_a_reproduction_and_its_original_may_come_in_one_batch(tmp_path):
    board = Leaderboard(tmp_path / "lb")
    original = make_record("grpo", seed=2)
    rerun = make_record("grpo", seed=2, origin="reproduced", reproduces=record_id(original))
    plan = board.plan([("rerun.json", rerun), ("original.json", original)])
    assert plan.problems == [] and len(plan.new) == 2


@pytest.mark.parametrize("change, message", [
    ({"algorithm": "sdpo"}, "differ on algorithm"),
    ({"seed": 5}, "differ on seed"),
    ({"env_id": "household/valid_seen", "split": "valid_seen"}, "differ on env_id"),
    ({"student": "another-model"}, "differ on student"),
])
def test_a_reproduction_of_another_run_is_refused(tmp_path, change, message):
    board = Leaderboard(tmp_path / "lb")
    original = make_record("opd", seed=1)
    board.add(original)
    before = _files(tmp_path / "lb")
    forged = make_record(**{"algorithm": "opd", "seed": 1, **change}, origin="reproduced", reproduces=record_id(original))
    with pytest.raises(RecordError, match=f"not a rerun of record {record_id(original)}.*{message}"):
        board.add(forged)
    assert _files(tmp_path / "lb") == before


def test_a_reproduction_of_a_reproduction_must_name_the_original(tmp_path):
    board = Leaderboard(tmp_path / "lb")
    original = make_record("opd", seed=1)
    rerun = make_record("opd", seed=1, origin="reproduced", reproduces=record_id(original))
    board.add(original)
    board.add(rerun)
    second = make_record("opd", seed=1, success=0.1, origin="reproduced", reproduces=record_id(rerun))
    with pytest.raises(RecordError, match="itself a reproduction"):
        board.add(second)


def test_leaderboard_add_refuses_a_bare_reproduction_with_exit_2_and_writes_nothing(tmp_path):
    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps(make_record(origin="reproduced")))
    dangling = tmp_path / "dangling.json"
    dangling.write_text(json.dumps(make_record(origin="reproduced", reproduces="feedfacefeedface")))
    for path, message in ((bare, "'reproduces' is missing"), (dangling, "feedfacefeedface, which is not published")):
        out = subprocess.run(CLI + ["--root", str(tmp_path / "lb"), "add", str(path)], capture_output=True, text=True)
        assert out.returncode == 2 and out.stderr.startswith("error:") and message in out.stderr, out.stderr
        assert str(path) in out.stderr and "Traceback" not in out.stderr
    assert _files(tmp_path / "lb") == {}


# ---------------------------------------------------------------- numbers within sane ranges

@pytest.mark.parametrize("training, message", [
    ({"steps": 1e308}, "'steps' is a count"),
    ({"steps": -3}, "'steps' is a count"),
    ({"steps": 2.5}, "'steps' is a count"),
    ({"steps": 40.0}, "written as an integer"),
    ({"steps": True}, "'steps' is a count"),
    ({"rollout_episodes": 10**16}, "'rollout_episodes' is a count"),
    ({"agent_tokens": "many"}, "'agent_tokens' is a count"),
    ({"n_tasks": -1}, "'n_tasks' is a count"),
    ({"judge_defaulted_share": 7.0}, "is a share: a number in \\[0, 1\\]"),
    ({"accept_rate": -0.5}, "is a share"),
    ({"train_wall_time_s": -5.0}, "is a duration"),
    ({"loss": 1e308}, "'loss' is a number in"),
    ({"loss": float("nan")}, "'loss' must be a finite number"),
    ({"kl": float("inf")}, "'kl' must be a finite number"),
    ({"grad_norm": "1.0"}, "'grad_norm' must be a finite number"),
    ({"bad name\n": 1.0}, "letters, digits"),
    ({f"m{i}": 0.0 for i in range(201)}, "at most 200"),
])
def test_absurd_training_values_are_refused_naming_the_entry_and_the_fix(training, message):
    with pytest.raises(RecordError, match=f"field 'training'.*{message}"):
        validate_record(make_record(training=training))


def test_sane_training_values_are_accepted():
    training = {"steps": 40, "rollout_episodes": 256, "agent_tokens": 123_456, "judge_defaulted_share": 0.25,
                "loss": -0.7, "mean_turns": 6.5, "train_wall_time_s": 812.5, "kl": 0.0}
    assert validate_record(make_record(training=training))["training"] == training


@pytest.mark.parametrize("field, value, message", [
    ("protocol", {"samples": 1e308}, "'samples' is a count"),
    ("protocol", {"max_turns": True}, "'max_turns' is a count"),
    ("protocol", {"max_new_tokens": 2.5}, "'max_new_tokens' is a count"),
    ("protocol", {"max_context_tokens": -4096}, "'max_context_tokens' is a count"),
    ("protocol", {"top_p": 7.0}, "'top_p' is a share"),
    ("protocol", {"temperature": 1e300}, "'temperature' is a number in"),
    ("budget", {"rollout_episodes": 10**18, "tokens": None}, "'rollout_episodes' is a count"),
    ("budget", {"rollout_episodes": 64, "tokens": 1.5}, "'tokens' is a count"),
    ("n_episodes", 10**18, "positive integer of at most"),
    ("curve", [{"rollouts": 10**18, "success_rate": 0.5}], "rollouts"),
    ("throughput", {"agent_tokens": 10**17, "tokens_per_s": 3.0}, "agent_tokens"),
])
def test_absurd_numbers_in_other_fields_are_refused(field, value, message):
    with pytest.raises(RecordError, match=f"field '{field}'.*{message}"):
        validate_record(make_record(**{field: value}))


def test_every_committed_record_is_within_the_ranges():
    for path in sorted(Path("leaderboard/records").glob("*.json")):
        validate_record(json.loads(path.read_text()))


# ---------------------------------------------------------------- no records from the future

def _iso(delta: timedelta, *, zone: bool = True) -> str:
    when = datetime.now(timezone.utc) + delta
    return when.isoformat(timespec="seconds") if zone else when.replace(tzinfo=None).isoformat(timespec="seconds")


@pytest.mark.parametrize("created", [
    _iso(timedelta(days=3)),
    _iso(timedelta(days=400)),
    _iso(timedelta(days=3), zone=False),  # no zone: read as UTC
    "9999-12-31T23:59:59-14:00",
    (datetime.now(timezone.utc) + timedelta(days=2)).strftime("%Y-%m-%d"),
])
def test_a_created_date_in_the_future_is_refused(created):
    with pytest.raises(RecordError, match="field 'created' is in the future.*fix the clock"):
        validate_record(make_record(created=created))


@pytest.mark.parametrize("created", [_iso(timedelta(hours=20)), _iso(timedelta(0)), _iso(timedelta(days=-30)),
                                     "2020-01-01", "0001-01-01T00:00:00+00:00"])
def test_a_created_date_up_to_a_day_ahead_is_clock_skew_and_accepted(created):
    assert validate_record(make_record(created=created))["created"] == created


# ---------------------------------------------------------------- reproduce writes only into its own folder

def _provenance(command: list[str]) -> dict:
    return {"packages": {"python": "3"}, "tasks_sha256": "0" * 64, "chat_template_sha256": None,
            "weights_sha256": None, "command": command, "seeds": [0], "device": "cpu"}


BASE = {"bench": ["--quick"], "eval": ["--policy", "random", "--env", "household/valid_seen"]}


def _spellings(flag: str) -> list[list[str]]:
    """Every way argparse with abbreviations could read ``flag``: each prefix from ``--x`` on, alone, with a
    separate value and with ``=value``."""
    prefixes = [flag[:n] for n in range(3, len(flag) + 1)]
    return [form for p in prefixes for form in ([p], [p, "/tmp/elsewhere"], [f"{p}=/tmp/elsewhere"])]


def _cli_namespace(argv: list[str]):
    """What `python -m agentgym_opd.cli` (the process reproduce starts) would parse from ``argv``."""
    from agentgym_opd.cli import build_parser

    args, extra = build_parser().parse_known_args(argv)
    return args, extra


@pytest.mark.parametrize("sub, flag", [(s, f) for s, flags in WRITING_FLAGS.items() for f in flags])
def test_every_spelling_of_a_writing_flag_is_stripped_or_refused(tmp_path, sub, flag):
    parser = command_parser(sub)
    for spelling in _spellings(flag):
        command = ["agentgym-opd", sub, *BASE[sub], *spelling]
        try:
            argv = rerun_argv(make_record(provenance=_provenance(command)), tmp_path)
        except RecordError as err:  # a spelling that leaves a stray word is refused as unparsable
            assert "word for word" in str(err), (spelling, err)
            continue
        args, extra = _cli_namespace(argv)
        where = f"{spelling} -> {argv}"
        assert extra == [] and "/tmp/elsewhere" not in " ".join(argv), where
        if sub == "bench":
            assert args.publish is False and args.output_dir == str(tmp_path), where
        else:
            assert args.out == str(tmp_path / "record.json"), where
        assert not any(a != flag and flag.startswith(a.partition("=")[0]) and a.startswith("--") for a in argv), where
    assert parser.allow_abbrev is False


@pytest.mark.parametrize("command, message", [
    (["bench", "--quick", "output_dir=/tmp/elsewhere"], "sets 'output_dir=/tmp/elsewhere'"),
    (["bench", "--quick", "algo.bank_path=/tmp/bank"], "sets 'algo.bank_path=/tmp/bank'"),
    (["bench", "--algo-set", "lopd:algo.bank_path=/tmp/bank"], "sets 'algo.bank_path=/tmp/bank'"),
    (["bench", "--qui"], "neither its options"),  # an abbreviation of an option that writes nothing is still refused
    (["bench", "--env", "--publish"], "word for word"),
    (["eval", "--pol", "random", "--env", "household/valid_seen"], "word for word"),
    (["eval", "--policy", "random", "--env", "household/valid_seen", "--transcripts=3", "--o", "x", "--sys", "p"], "word for word"),
])
def test_a_command_that_would_write_elsewhere_or_does_not_parse_is_refused(tmp_path, command, message):
    with pytest.raises(RecordError, match=message):
        rerun_argv(make_record(provenance=_provenance(["agentgym-opd", *command])), tmp_path)


def test_the_cli_refuses_abbreviated_options_so_no_record_can_hold_one():
    from agentgym_opd.cli import build_parser

    for argv in (["bench", "--pub"], ["bench", "--output-d", "x"], ["eval", "--pol", "random", "--env", "x"],
                 ["eval", "--policy", "random", "--env", "x", "--o", "r.json"]):
        with pytest.raises(SystemExit):
            build_parser().parse_args(argv)
    assert build_parser().parse_args(["bench", "--publish"]).publish is True

