"""The leaderboard: published result records in `leaderboard/records/`, rendered to Markdown, CSV and HTML.

`add` accepts a record only if it validates and is not already there (same content, or the same run:
env, split, algorithm, student, teacher, seed, training budget and protocol); it is written atomically, so a refused or
interrupted add leaves the folder as it was. A batch (several files, a bench) is checked whole first
(`plan`: every record against the published ones and against the others of the batch), then written, so
a batch with one bad record publishes none of them. `build` reads every record (a corrupt one stops the build,
naming the file, before anything is written), groups records of the same env split x algorithm x student
x teacher x budget x protocol over seeds, and renders

- per track (`evaluation.leaderboard_tracks`), one **ranked table**: one row per method (algorithm x student x
  teacher x budget x protocol; the budget is a column),
  the family's primary metric first with one column per split (held-out split first, the ranking key),
  each as mean and 95% interval, then the training budget (rollout episodes, tokens), teacher, student,
  seeds and protocol; rows whose protocol differs from the bench's are marked;
- per family, the per-error-kind breakdown of every method on the held-out split;
- the full table of every metric per env split (mean +- standard error, best per column in bold).

Aggregating over seeds: a share's cell (success, exact match, pass@1, error rates) pools the evaluation
episodes of every seed and shows their share with Wilson's 95% score interval over them (a row that trains
nothing and replayed the same tasks under several seeds counts them once); any other metric shows mean +- 1.96
se. That is the one interval every output (Markdown, CSV, page) gives a cell. Ranks are rank groups and the
paired columns come from the per-episode evidence (`evaluation.leaderboard_ranks`). A column's best value is
marked only where the column's values differ.

This module stores records and renders the tables; the numbers (pooling over seeds, intervals, ranking) are
`evaluation.leaderboard_tables`'s, the page `evaluation.leaderboard_html`'s.

Every text cell is escaped for its format (Markdown: HTML and table syntax; CSV: formula prefixes; HTML:
entities), because names and episode texts come from third parties and agents.
"""

from __future__ import annotations

import csv
import io
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from evaluation.leaderboard_tables import (FamilyTable, Method, Row, aggregate_rows, best_values, error_kinds,  # noqa: F401
                                           family_tables, interval_text, interval_words, is_zero_shot, metric_title,
                                           primary_metric, record_budget, rows_by_family, track_csv_cells,
                                           TRACK_CSV_COLUMNS, wilson_interval)
from evaluation.leaderboard_ranks import REFERENCES, paired_words, rank_groups, reference_differences
from evaluation.records import (MAX_RECORD_BYTES, RecordError, env_family, parse_record, protocol_label, record_id,
                                reproduction_problem)

IDENTITY_FIELDS = ("env_id", "split", "algorithm", "student", "teacher", "seed")


def identity(record: dict[str, Any]) -> tuple:
    """What makes two records the same run: the identity fields, the training budget (rollout episodes: the
    same method at 64 and at 256 episodes is two results), the evaluation protocol, and whether it is the
    original or a reproduction (a rerun is published beside the original, never pooled with it)."""
    return (*(record[f] for f in IDENTITY_FIELDS), record_budget(record)[0], protocol_label(record),
            record.get("origin", "original"))


@dataclass
class AddPlan:
    """What publishing a batch will do, decided before anything is written (``Leaderboard.plan``)."""

    new: list[tuple[str, dict[str, Any]]] = field(default_factory=list)  # (source, record) to write
    already: list[tuple[str, Path]] = field(default_factory=list)  # (source, the published file with its result)
    problems: list[str] = field(default_factory=list)  # each names its record and the fix

    def check(self, fix: str = "") -> None:
        """Raise one RecordError naming every refused record, so one run shows every fix to make; ``fix``
        is what to do about the batch as a whole."""
        after = f"; {fix}" if fix else ""
        if len(self.problems) == 1:
            raise RecordError(f"{self.problems[0]} (nothing was published{after})")
        if self.problems:
            raise RecordError(f"{len(self.problems)} records refused, nothing was published{after}:\n  "
                              + "\n  ".join(self.problems))


