"""`agentgym-opd leaderboard [--root DIR] add RECORD... | build [--check] | reproduce RECORD | stamp RECORD... |
submit RECORD_OR_FOLDER... --name NAME | import-bench OUT_DIR`.

Exit codes: 0 done; 1 ``build --check`` found the committed outputs stale, or ``reproduce`` got another
number; 2 bad input (a record that does not validate, a duplicate, a file that is no record, a ``stamp``
command that disagrees with its record), with an ``error:`` line (one more per further refused record)
and no traceback. ``add``, ``import-bench`` and ``stamp`` check every record before writing any, so on
exit 2 nothing was written. ``import-bench`` skips (and reports) records already published: rerunning it
is safe. ``submit`` (`evaluation.leaderboard_submit`) only reads the board.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from evaluation.leaderboard import Leaderboard
from evaluation.records import RecordError

HELP = "publish result records on the leaderboard, render its tables and page, rerun a record"
ALLOW_DIRTY_HELP = ("publish records made from a tree with uncommitted changes (code_revision ending +dirty), marked "
                    "as such; without it they are refused")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--root", default="leaderboard", help="leaderboard folder (default: ./leaderboard)")
    sub = parser.add_subparsers(dest="action", required=True)
    add = sub.add_parser("add", help="validate and publish result records (JSON files), then rebuild")
    add.add_argument("records", nargs="+")
    add.add_argument("--no-build", action="store_true", help="do not re-render the tables afterwards")
    add.add_argument("--allow-dirty", action="store_true", help=ALLOW_DIRTY_HELP)
    build = sub.add_parser("build", help="render LEADERBOARD.md, leaderboard.csv, index.html and the episode pages")
    build.add_argument("--check", action="store_true",
                       help="write nothing; exit 1 if the files on disk differ from what the records make")
    rep = sub.add_parser("reproduce", help="rerun a record's command on CPU and compare the numbers")
    rep.add_argument("record", help="a record file (e.g. leaderboard/records/<id>.json)")
    rep.add_argument("--add", action="store_true", help="publish the rerun as a 'reproduced' record")
    rep.add_argument("--timeout", type=float, default=3600, help="seconds the rerun may take (default 3600)")
    rep.add_argument("--allow-dirty", action="store_true", help="with --add: " + ALLOW_DIRTY_HELP)
    stamp = sub.add_parser("stamp", help="add provenance to records `agentgym-opd eval` wrote without it (eval --out "
                                          "stamps its own); refuses a command that disagrees with the record (in place)")
    stamp.add_argument("records", nargs="+")
    stamp.add_argument("--command", required=True, help="the `agentgym-opd eval ...` command that wrote them, quoted")
    sub_ = sub.add_parser("submit", help="check records made elsewhere against the board and write the folder of a "
                                         "pull request (records, SUBMISSION.md, preview.md); the board is only read")
    sub_.add_argument("records", nargs="+", help="record files, or folders holding them (their *.json)")
    sub_.add_argument("--name", required=True, help="the lab or method submitting (names the folder)")
    sub_.add_argument("--out", default=None, help="the folder to write (default: submissions/NAME); must not exist "
                                                  "or be empty")
    sub_.add_argument("--allow-dirty", action="store_true",
                      help="submit records made from a tree with uncommitted changes (code_revision ending +dirty); "
                           "the maintainer then adds them with --allow-dirty, marked as such")
    imp = sub.add_parser("import-bench", help="publish a finished bench's records with provenance and episodes "
                                              "(records already published are skipped: safe to rerun)")
    imp.add_argument("output_dir", help="the bench's --output-dir")
    imp.add_argument("--allow-dirty", action="store_true", help=ALLOW_DIRTY_HELP)
    imp.add_argument("--episodes", type=int, default=3, help="evaluation episodes kept per run, held-out split (default 3)")
    imp.add_argument("--command", default=None,
                     help="the bench command as run (default: rebuilt from the bench's settings)")


def run(args: argparse.Namespace) -> int:
    board = Leaderboard(args.root)
    try:
        if args.action == "reproduce":
            return _reproduce(board, args)
        if args.action == "stamp":
            return _stamp(board, args)
        if args.action == "submit":
            return _submit(board, args)
        if args.action == "import-bench":
            from evaluation.bench.publish import import_bench

            import_bench(args.output_dir, board, command=args.command.split() if args.command else None,
                         episodes=args.episodes, allow_dirty=args.allow_dirty)
        if args.action == "add":
            _add(board, args.records, allow_dirty=args.allow_dirty)
            if args.no_build:
                return 0
        if args.action == "build" and args.check:
            from evaluation.leaderboard_html import without_stamp

            stale = [str(p) for p, text in board.outputs().items()
                     if not p.is_file() or without_stamp(p.read_text(encoding="utf-8")) != without_stamp(text)]
            for p in stale:
                print(f"stale: {p}", file=sys.stderr)
            if stale:
                print("run `agentgym-opd leaderboard build` and commit the result", file=sys.stderr)
            return 1 if stale else 0
        _report_build(board.build(), board.root / "episodes")
    except RecordError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


def _report_build(written: list[Path], episode_dir: Path) -> None:
    """One line per table or page, and one line for all episode pages (a board has one per kept episode,
    hundreds of lines that hid the tables' own)."""
    episode_pages = [p for p in written if p.parent == episode_dir]
    for path in written:
        if path.parent != episode_dir:
            print(f"wrote {path}")
    if episode_pages:
        print(f"wrote {len(episode_pages)} episode page{'s' if len(episode_pages) > 1 else ''} under {episode_dir}")


def _add(board: Leaderboard, paths: list[str], *, allow_dirty: bool = False) -> list[Path]:
    """Publish record files all or nothing: every file is read, validated and checked against the board and
    the other files before the first is written, so a bad file among good ones publishes none and leaves
    the records and the tables as they were (one good file written, then an error, left the tables stale).
    A record from a tree with uncommitted changes is refused unless ``allow_dirty`` (`records.dirty_problem`)."""
    from evaluation.records import dirty_problem

    items, problems = [], []
    for path in paths:
        try:
            items.append((path, board.read_record(path)))
        except RecordError as err:
            problems.append(str(err))
    if not allow_dirty:
        problems += [p for p in (dirty_problem(path, record) for path, record in items) if p]
    plan = board.plan(items)
    plan.problems[:0] = problems
    plan.check(fix="fix or leave out the refused file(s) and run it again")
    _warn_unregistered(plan.new)
    written = board.write([record for _, record in plan.new])
    for path in written:
        print(f"added {path}")
    return written


def _warn_unregistered(items: list[tuple[str, dict]]) -> None:
    """Warn about each algorithm id that nothing installed here registers. It is still published (a plugin's
    method may be published from a machine without the plugin), but a misspelt id would make a row apart
    from its method's, so the user should see it."""
    from agentgym_opd.registry import algorithm_registry
    from evaluation.records import REFERENCE_ROWS
    from evaluation.runner import SCRIPTED_AGENTS

    registered = algorithm_registry.ids()
    known = {*registered, "base", *REFERENCE_ROWS, *SCRIPTED_AGENTS}  # base: an untrained model
    for source, record in items:
        if record["algorithm"] not in known:
            print(f"warning: {source}: algorithm {record['algorithm']!r} is not registered here (registered: "
                  f"{', '.join(registered)}); publishing it anyway. If it is a plugin's method, that plugin is not "
                  "installed here; if it is a typo, remove the record and add it again with the right id",
                  file=sys.stderr)


def _submit(board: Leaderboard, args: argparse.Namespace) -> int:
    from evaluation.leaderboard_submit import submit

    folder, changes = submit(board, args.records, args.name, args.out, allow_dirty=args.allow_dirty)
    for change in changes:
        print(f"{change.table.track.title if change.table.track else change.table.family}: "
              f"{len(change.methods)} row(s){' (a new track)' if change.new_track else ''}")
    print(f"wrote {folder}: open a pull request with it, SUBMISSION.md as its description; after review, "
          f"`agentgym-opd leaderboard add {folder}/records/*.json{' --allow-dirty' if args.allow_dirty else ''}` "
          "publishes the records")
    return 0


def _stamp(board: Leaderboard, args: argparse.Namespace) -> int:
    """Stamp every record with the command's provenance, each checked first against what the record says
    of its own run; any refusal (naming the file and the fields that differ) leaves every file untouched."""
    import shlex

    from evaluation.provenance import stamp_eval_record
    from evaluation.records import validate_record

    command = shlex.split(args.command)
    stamped = []
    for path in args.records:
        record = board.read_record(path)
        had_provenance = "provenance" in record
        try:
            stamped.append((path, validate_record(stamp_eval_record(record, command)), had_provenance))
        except RecordError as err:
            raise RecordError(f"{path}: {err}; nothing was stamped") from err
    for path, record, had_provenance in stamped:
        Path(path).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
        print(f"stamped {path}" + (" (it already carried provenance: `agentgym-opd eval --out` stamps what it writes)"
                                   if had_provenance else ""))
    return 0


def _check_original_published(board: Leaderboard, record: dict, source: str) -> None:
    """Before a rerun that ``--add`` will publish: the record it reproduces must be on this board (a
    reproduction is published only beside its original), checked now rather than after an hour's rerun."""
    from evaluation.records import record_id, reproduces_id

    wanted = reproduces_id(record)
    if wanted not in {record_id(r) for r in board.load_records()}:
        raise RecordError(f"--add publishes the rerun beside the record it reproduces ({wanted}), which is not in "
                          f"{board.records_dir}: publish it first (`agentgym-opd leaderboard --root {board.root} add "
                          f"{source}`), or rerun without --add; nothing was run")


def _check_clean_tree(allow_dirty: bool) -> None:
    """Before a rerun that ``--add`` will publish: the rerun's record states this checkout's revision, so a
    tree with uncommitted changes is refused now, not after the rerun (unless ``--allow-dirty``)."""
    from evaluation.records import DIRTY_SUFFIX
    from evaluation.runner import code_revision

    revision = code_revision()
    if revision.endswith(DIRTY_SUFFIX) and not allow_dirty:
        raise RecordError(f"--add publishes a rerun made by this checkout, which has uncommitted changes ({revision}): "
                          "commit them or rerun from a clean checkout, or pass --allow-dirty to publish it marked as "
                          "from a dirty tree; nothing was run")


def _reproduce(board: Leaderboard, args: argparse.Namespace) -> int:
    from evaluation.reproduce import format_report, reproduce, weights_agree

    record = board.read_record(Path(args.record))
    if args.add:
        _check_original_published(board, record, args.record)
        _check_clean_tree(args.allow_dirty)
    ok, new, rows = reproduce(record, timeout_s=args.timeout, log=print)
    print(f"reproduce {record['algorithm']} on {record['env_id']} seed {record['seed']}: "
          + ("same numbers" if all(r["old"] == r["new"] for r in rows) else "numbers differ"))
    print(format_report(rows))
    same_weights = weights_agree(record, new)
    if same_weights is not None:
        print("weights: " + ("same as the record's" if same_weights else "differ from the record's (weights_sha256 "
                             f"{record['provenance']['weights_sha256'][:12]} -> {new['provenance']['weights_sha256'][:12]})"))
    if args.add:
        print(f"added {board.add(new)}")
        board.build()
    else:
        print(json.dumps({"origin": new["origin"], "metrics": new["metrics"]}), file=sys.stderr)
    return 0 if ok else 1
