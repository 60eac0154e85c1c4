"""`agentgym-opd leaderboard submit RECORD_OR_FOLDER... --name NAME [--out DIR]`: records made in another lab,
checked in full and laid out as the folder of a pull request.

A maintainer publishes what a reviewer could check. So every record is refused unless it validates, carries
provenance whose command `leaderboard reproduce` can rerun and that agrees with the record (`provenance_problems`;
a record that states the training behind its policy, ``provenance.training``, is retrained by reproduce, so its
config must be one reproduce reruns and every starting model that is here must have the stated weights),
keeps its per-task ``outcomes`` (without them no row can be paired with it), was made from a committed tree
(`records.dirty_problem`, as `add` refuses it; ``--allow-dirty`` as for add), and can join the published board
(`Leaderboard.plan`: not already published, no other result for the same run). Every problem of every record
is reported at once, with its fix, and nothing is written.

An accepted submission is a folder (default ``submissions/<name>/``) holding

- ``records/<record id>.json``: the records as `leaderboard add` writes them, so after review
  ``agentgym-opd leaderboard add <folder>/records/*.json`` publishes exactly them (checked here before the
  folder appears: the folder is built aside, read back and planned against the board, then moved in place);
- ``SUBMISSION.md``: the pull request's body: per track, the rows the records would add with the rank group
  and paired differences they would get on the published board, whether the track is new, the
  ``leaderboard reproduce`` command per record and the reviewer's checklist;
- ``preview.md``: each track's table as the board would render it with the new rows.

The published board is only read.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from evaluation.leaderboard import Leaderboard, md_cell
from evaluation.leaderboard_ranks import REFERENCES, reference_method
from evaluation.leaderboard_tables import FamilyTable, Method, is_zero_shot
from evaluation.records import RecordError, record_id

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
MAX_SUBMITTED_RECORDS = 1000  # files one submission may name (a folder is read only up to this many)
# protocol entries `agentgym-opd eval` copies from its options as given: comparable without the model at hand
PLAIN_PROTOCOL = ("temperature", "top_p", "samples", "max_new_tokens", "max_turns", "backend")


# ----------------------------------------------------------------------------------------------------
# Checks
# ----------------------------------------------------------------------------------------------------


def submitted_files(paths: list[str]) -> list[Path]:
    """The record files named: each file as given, each folder's ``*.json`` (not its subfolders), at most
    ``MAX_SUBMITTED_RECORDS`` in all."""
    files: list[Path] = []
    for given in paths:
        path = Path(given)
        if path.is_dir():
            found = []
            for candidate in sorted(path.glob("*.json")):
                found.append(candidate)
                if len(files) + len(found) > MAX_SUBMITTED_RECORDS:
                    break
            if not found:
                raise RecordError(f"{path} holds no .json record; pass the record files or the folder that holds them")
            files += found
        else:
            files.append(path)
        if len(files) > MAX_SUBMITTED_RECORDS:
            raise RecordError(f"more than {MAX_SUBMITTED_RECORDS} record files; submit them in smaller batches")
    return files


def provenance_problems(record: dict[str, Any]) -> list[str]:
    """What is missing or inconsistent in a record's provenance and outcomes, each with its fix ([] if none).

    The command must be one `leaderboard reproduce` reruns, its seeds must include the record's, and an
    `agentgym-opd eval` command must evaluate what the record states: the env, the protocol entries the
    command sets directly, and, where the env can be built here, the very tasks (their hash, their count and
    the ids the outcomes name). Where the command's model is on this machine, its names and whole protocol
    are compared too, as `leaderboard stamp` compares them."""
    from evaluation.reproduce import rerun_argv

    problems = []
    if "outcomes" not in record:
        problems.append("no per-task 'outcomes': without them no row can be paired with it (rank groups and the vs "
                        "warm_start / vs opd columns); evaluate it again with `agentgym-opd eval --out` of this version, "
                        "which writes them")
    provenance = record.get("provenance")
    if not provenance:
        return problems + ["no 'provenance': a reviewer cannot rerun it; write records with `agentgym-opd eval --out "
                           "FILE` (it stamps them), or stamp one with `agentgym-opd leaderboard stamp FILE --command "
                           "'agentgym-opd eval ...'` (the exact command that wrote it)"]
    if record["seed"] not in provenance["seeds"]:
        problems.append(f"provenance.seeds {provenance['seeds'][:10]} do not include the record's seed {record['seed']}: "
                        "the provenance belongs to another run; stamp it with the command that wrote it")
    try:
        rerun_argv(record, Path(tempfile.gettempdir()) / "agentgym-opd-submit-check")
    except RecordError as err:
        return problems + [f"{err}; submit a record written by `agentgym-opd eval` or `bench`, unedited"]
    if provenance["command"][1] == "eval":
        try:
            problems += _eval_command_problems(record)
        except RecordError as err:
            problems.append(str(err))
    return problems + _training_problems(record)


def unavailable_models(record: dict[str, Any]) -> list[dict[str, Any]]:
    """The starting models of a record's training (``provenance.training``) that are neither named models nor
    folders here: a reviewer must fetch them before `reproduce` can retrain it."""
    from agentgym_opd.policy.loading import is_named_model
    from evaluation.reproduce import retrains

    if not retrains(record):
        return []
    return [m for m in record["provenance"]["training"]["models"]
            if not is_named_model(m["name"]) and not Path(m["name"]).expanduser().is_dir()]


def _training_problems(record: dict[str, Any]) -> list[str]:
    """Why `reproduce` could not retrain a record that states its training, as far as this machine can tell: a
    config it refuses, a starting model here with other weights than the record's. A starting model that is
    not here is no problem of the record (SUBMISSION.md asks the reviewer to fetch it)."""
    from evaluation.reproduce import retrains, training_argv

    if not retrains(record):
        return []
    missing = {m["name"] for m in unavailable_models(record)}
    training = record["provenance"]["training"]
    if missing:  # training_argv would stop at them: check the rest of what it checks
        here = {**training, "models": [m for m in training["models"] if m["name"] not in missing]}
        from evaluation.training_provenance import starting_model_problems

        problems = starting_model_problems(here)
        return [f"{p}; the record's training must start from the models it names" for p in problems]
    with tempfile.TemporaryDirectory(prefix="agentgym-opd-submit-") as tmp:
        try:
            training_argv(record, Path(tmp))
        except RecordError as err:
            return [f"{err}; the record's training must start from the models it names, as `agentgym-opd train` "
                    "writes it"]
    return []


def _eval_command_problems(record: dict[str, Any]) -> list[str]:
    """Where an `agentgym-opd eval` command would not write this record (``provenance_problems``)."""
    from agentgym_opd.config import ConfigError, parse_key_values
    from evaluation.provenance import (_command_tasks, _parse_eval_command, _policy_source, _seeds,
                                       command_disagreements, tasks_sha256)
    from evaluation.records import env_args_label
    from evaluation.runner import SCRIPTED_AGENTS

    provenance = record["provenance"]
    args = _parse_eval_command(provenance["command"])
    fix = "; submit the record as `agentgym-opd eval --out` wrote it, or stamp it with the command that wrote it"
    if provenance["seeds"] != _seeds(args):
        return [f"provenance.seeds {provenance['seeds'][:10]} are not the seeds its command runs ({_seeds(args)[:10]}){fix}"]
    tasks = None
    if args.env == record["env_id"]:
        try:
            tasks = _command_tasks(args, record["seed"])
        except RecordError as err:  # a plugin's env not installed here: the reviewer needs it to rerun
            return [f"{err}; the reviewer reruns the record, so its env must build here"]
    try:
        source = None if args.policy in SCRIPTED_AGENTS else _policy_source(args.policy)
        problems = command_disagreements(record, args, source, None if tasks is None else len(tasks))
    except RecordError:  # the model lives on the submitter's machine: compare what the command states itself
        problems = _plain_disagreements(record, args, None if tasks is None else len(tasks))
        try:
            options = env_args_label(parse_key_values(args.env_arg, "--env-arg"))
        except ConfigError as err:
            return [f"its command's --env-arg does not parse ({err}){fix}"]
        if options != (record.get("protocol") or {}).get("env_args"):
            problems.append(f"protocol.env_args (record: {(record.get('protocol') or {}).get('env_args')!r:.80}, "
                            f"command: {options!r:.80})")
    if problems:
        return [f"its provenance's command disagrees with the record on {'; '.join(problems)}{fix}"]
    if tasks is None:
        return []
    if tasks_sha256(tasks) != provenance["tasks_sha256"]:
        return ["provenance.tasks_sha256 is not the hash of the tasks its command evaluates here: the tasks (or the "
                f"env's data) differ from this repository's{fix}"]
    partial = (record.get("protocol") or {}).get("partial") is True
    ids, named = {t.id for t in tasks}, set(record.get("outcomes") or ())
    if named and (not named <= ids or (named != ids and not partial)):
        return [f"its outcomes name {len(named - ids)} task(s) its command does not evaluate and miss "
                f"{len(ids - named)} it does (e.g. {sorted(named ^ ids)[:3]}){fix}"]
    return []


def _plain_disagreements(record: dict[str, Any], args: Any, n_tasks: int | None) -> list[str]:
    """``command_disagreements`` without the model: env, seed, episodes and the protocol entries the command
    sets directly (``PLAIN_PROTOCOL``)."""
    from evaluation.provenance import command_disagreements

    problems = [p for p in command_disagreements(record, args, None, n_tasks)
                if not p.startswith(("algorithm (", "student (", "teacher ("))]  # a scripted agent's names: not this one
    stated = record.get("protocol") or {}
    for key in PLAIN_PROTOCOL:
        want = getattr(args, key)
        if stated.get(key) != want:
            problems.append(f"protocol.{key} (record: {stated.get(key)!r:.80}, command: {want!r:.80})")
    return problems


def check_submission(board: Leaderboard, paths: list[str], *, allow_dirty: bool = False) -> list[tuple[str, dict[str, Any]]]:
    """``(file, record)`` of every submitted record, each checked (module docstring) against the published board
    and the others; one RecordError listing every problem of every record otherwise."""
    from evaluation.records import dirty_problem

    items, problems = [], []
    for path in submitted_files(paths):
        try:
            record = board.read_record(path)
        except RecordError as err:
            problems.append(str(err))
            continue
        items.append((str(path), record))
        dirty = None if allow_dirty else dirty_problem(str(path), record)
        problems += [dirty] if dirty else []
        problems += [f"{path}: {p}" for p in provenance_problems(record)]
    plan = board.plan(items)
    problems += plan.problems
    if problems:
        raise RecordError(f"{len(problems)} problem(s), nothing was written; fix each and submit again:\n  "
                          + "\n  ".join(problems))
    return items


# ----------------------------------------------------------------------------------------------------
# What the records would do to the board
# ----------------------------------------------------------------------------------------------------


@dataclass
class TrackChange:
    """One track a submission adds rows to: the table with them, and which of its methods they touch."""

    table: FamilyTable
    new_track: bool  # no published row is in it
    methods: list[Method] = field(default_factory=list)  # ranked order
    joins: dict[int, list[int]] = field(default_factory=dict)  # id(method) -> published seeds it already had


def track_changes(board: Leaderboard, records: list[dict[str, Any]]) -> list[TrackChange]:
    """The tracks the records land in, computed as `leaderboard build` would with them added."""
    published = board.load_records()
    before = {t.track for t in board.family_tables(board.rows(published))}
    new_ids = {record_id(r) for r in records}
    changes = []
    for table in board.family_tables(board.rows(published + records)):
        touched = [m for m in table.methods if any(rid in new_ids for r in m.by_env.values() for rid in r.record_ids)]
        if not touched:
            continue
        change = TrackChange(table, table.track not in before, touched)
        for m in touched:
            old = sorted({s for r in m.by_env.values() for s, rid in zip(r.seeds, r.record_ids) if rid not in new_ids})
            if old:
                change.joins[id(m)] = old
        changes.append(change)
    return changes


def _unpaired_reason(table: FamilyTable, method: Method, name: str) -> str:
    """Why ``method`` has no paired difference from the track's ``name`` row."""
    ref = reference_method(table, name, method.budget[0])
    if ref is None:
        return f"no {name} row in this track"
    if ref is method:
        return f"it is the {name} row"
    here, there = method.by_env.get(table.ranking_env), ref.by_env.get(table.ranking_env)
    if there is None or not there.outcomes:
        return f"the track's {name} row keeps no per-episode outcomes"
    if here is None or not here.outcomes:
        return "this row keeps no per-episode outcomes"
    return f"fewer than two (seed, task) episodes in common with the {name} row"


