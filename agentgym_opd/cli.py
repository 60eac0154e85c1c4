"""The `agentgym-opd` command line.

Subcommands: `envs` (list environments), `algos` (list algorithms), `play ENV_ID` (a person plays an env
in the terminal). The others (`train`, `eval`, `bench`, `leaderboard`) are found like environments and
algorithms, through an entry-point group (`agentgym_opd.commands`): each entry names a module with `HELP`
(one line), `add_arguments(parser)` and `run(args) -> int`. So the core does not import the evaluation or
training packages by name, and the CLI stays a table of contents rather than a place where logic piles up.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import textwrap
from importlib import metadata
from typing import Any, Sequence

COMMAND_GROUP = "agentgym_opd.commands"
DISTRIBUTION = "agentgym-opd"
EXIT_INTERRUPTED = 130  # 128 + SIGINT, what a shell reports for a command stopped by Ctrl-C
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE, what `yes | head` reports for `yes`: the reader left, nothing failed
NOTHING_WRITTEN = "this command writes no files"


def _list_registry(registry: Any, as_json: bool) -> int:
    """`agentgym-opd envs` / `algos`: one id and description per line (or JSON), then plugins that failed."""
    specs = registry.list()
    if as_json:
        print(json.dumps([{"id": s.id, "description": s.description} for s in specs], indent=2))
        return 0
    if not specs:
        print(f"no {registry.kind}s registered yet")
    width = max((len(s.id) for s in specs), default=10)
    for s in specs:
        print(f"{s.id:<{width}}  {s.description}")
    for name, err in registry.plugin_errors.items():
        print(f"(plugin {name!r} failed to load: {err})", file=sys.stderr)
    return 0


def _cmd_envs(args: argparse.Namespace) -> int:
    from agentgym_opd.registry import env_registry

    return _list_registry(env_registry, args.json)


def _cmd_algos(args: argparse.Namespace) -> int:
    from agentgym_opd.registry import algorithm_registry

    return _list_registry(algorithm_registry, args.json)


def _cmd_play(args: argparse.Namespace) -> int:
    """Play an env by hand: type an action, or a number to pick an admissible action; 'quit' ends."""
    from agentgym_opd.registry import make

    env = make(args.env_id, **dict(_parse_override(o) for o in args.set))
    options = {"task_id": args.task_id} if args.task_id else None
    obs, info = env.reset(seed=args.seed, options=options)
    task = info["task"]
    print(f"== {args.env_id}  task {task.id} ==")
    print(obs)
    total = 0.0
    while True:
        admissible = info.get("admissible_actions")
        if admissible:
            print("\nadmissible actions:")
            for i, a in enumerate(admissible):
                print(f"  [{i}] {a}")
        try:
            line = input("\n> ")
        except EOFError:
            print()
            return 0
        if line.strip() in {"quit", "exit"}:
            return 0
        if admissible and line.strip().isdecimal():
            number = _action_number(line.strip(), len(admissible))
            if number is None:
                print(f"  (no action number {line.strip()[:12]}: pick 0-{len(admissible) - 1}, or type an action)")
                continue
            line = admissible[number]
            print(f"> {line}")
        obs, reward, terminated, truncated, info = env.step(line)
        total += reward
        print(obs)
        if info["error"] is not None:
            print(f"  (error: {info['error']})")
        if terminated or truncated:
            print(f"\n== episode over after {info['turn']} turns: success={info['success']} score={info['score']} return={total}")
            if info["feedback"]:
                print(textwrap.fill(f"feedback: {info['feedback']}", 100))
            return 0


def _action_number(digits: str, count: int) -> int | None:
    """The admissible action ``digits`` picks, or None when it is out of range (a number too long to be an
    index is out of range without being converted: int() refuses over 4300 digits)."""
    significant = digits.lstrip("0") or "0"
    if len(significant) > len(str(count)) or int(significant) >= count:
        return None
    return int(significant)


def _parse_override(text: str) -> tuple[str, object]:
    key, sep, value = text.partition("=")
    if not sep:
        raise SystemExit(f"--env-arg expects KEY=VALUE, got {text!r}")
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="agentgym-opd", description=__doc__.split("\n")[0])
    parser.add_argument("--version", action="version", version=f"%(prog)s {package_version()}")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("envs", help="list registered environments")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=_cmd_envs, kept_after_interrupt=lambda args: NOTHING_WRITTEN)

    p = sub.add_parser("algos", aliases=["algorithms"], help="list registered algorithms")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=_cmd_algos, kept_after_interrupt=lambda args: NOTHING_WRITTEN)

    p = sub.add_parser("play", help="play an environment in the terminal")
    p.add_argument("env_id", help="a registered env id (`agentgym-opd envs` lists them)")
    p.add_argument("--seed", type=int, default=0, help="reset seed: which task, when --task-id is not given")
    p.add_argument("--task-id", default=None, help="play this task of the split (env.task_ids() lists them)")
    p.add_argument("--env-arg", "--set", dest="set", action="append", default=[], metavar="KEY=VALUE",
                   help="env constructor option (JSON value), e.g. status_line=true; repeatable (as in train and eval)")
    p.set_defaults(func=_cmd_play, kept_after_interrupt=lambda args: "a played episode is not saved")

    for ep in sorted(metadata.entry_points(group=COMMAND_GROUP), key=lambda e: e.name):
        try:
            module = ep.load()
        except ImportError as err:  # a stale or broken plugin command must not take the other commands down
            print(f"(command {ep.name!r} from {ep.value} failed to load: {err}; reinstall the package)", file=sys.stderr)
            continue
        # no abbreviated options (`--pub` for `--publish`): a command's argv is recorded as typed in the records
        # it writes and rerun by `leaderboard reproduce`, so every option must mean the same word for word
        p = sub.add_parser(ep.name, help=getattr(module, "HELP", ""), allow_abbrev=False)
        module.add_arguments(p)
        p.set_defaults(func=module.run, kept_after_interrupt=getattr(module, "kept_after_interrupt", None))
    return parser


def package_version() -> str:
    """The installed distribution's version (pyproject's `version`), for `--version` and bug reports."""
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return "(not installed: run `pip install -e .` in the repository)"


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command. Two ways a command stops early end without a traceback: Ctrl-C prints one line
    saying what the command kept and exits 130; a reader that leaves the pipe (`envs --json | head`)
    ends the output quietly with 141, as a process killed by SIGPIPE would."""
    args: argparse.Namespace | None = None
    try:
        args = _parse(argv)
        code = _dispatch(args)
        sys.stdout.flush()  # a closed pipe shows up here rather than in the interpreter's own exit flush
        return code
    except KeyboardInterrupt as stop:
        print(f"interrupted; {_kept_after_interrupt(args, stop)}", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        _discard_stdout()
        return EXIT_BROKEN_PIPE


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    # kept as typed: some env packages (ALFWorld's, TextWorld's) rewrite sys.argv when imported, and a record
    # stamps the command that made it (`args.invoked_argv`)
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    args.invoked_argv = argv
    # `section.key=value` overrides may sit between flags (argparse stops a positional list at the first flag)
    if extra and hasattr(args, "overrides") and all("=" in x and not x.startswith("-") for x in extra):
        args.overrides = list(args.overrides or []) + extra
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    return args


def _dispatch(args: argparse.Namespace) -> int:
    from agentgym_opd.core import UnknownTaskError
    from agentgym_opd.data import DataNotFoundError
    from agentgym_opd.registry import BadArgumentsError, UnknownIdError

    try:
        return int(args.func(args) or 0)
    except (UnknownIdError, BadArgumentsError, UnknownTaskError, DataNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)  # user input errors: the message says what to do, no traceback
        return 2


def _kept_after_interrupt(args: argparse.Namespace | None, stop: KeyboardInterrupt) -> str:
    """What an interrupted command leaves behind: the interrupt's own message when the command raised it
    knowing (eval: "partial record kept at ..."), else the command's `kept_after_interrupt(args)`, else a
    plain statement that nothing written is undone."""
    if str(stop):
        return str(stop)
    describe = getattr(args, "kept_after_interrupt", None)
    if describe is None:
        return "nothing was started" if args is None else "files it had written stay as they are"
    try:
        return describe(args)
    except Exception as err:  # the note must not replace the interrupt with a traceback of its own
        return f"(could not say what was kept: {err})"


def _discard_stdout() -> None:
    """Point stdout at /dev/null, so the interpreter's exit flush of what is still buffered for the closed
    pipe fails silently instead of printing 'Exception ignored ... BrokenPipeError'."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # stdout is no real file (a test's capture): nothing will flush to a pipe
        pass


if __name__ == "__main__":
    sys.exit(main())
