"""`agentgym-opd leaderboard add RECORD... | build [--root DIR]`."""

from __future__ import annotations

import argparse
import sys

from evaluation.leaderboard import Leaderboard
from evaluation.records import RecordError

HELP = "add result records to the leaderboard and render its table and page"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--root", default="leaderboard", help="leaderboard folder (default: ./leaderboard)")
    sub = parser.add_subparsers(dest="action", required=True)
    add = sub.add_parser("add", help="validate and publish result records (JSON files)")
    add.add_argument("records", nargs="+")
    add.add_argument("--no-build", action="store_true", help="do not re-render the tables afterwards")
    sub.add_parser("build", help="render LEADERBOARD.md, leaderboard.csv and index.html")


def run(args: argparse.Namespace) -> int:
    board = Leaderboard(args.root)
    try:
        if args.action == "add":
            for path in args.records:
                print(f"added {board.add(path)}")
            if args.no_build:
                return 0
        for out in board.build():
            print(f"wrote {out}")
    except RecordError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0