# ----------------------------------------------------------------------------------------------------
# The folder
# ----------------------------------------------------------------------------------------------------


def _cells(board: Leaderboard, table: FamilyTable, method: Method, group: str) -> list[str]:
    from evaluation.leaderboard_ranks import reference_differences

    ranking = method.by_env.get(table.ranking_env)
    diffs = reference_differences(table, method)
    return [group, method.display, *[board.interval_text(method.by_env.get(e), table.metric) for e in table.env_ids],
            "-" if ranking is None else str(ranking.episodes_behind(table.metric)),
            *(diffs[ref].text() if diffs[ref] else f"- ({_unpaired_reason(table, method, ref)})" for ref in REFERENCES),
            "-" if method.budget[0] is None else str(method.budget[0]), ",".join(map(str, method.seeds))]


def submission_markdown(board: Leaderboard, name: str, folder: str, items: list[tuple[str, dict[str, Any]]],
                        changes: list[TrackChange]) -> str:
    """SUBMISSION.md: the pull request's body (module docstring). Every text from a record is escaped."""
    from agentgym_opd.registry import algorithm_registry
    from evaluation.leaderboard_ranks import rank_groups
    from evaluation.records import REFERENCE_ROWS, dirty_revisions
    from evaluation.reproduce import rerun_argv, retrains
    from evaluation.runner import SCRIPTED_AGENTS

    dirty = [record for _, record in items if dirty_revisions(record)]
    records_glob = f"{folder}/records/*.json" + (" --allow-dirty" if dirty else "")
    lines = [f"# Leaderboard submission: {md_cell(name)}", "",
             f"{len(items)} record(s), checked by `agentgym-opd leaderboard submit` against the published board "
             f"({md_cell(board.root)}, {len(board.load_records())} records): schema, provenance that reruns and agrees "
             "with each record, per-task outcomes, no clash with a published record. After review a maintainer "
             "publishes them with", "", "```", f"agentgym-opd leaderboard add {records_glob}", "```", ""]
    if dirty:
        lines += [f"**{len(dirty)} record(s) were made from a tree with uncommitted changes** (their revision ends "
                  "+dirty): nobody can rerun that code exactly, and they are published marked so.", ""]
    for change in changes:
        table = change.table
        lines += [f"## Track: {md_cell(table.track.title if table.track else table.family)}", ""]
        if change.new_track:
            lines += ["**A new track.** No published row starts from this student with this teacher under this protocol, "
                      "so these rows rank only against each other (and against what joins this track later), never "
                      "against the bench's rows.", ""]
        if is_zero_shot(table):
            lines += ["Zero-shot rows (untrained models under their own protocol) are listed, not ranked.", ""]
            continue
        groups = dict(zip(map(id, table.methods), rank_groups(table)))
        head = ["#", "method", *[f"{table.metric} {e.split('/', 1)[1]}" for e in table.env_ids], "n",
                *(f"vs {ref}" for ref in REFERENCES), "rollout episodes", "seeds"]
        lines += [f"Rows it adds, as ranked on the board with them (primary metric `{md_cell(table.metric)}`, "
                  f"ranked by {md_cell(table.ranking_env)}; paired differences over the same (seed, task) episodes, "
                  "exact 95% interval, `*`: excludes 0):", "",
                  "| " + " | ".join(md_cell(h) for h in head) + " |", "|" + "|".join("---" for _ in head) + "|"]
        lines += ["| " + " | ".join(md_cell(c) for c in _cells(board, table, m, groups[id(m)])) + " |" for m in change.methods]
        for m in change.methods:
            if id(m) in change.joins:
                lines += ["", f"{md_cell(m.display)} joins the published row of the same method (seeds "
                              f"{','.join(map(str, change.joins[id(m)]))}): the row above pools them with the new seeds."]
        lines.append("")
    lines += ["## Records and how to reproduce them", "",
              "Each command reruns the record's own command on CPU and compares every metric: a CPU record must give "
              "the same numbers (exit 0), a GPU record each within 2 standard errors.", ""]
    registered = {*algorithm_registry.ids(), "base", *REFERENCE_ROWS, *SCRIPTED_AGENTS}  # as `add` warns
    for source, record in items:
        rid = record_id(record)
        path = f"{folder}/records/{rid}.json"
        note = "" if record["algorithm"] in registered else (
            f" **Algorithm {md_cell(record['algorithm'])} is not registered here**: the rerun needs its plugin installed.")
        if retrains(record):
            training = record["provenance"]["training"]
            note += (f" Reproduce retrains it first (the config in provenance.training, on CPU, to step "
                     f"{md_cell(training['budget']['steps'])}), then evaluates the new checkpoint.")
            note += "".join(f" **The reviewer needs its {md_cell(m['role'])} {md_cell(m['name'])}** (weight files sha256 "
                            f"{md_cell(m['sha256'] or 'not stated')}): not on the machine that checked it."
                            for m in unavailable_models(record))
        lines += [f"- `{rid}.json` (from {md_cell(Path(source).name)}): {md_cell(record['algorithm'])} on "
                  f"{md_cell(record['env_id'])}, seed {record['seed']}, {record['n_episodes']} episodes, student "
                  f"{md_cell(record['student'])}, teacher {md_cell(record['teacher'] or 'none')}, made on "
                  f"{md_cell(record['provenance']['device'])} at code revision {md_cell(record['code_revision'])}.{note}",
                  "", "  ```", f"  agentgym-opd leaderboard reproduce {shlex.quote(path)}",
                  f"  # reruns: agentgym-opd {shlex.join(rerun_argv(record, Path('RERUN_DIR')))}", "  ```", ""]
    lines += ["## Reviewer checklist", "",
              "- [ ] Every command under *Records* gives back the record's numbers.",
              "- [ ] The models each command evaluates (its `--policy`) can be had by others, and their weights hash to "
              "the record's `provenance.weights_sha256` (the rerun's record states the hash it found).",
              "- [ ] Each `code_revision` is a commit of this repository (`git cat-file -e REV^{commit}`), and the "
              "record's `provenance.packages` are versions this repository supports.",
              "- [ ] Each row sits in the track it belongs to: a row meant to compete with the bench's starts from the "
              "same student and teacher and is evaluated under the bench's protocol; a new track is expected only "
              "for a new starting point.",
              "- [ ] An algorithm not registered here is a plugin the submitter names and others can install.",
              f"- [ ] `agentgym-opd leaderboard add {records_glob}` publishes them (it checks them again and rebuilds "
              "the tables); commit `leaderboard/` and check `agentgym-opd leaderboard build --check` passes.", ""]
    return "\n".join(lines)