def same_result(a: dict[str, Any], b: dict[str, Any], ignore: tuple[str, ...] = ()) -> bool:
    """Whether two records hold identical content apart from the ``ignore`` fields (compared as the record
    id compares them: canonical JSON). A dotted name (``algorithm_config.bench.train_wall_time_s``) leaves
    out a nested entry."""
    return record_id(_without(a, ignore)) == record_id(_without(b, ignore))


def _without(record: dict[str, Any], ignore: tuple[str, ...]) -> dict[str, Any]:
    """``record`` less the ``ignore`` fields (dotted names reach into nested objects); the record is not changed."""
    out = {k: v for k, v in record.items() if k not in ignore}
    for name in ignore:
        head, _, rest = name.partition(".")
        if rest and isinstance(out.get(head), dict):
            out[head] = _without(out[head], (rest,))
    return out


def _run_text(record: dict[str, Any]) -> str:
    return ", ".join([*(f"{f}={record[f]!r}" for f in IDENTITY_FIELDS), f"rollout_episodes={record_budget(record)[0]!r}"])


def _published_clash(source: str, record: dict[str, Any], path: Path, old: dict[str, Any], ignore: tuple[str, ...]) -> str:
    """Why ``record`` (from ``source``) cannot join the board that holds ``old`` in ``path``, and the fix."""
    where = f"{source}: " if source else ""
    if same_result(record, old, ignore):
        return f"{where}duplicate record: identical content is already published as {path}; leave it out"
    return (f"{where}duplicate record: a result for the same run ({_run_text(record)}) is already published as "
            f"{path}, with other content; leave this one out, or remove {path} first to replace it")


def _batch_clash(source: str, record: dict[str, Any], other_source: str, other: dict[str, Any], ignore: tuple[str, ...]) -> str:
    """Why two records of one batch cannot both be published, and the fix."""
    if same_result(record, other, ignore):
        return f"{source}: duplicate record: the same record as {other_source}; pass it once"
    return (f"{source}: duplicate record: {other_source} is another result for the same run ({_run_text(record)}); "
            "publish one of them, or evaluate the other under another seed")


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


# ----------------------------------------------------------------------------------------------------
# Escaping: every text that reaches an output goes through one of these
# ----------------------------------------------------------------------------------------------------

# what could break out of a cell or render as markup that runs: cell and row breaks, raw HTML, links
_MD_SPECIAL = {"\\": "\\\\", "|": "\\|", "`": "\\`", "<": "&lt;", ">": "&gt;", "&": "&amp;"}


def md_cell(value: Any) -> str:
    """Text safe inside a Markdown table cell: no raw HTML, no cell or row breaks, no code spans, no links
    (``](`` is broken up). Underscores and brackets stay, so ``valid_unseen`` and ``opd [temperature=1.0]``
    read as they are."""
    text = "".join(" " if not ch.isprintable() else ch for ch in str(value))
    return "".join(_MD_SPECIAL.get(ch, ch) for ch in text).replace("](", "]\\(")