def preview_markdown(board: Leaderboard, changes: list[TrackChange]) -> str:
    """preview.md: every track the submission touches, rendered as LEADERBOARD.md would render it."""
    lines = ["# Preview: the tracks with the submitted rows", "",
             "As `agentgym-opd leaderboard build` would render them once the records are added.", ""]
    for change in changes:
        if is_zero_shot(change.table):
            lines += board.zero_shot_markdown([change.table])
        else:
            lines += board.ranked_markdown(change.table)
    return "\n".join(lines)


def submit(board: Leaderboard, paths: list[str], name: str, out: str | Path | None = None, *,
           allow_dirty: bool = False) -> tuple[Path, list[TrackChange]]:
    """Check the records (``check_submission``) and write the submission folder; (the folder, its tracks)."""
    if not NAME.fullmatch(name):
        raise RecordError(f"--name {name[:80]!r} must be 1-64 letters, digits, '.', '_' or '-' starting with a letter "
                          "or digit (it names the folder), e.g. --name my-lab-opd")
    folder = Path(out) if out is not None else Path("submissions") / name
    if folder.exists() and (not folder.is_dir() or any(folder.iterdir())):
        raise RecordError(f"{folder} already exists and is not empty; remove it or pass --out to another folder "
                          "(nothing was written)")
    if folder.resolve().is_relative_to(board.root.resolve()):
        raise RecordError(f"--out {folder} is inside the published board {board.root}; a submission is written beside "
                          "it, never into it")
    items = check_submission(board, paths, allow_dirty=allow_dirty)
    records = [record for _, record in items]
    changes = track_changes(board, records)
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
    try:
        written = Leaderboard(staging).write(records)
        _check_round_trip(board, written, records)
        (staging / "SUBMISSION.md").write_text(submission_markdown(board, name, str(folder), items, changes),
                                               encoding="utf-8")
        (staging / "preview.md").write_text(preview_markdown(board, changes), encoding="utf-8")
        if folder.exists():
            folder.rmdir()  # empty (checked above)
        os.replace(staging, folder)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return folder, changes


def _check_round_trip(board: Leaderboard, written: list[Path], records: list[dict[str, Any]]) -> None:
    """The folder's record files are what `leaderboard add` will read: read back and planned, they must be
    exactly the checked records and all of them new."""
    plan = board.plan([(str(p), board.read_record(p)) for p in written])
    if plan.problems or sorted(record_id(r) for _, r in plan.new) != sorted(record_id(r) for r in records):
        raise RecordError("the submission's record files do not read back as the checked records "
                          f"({'; '.join(plan.problems) or 'other content'}); nothing was written")