def csv_cell(value: Any) -> Any:
    """A CSV cell no spreadsheet runs as a formula: text starting with = + - @ (or a tab/CR) gets a ' prefix.
    Numbers pass through as numbers."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return value
    text = "".join(" " if ch in "\r\n" else ch for ch in str(value))
    return "'" + text if text[:1] in ("=", "+", "-", "@", "\t", "\r") else text


class Leaderboard:
    def __init__(self, root: str | Path = "leaderboard"):
        self.root = Path(root)
        self.records_dir = self.root / "records"

    # ---------------------------------------------------------------- records
    @staticmethod
    def read_record(path: str | Path) -> dict[str, Any]:
        """A validated record from a file; the size is checked before the file is read."""
        path = Path(path)
        try:
            size = path.stat().st_size
            if size > MAX_RECORD_BYTES:
                raise RecordError(f"{path} is {size} bytes; a record is at most {MAX_RECORD_BYTES} bytes of JSON")
            data = path.read_bytes()
        except OSError as err:
            raise RecordError(f"cannot read a JSON record from {path}: {err}") from err
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as err:
            raise RecordError(f"cannot read a JSON record from {path}: not UTF-8 ({err})") from err
        return parse_record(text, source=str(path))

    def published(self) -> list[tuple[Path, dict[str, Any]]]:
        """(file, record) of every published record, in file order; a corrupt file is a RecordError naming it."""
        paths = sorted(self.records_dir.glob("*.json")) if self.records_dir.is_dir() else []
        return [(p, self.read_record(p)) for p in paths]

    def load_records(self) -> list[dict[str, Any]]:
        return [r for _, r in self.published()]

    def plan(self, items: list[tuple[str, dict[str, Any]]], *, skip_published: bool = False,
             ignore: tuple[str, ...] | Callable[[dict[str, Any]], tuple[str, ...]] = ()) -> "AddPlan":
        """Check a batch of validated ``(source, record)`` against the published records and each other, and
        sort it into new records, records already published and problems, before anything is written: a
        batch is published whole or not at all, so the folder and its tables never hold half of it.

        ``skip_published``: a record whose result is already published is skipped (import-bench is rerun on
        the same bench), not refused. ``ignore``: fields left out of that comparison (or a function of the
        record giving them)."""
        plan = AddPlan()
        published = self.published()
        on_board = {identity(r): (path, r) for path, r in published}
        originals = {record_id(r): r for _, r in [*published, *items]}  # what a reproduction may rerun
        in_batch: dict[tuple, tuple[str, dict[str, Any]]] = {}
        for source, record in items:
            key, fields = identity(record), ignore(record) if callable(ignore) else ignore
            problem = reproduction_problem(record, originals)
            if problem:
                plan.problems.append(f"{source or 'record'}: {problem}")
                continue
            if key in on_board:
                path, old = on_board[key]
                if skip_published and same_result(record, old, fields):
                    plan.already.append((source, path))
                else:
                    plan.problems.append(_published_clash(source, record, path, old, fields))
            elif key in in_batch:
                plan.problems.append(_batch_clash(source, record, *in_batch[key], fields))
            else:
                in_batch[key] = (source, record)
                plan.new.append((source, record))
        return plan

    def write(self, records: list[dict[str, Any]]) -> list[Path]:
        """Write checked records (see ``plan``). A write that fails part-way rebuilds the tables from what
        was written before it reports, so the tables never lag behind the records."""
        written: list[Path] = []
        for record in records:
            target = self.records_dir / f"{record_id(record)}.json"
            try:
                self.records_dir.mkdir(parents=True, exist_ok=True)
                _write_atomic(target, json.dumps(record, indent=2, sort_keys=True) + "\n")
            except OSError as err:
                if written:
                    self.build()
                raise RecordError(f"cannot write {target}: {err}; the {len(written)} record(s) written before it "
                                  "are published and the tables rebuilt; fix the folder and run it again") from err
            written.append(target)
        return written

    def add(self, record: dict[str, Any] | str | Path) -> Path:
        """Publish one record (a file or a dict); a refused record leaves the folder as it was."""
        source = str(record) if isinstance(record, (str, Path)) else ""
        if isinstance(record, (str, Path)):
            record = self.read_record(record)
        else:
            record = parse_record(json.dumps(record), source="record") if _plain(record) else _refuse(record)
        plan = self.plan([(source, record)])
        plan.check()
        return self.write([record])[0]

    # aggregation and ranking live in evaluation.leaderboard_tables; the class keeps their names for its callers
    rows = staticmethod(aggregate_rows)
    by_family = staticmethod(rows_by_family)
    best = staticmethod(best_values)
    primary_metric = staticmethod(primary_metric)
    family_tables = staticmethod(family_tables)

    # ---------------------------------------------------------------- rendering
    interval_text = staticmethod(interval_text)

    def markdown(self, rows: list[Row]) -> str:
        lines = ["# Leaderboard", "",
                 "Generated by `agentgym-opd leaderboard build` from `leaderboard/records/`; the page "
                 "(`index.html`) has the same tables, sortable, with curves and episode views.", "",
                 "Ranked tables, one per track (env family, starting student, teacher or none, protocol; a row "
                 "ranks only within its track): the primary metric per split as mean [95% interval], the interval "
                 f"being {interval_words()}; n: the episodes behind the ranking split's cell. {paired_words()} "
                 "A `*` after a name marks a row whose evaluation protocol differs from the bench's, or that was "
                 "evaluated on other tasks than the bench's record of the same split and seed; `(reproduced)` a rerun; `(dirty tree)` a row with a record "
                 "made from uncommitted code (published with --allow-dirty).", ""]
        tables = self.family_tables(rows)
        for table in [t for t in tables if not is_zero_shot(t)]:
            lines += self.ranked_markdown(table)
        lines += self.zero_shot_markdown([t for t in tables if is_zero_shot(t)])
        lines += ["# Every metric", "", "Mean +- standard error; bold: best in the env split "
                  "(lowest for mean_turns and error rates).", ""]
        # each row named as its line of the ranked table names it (budget, `same as bench`)
        shown = {id(r): m.display for table in self.family_tables(rows) for m in table.methods for r in m.by_env.values()}
        for family, frows in self.by_family(rows).items():
            metrics = sorted({m for r in frows for m in r.metrics})
            best = {m: self.best(frows, m) for m in metrics}
            lines += [f"## {md_cell(family)}: every metric", ""]
            head = ["env", "algorithm", "student", "teacher", "seeds", "n", "rollout episodes"] + metrics
            lines.append("| " + " | ".join(md_cell(h) for h in head) + " |")
            lines.append("|" + "|".join("---" for _ in head) + "|")
            for r in frows:
                episodes = "-" if r.budget[0] is None else r.budget[0]
                cells = [md_cell(x) for x in (r.env_id, shown.get(id(r), r.display_algorithm), r.student, r.teacher or "-",
                                              ",".join(map(str, r.seeds)), r.n_episodes, episodes)]
                for m in metrics:
                    if m not in r.metrics:
                        cells.append("-")
                        continue
                    mean, se = r.metrics[m]
                    text = f"{mean:.3f} +- {se:.3f}"
                    cells.append(f"**{text}**" if best[m].get(f"{r.env_id}|{r.split}") == mean else text)
                lines.append("| " + " | ".join(cells) + " |")
            lines.append("")
        return "\n".join(lines)

    def ranked_markdown(self, table: FamilyTable) -> list[str]:
        """One track's section of LEADERBOARD.md: its heading, ranked table and error breakdown (also what
        `leaderboard submit` previews for a track a submission joins)."""
        lines = [f"## {md_cell(table.track.title if table.track else table.family)}", "",
                 f"Primary metric: `{md_cell(metric_title(table.family, table.metric))}`; ranked by "
                 f"{md_cell(table.ranking_env)}.", ""]
        head = ["#", "method", *[f"{table.metric} {e.split('/', 1)[1]}" for e in table.env_ids], "n",
                *(f"vs {ref}" for ref in REFERENCES), "rollout episodes", "tokens", "teacher", "student", "seeds",
                "protocol"]
        lines.append("| " + " | ".join(md_cell(h) for h in head) + " |")
        lines.append("|" + "|".join("---" for _ in head) + "|")
        for group, m in zip(rank_groups(table), table.methods):
            name = (m.display + (" *" if m.protocol_differs else "") + (" (reproduced)" if m.reproduced else "")
                    + (" (dirty tree)" if m.dirty else "") + (" (judge not tested)" if m.judge_untested else ""))
            episodes, tokens = m.budget
            ranking = m.by_env.get(table.ranking_env)
            diffs = reference_differences(table, m)
            cells = [group, name, *[self.interval_text(m.by_env.get(e), table.metric) for e in table.env_ids],
                     "-" if ranking is None else str(ranking.episodes_behind(table.metric)),
                     *("-" if diffs[ref] is None else diffs[ref].text() for ref in REFERENCES),
                     "-" if episodes is None else str(episodes), "-" if tokens is None else str(tokens),
                     m.teacher or "-", m.student, ",".join(map(str, m.seeds)), m.shown_protocol or "bench"]
            lines.append("| " + " | ".join(md_cell(c) for c in cells) + " |")
        lines += [f"\n{md_cell(m.display)}: {md_cell(m.judge_untested)}." for m in table.methods
                  if m.judge_untested]
        lines += ["", f"Errors on {md_cell(table.ranking_env)} (share of turns, by kind):", ""]
        kinds = error_kinds(table)
        head = ["method", "error_rate", *kinds]
        lines.append("| " + " | ".join(md_cell(h) for h in head) + " |")
        lines.append("|" + "|".join("---" for _ in head) + "|")
        for m in table.methods:
            r = m.by_env.get(table.ranking_env)
            cells = [m.display] + [f"{r.metrics[k][0]:.3f}" if r and k in r.metrics else ("0.000" if r else "-")
                                   for k in ["error_rate", *(f"error_rate/{k}" for k in kinds)]]
            lines.append("| " + " | ".join(md_cell(c) for c in cells) + " |")
        lines.append("")
        return lines

    def zero_shot_markdown(self, tables: list[FamilyTable]) -> list[str]:
        """One table of every zero-shot track (an untrained model under its own protocol): env, model, the
        family's primary metric with its interval and n, and the protocol."""
        if not tables:
            return []
        lines = ["## Zero-shot models", "", "Untrained models, each evaluated once under its env's own protocol "
                 "(no trained row shares it, so there is nothing to rank them against).", ""]
        head = ["env", "model", "metric", "value [95% interval]", "n", "seeds", "protocol"]
        lines.append("| " + " | ".join(head) + " |")
        lines.append("|" + "|".join("---" for _ in head) + "|")
        for table in tables:
            for m in table.methods:
                r = m.by_env[table.ranking_env]
                cells = [table.ranking_env, m.student, metric_title(table.family, table.metric),
                         self.interval_text(r, table.metric), r.episodes_behind(table.metric),
                         ",".join(map(str, m.seeds)), m.shown_protocol]
                lines.append("| " + " | ".join(md_cell(c) for c in cells) + " |")
        return lines + [""]

    def csv(self, rows: list[Row]) -> str:
        metrics = sorted({m for r in rows for m in r.metrics})
        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator="\n")
        writer.writerow(["env_family", "env_id", "split", "algorithm", "protocol", "student", "teacher", "seeds", "n_episodes",
                         "rollout_episodes", "tokens", "origin"]
                        + [f"{m}{s}" for m in metrics for s in ("", "_stderr", "_ci95_low", "_ci95_high")]
                        + ["dirty_tree"] + list(TRACK_CSV_COLUMNS))
        tracks = track_csv_cells(rows)
        for r in rows:
            values: list[Any] = []
            for m in metrics:
                ci = r.interval(m)
                values += [r.metrics[m][0], r.metrics[m][1], round(ci[1], 6), round(ci[2], 6)] if ci else ["", "", "", ""]
            episodes, tokens = r.budget
            writer.writerow([csv_cell(x) for x in
                             [env_family(r.env_id), r.env_id, r.split, r.algorithm, r.protocol, r.student, r.teacher or "",
                              " ".join(map(str, r.seeds)), r.n_episodes, "" if episodes is None else episodes,
                              "" if tokens is None else tokens, " ".join(sorted(set(r.origins)))]] + values
                            + ["yes" if r.dirty else ""] + [csv_cell(x) for x in tracks[id(r)]])
        return buf.getvalue()

    def outputs(self) -> dict[Path, str]:
        """Every generated file (path -> text) from the current records; nothing is written."""
        from evaluation.leaderboard_html import render_episode_pages, render_html

        rows = self.rows(self.load_records())
        outputs = {
            self.root / "LEADERBOARD.md": self.markdown(rows),
            self.root / "leaderboard.csv": self.csv(rows),
            self.root / "index.html": render_html(self, rows),
        }
        for name, text in render_episode_pages(self, rows).items():
            outputs[self.root / "episodes" / name] = text
        return outputs

    def build(self) -> list[Path]:
        """Render LEADERBOARD.md, leaderboard.csv, index.html and the episode pages; nothing is written if
        any record is bad. Episode pages of records no longer published are removed."""
        outputs = self.outputs()
        self.root.mkdir(parents=True, exist_ok=True)
        (self.root / "episodes").mkdir(exist_ok=True)
        for stale in (self.root / "episodes").glob("*.html"):
            if stale not in outputs:
                stale.unlink()
        for path, text in outputs.items():
            _write_atomic(path, text)
        return list(outputs)



def _plain(record: Any) -> bool:
    try:
        json.dumps(record, allow_nan=False)
        return True
    except (TypeError, ValueError, RecursionError):
        return False


def _refuse(record: Any) -> dict[str, Any]:
    raise RecordError("a record must be plain, finite JSON (objects, lists, strings, finite numbers)")
