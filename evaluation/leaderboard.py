"""The leaderboard: published result records in `leaderboard/records/`, rendered to Markdown, CSV and HTML.

`add` accepts a record only if it validates and is not already there (same content, or the same run:
env, split, algorithm, student, teacher, seed, training budget and protocol); it is written atomically, so a refused or
interrupted add leaves the folder as it was. A batch (several files, a bench) is checked whole first
(`plan`: every record against the published ones and against the others of the batch), then written, so
a batch with one bad record publishes none of them. `build` reads every record (a corrupt one stops the build,
naming the file, before anything is written), groups records of the same env split x algorithm x student
x teacher x budget x protocol over seeds, and renders

- per env family, one **ranked table**: one row per method (algorithm x student x teacher x budget x protocol;
  a method at several budgets is named with each),
  the family's primary metric first with one column per split (held-out split first, the ranking key),
  each as mean and 95% interval, then the training budget (rollout episodes, tokens), teacher, student,
  seeds and protocol; rows whose protocol differs from the bench's are marked;
- per family, the per-error-kind breakdown of every method on the held-out split;
- the full table of every metric per env split (mean +- standard error, best per column in bold).

Aggregating over seeds: with one record a cell shows that record's mean and its own standard error
(over episodes); with k >= 2 seed records it shows the mean of the seed means and the standard error of
that mean across seeds (std/sqrt(k)). The 95% interval is mean +- q * se with q the Student-t quantile
for k - 1 degrees of freedom across seeds (4.30 for 3 seeds); for one record it is Wilson's score interval
for the success rate (over its episodes) and mean +- 1.96 se for other metrics; a rate's interval is
clipped to [0, 1]. A column's best value is marked only where the column's values differ.

Every text cell is escaped for its format (Markdown: HTML and table syntax; CSV: formula prefixes; HTML:
entities), because names and episode texts come from third parties and agents.
"""

from __future__ import annotations

import csv
import functools
import io
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from evaluation.records import (BENCH_CONTEXT_TOKENS, MAX_RECORD_BYTES, RecordError, REFERENCE_ROWS, env_args_label,
                                env_family, is_rate, lower_is_better, parse_record, protocol_label, record_id,
                                reproduction_problem)

IDENTITY_FIELDS = ("env_id", "split", "algorithm", "student", "teacher", "seed")
# the headline metric of an env family, where it is not success
HEADLINE_METRICS = {"searchqa": "em", "code": "pass@1"}
# what success_rate is, in a family's own terms, when the headline metric is not recorded under its name:
# a searchqa episode succeeds on an exact match, and a code task's success rate over equal samples per
# task is the unbiased pass@1
SUCCESS_MEANS = {"searchqa": "exact match", "code": "pass@1"}


def metric_title(family: str, metric: str) -> str:
    """The primary metric's name for a table's caption, with its benchmark meaning where it has one."""
    meaning = SUCCESS_MEANS.get(family) if metric == "success_rate" else None
    return f"{metric} (= {meaning})" if meaning else metric
# split names in the order the ranked table shows them: held-out first (it is the ranking key)
SPLIT_ORDER = ("valid_unseen", "unseen", "test", "valid_seen", "seen", "valid", "dev", "train")
# the protocol entries two rows must share to be compared as equals
COMPARED_PROTOCOL = ("temperature", "samples", "max_new_tokens", "max_turns", "action_parser", "env_args",
                     "system_prompt", "max_context_tokens")
# per-episode 0/1 outcomes: one record's interval is Wilson's (over its episodes)
BINARY_METRICS = frozenset({"success_rate"})
# Student-t 0.975 quantiles, by degrees of freedom (1-30); beyond: the normal 1.96
T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
        2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


def identity(record: dict[str, Any]) -> tuple:
    """What makes two records the same run: the identity fields, the training budget (rollout episodes: the
    same method at 64 and at 256 episodes is two results), the evaluation protocol, and whether it is the
    original or a reproduction (a rerun is published beside the original, never pooled with it)."""
    return (*(record[f] for f in IDENTITY_FIELDS), record_budget(record)[0], protocol_label(record),
            record.get("origin", "original"))


def quantile95(n_seeds: int) -> float:
    if n_seeds <= 1:
        return 1.96
    df = n_seeds - 1
    return T975[df - 1] if df <= len(T975) else 1.96


def wilson_interval(p: float, n: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson's 95% score interval of a success share ``p`` over ``n`` episodes: unlike mean +- 1.96 se it
    does not collapse to a point at 0 or 1, which small evaluations hit all the time."""
    if n <= 0:
        return 0.0, 1.0
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def interval_words() -> str:
    """How ``Row.interval`` computes one record's interval, in words, for the tables' captions (from the same
    constants, so the caption cannot drift from the numbers)."""
    return (f"Wilson's score interval over its episodes for {', '.join(sorted(BINARY_METRICS))}, "
            "mean +- 1.96 se for other metrics")


def effective_protocol(record: dict[str, Any]) -> dict[str, Any]:
    """The comparable protocol of a record: its ``protocol`` field, or for a bench record (which states
    its settings in ``algorithm_config['bench']``) the bench's greedy evaluation settings."""
    if record.get("protocol"):
        return {k: record["protocol"].get(k) for k in COMPARED_PROTOCOL}
    bench = (record.get("algorithm_config") or {}).get("bench")
    if isinstance(bench, dict):
        return {"temperature": 0.0, "samples": 1, "max_new_tokens": bench.get("max_new_tokens"),
                "max_turns": bench.get("max_turns"), "action_parser": "text",
                "env_args": env_args_label(bench.get("env_args")), "system_prompt": family_prompt(record["env_id"]),
                "max_context_tokens": BENCH_CONTEXT_TOKENS}
    return {k: None for k in COMPARED_PROTOCOL}


@functools.lru_cache(maxsize=None)
def family_prompt(env_id: str) -> str | None:
    """The system prompt the bench plays ``env_id`` with (the env's registered one; the bench never sets
    another), or None where no installed package registers the env (or can load its prompt)."""
    from agentgym_opd.registry import UnknownIdError, env_protocol

    try:
        return env_protocol(env_id).system_prompt
    except (UnknownIdError, ImportError):  # not installed here, or its prompt's module cannot load
        return None


def record_budget(record: dict[str, Any]) -> tuple[int | None, int | None]:
    """(rollout episodes, tokens) the training spent: the ``budget`` field, else the bench's section."""
    if record.get("budget"):
        return record["budget"]["rollout_episodes"], record["budget"]["tokens"]
    bench = (record.get("algorithm_config") or {}).get("bench")
    if isinstance(bench, dict) and isinstance(bench.get("budget_episodes"), int):
        if record["algorithm"] in REFERENCE_ROWS:  # they train nothing
            return 0, None
        return bench["budget_episodes"], None
    return None, None


@dataclass
class Row:
    env_id: str
    split: str
    algorithm: str
    student: str
    teacher: str | None
    seeds: list[int] = field(default_factory=list)
    n_episodes: int = 0
    metrics: dict[str, tuple[float, float]] = field(default_factory=dict)
    curves: list[list[dict[str, Any]]] = field(default_factory=list)
    protocol: str = ""  # records.protocol_label: rows evaluated differently are never pooled
    protocol_short: str = ""  # the same without the eval defaults, for a method's name
    protocol_shown: str = ""  # the whole protocol with the system prompt as a fingerprint, for a table's column
    effective_protocol: dict[str, Any] = field(default_factory=dict)
    budget: tuple[int | None, int | None] = (None, None)
    origins: list[str] = field(default_factory=list)
    record_ids: list[str] = field(default_factory=list)  # seed order
    episodes: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # record id -> traces
    tasks: dict[int, str] = field(default_factory=dict)  # seed -> provenance.tasks_sha256 (where stated)

    @property
    def display_algorithm(self) -> str:
        return f"{self.algorithm} [{self.protocol_short}]" if self.protocol_short else self.algorithm

    @property
    def method_key(self) -> tuple:
        return (self.algorithm, self.student, self.teacher, self.protocol, self.budget[0], tuple(sorted(set(self.origins))))

    def interval(self, metric: str) -> tuple[float, float, float] | None:
        """(mean, low, high) of the 95% interval; None if the row lacks the metric."""
        if metric not in self.metrics:
            return None
        mean, se = self.metrics[metric]
        if len(self.seeds) == 1 and metric in BINARY_METRICS:
            return (mean, *wilson_interval(mean, self.n_episodes))
        half = quantile95(len(self.seeds)) * se
        low, high = mean - half, mean + half
        if is_rate(metric):
            low, high = max(0.0, low), min(1.0, high)
        return mean, low, high


def split_key(name: str) -> tuple[int, str]:
    return (SPLIT_ORDER.index(name) if name in SPLIT_ORDER else len(SPLIT_ORDER), name)


@dataclass
class Method:
    """One line of a family's ranked table: a method's rows on every env split of the family."""

    algorithm: str
    student: str
    teacher: str | None
    protocol: str
    display: str
    shown_protocol: str = ""  # `protocol` with the system prompt as a fingerprint (tables)
    by_env: dict[str, Row] = field(default_factory=dict)
    protocol_differs: bool = False
    other_tasks: bool = False  # an eval record on other tasks than the bench's record of the same env and seed

    @property
    def seeds(self) -> list[int]:
        return sorted({s for r in self.by_env.values() for s in r.seeds})

    @property
    def budget(self) -> tuple[int | None, int | None]:
        for r in self.by_env.values():
            if r.budget != (None, None):
                return r.budget
        return (None, None)

    @property
    def reproduced(self) -> bool:
        return any("reproduced" in r.origins for r in self.by_env.values())


@dataclass
class FamilyTable:
    family: str
    metric: str  # the primary metric
    env_ids: list[str]  # split columns, held-out first
    ranking_env: str
    methods: list[Method]  # ranked
    bench_protocol: dict[str, Any] | None


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

    # ---------------------------------------------------------------- aggregation
    @staticmethod
    def rows(records: list[dict[str, Any]]) -> list[Row]:
        groups: dict[tuple, list[dict[str, Any]]] = {}
        for r in records:
            groups.setdefault((r["env_id"], r["split"], r["algorithm"], r["student"], r["teacher"], protocol_label(r),
                               record_budget(r)[0], r.get("origin", "original")), []).append(r)
        rows = []
        for (env_id, split, algo, student, teacher, protocol, _episodes, _origin), recs in sorted(
                groups.items(), key=lambda kv: tuple(str(x) for x in kv[0])):
            recs = sorted(recs, key=lambda r: r["seed"])
            row = Row(env_id, split, algo, student, teacher, [r["seed"] for r in recs], sum(r["n_episodes"] for r in recs),
                      protocol=protocol, protocol_short=protocol_label(recs[0], short=True),
                      protocol_shown=protocol_label(recs[0], fingerprint_prompt=True),
                      effective_protocol=effective_protocol(recs[0]), budget=record_budget(recs[0]),
                      origins=[r.get("origin", "original") for r in recs], record_ids=[record_id(r) for r in recs])
            names = sorted({m for r in recs for m in r["metrics"]})
            for name in names:
                vals = [r["metrics"][name] for r in recs if name in r["metrics"]]
                if len(vals) == 1:
                    row.metrics[name] = (vals[0]["mean"], vals[0]["stderr"])
                else:
                    means = [v["mean"] for v in vals]
                    mu = sum(means) / len(means)
                    sd = math.sqrt(sum((m - mu) ** 2 for m in means) / (len(means) - 1))
                    row.metrics[name] = (mu, sd / math.sqrt(len(means)))
            row.curves = [r["curve"] for r in recs if r.get("curve")]
            row.episodes = {rid: r["episodes"] for rid, r in zip(row.record_ids, recs) if r.get("episodes")}
            row.tasks = {r["seed"]: r["provenance"]["tasks_sha256"] for r in recs if r.get("provenance")}
            rows.append(row)
        return rows

    @staticmethod
    def by_family(rows: list[Row]) -> dict[str, list[Row]]:
        """Rows per env family: families the bench itself evaluated (rows without an eval protocol) first,
        since that is the table a reader comes for, then the others alphabetically."""
        out: dict[str, list[Row]] = {}
        for row in rows:
            out.setdefault(env_family(row.env_id), []).append(row)
        return dict(sorted(out.items(), key=lambda kv: (not any(r.protocol == "" for r in kv[1]), kv[0])))

    @staticmethod
    def best(rows: list[Row], metric: str) -> dict[str, float]:
        """Best value of `metric` per env split (rows compete only within the same env split); a split
        where every row has the same value has no best (nothing to highlight when all are 0.000)."""
        values: dict[str, list[float]] = {}
        for row in rows:
            if metric in row.metrics:
                values.setdefault(f"{row.env_id}|{row.split}", []).append(row.metrics[metric][0])
        return {key: (min(v) if lower_is_better(metric) else max(v)) for key, v in values.items() if len(set(v)) > 1}

    @staticmethod
    def primary_metric(family: str, rows: list[Row]) -> str:
        names = {m for r in rows for m in r.metrics}
        headline = HEADLINE_METRICS.get(family)
        if headline in names:
            return headline  # type: ignore[return-value]
        return "success_rate" if "success_rate" in names or not names else sorted(names)[0]

    def family_tables(self, rows: list[Row]) -> list[FamilyTable]:
        """The ranked table of each env family (see the module docstring)."""
        tables = []
        for family, frows in self.by_family(rows).items():
            metric = self.primary_metric(family, frows)
            env_ids = sorted({r.env_id for r in frows}, key=lambda e: split_key(e.split("/", 1)[1]))
            ranking_env = env_ids[0]
            methods: dict[tuple, Method] = {}
            for r in frows:
                m = methods.setdefault(r.method_key, Method(r.algorithm, r.student, r.teacher, r.protocol, r.display_algorithm,
                                                            r.protocol_shown))
                m.by_env[r.env_id] = r
            bench_rows = [r for r in frows if r.protocol == "" and r.effective_protocol.get("max_turns") is not None]
            bench = [r.effective_protocol for r in bench_rows]
            bench_protocol = max(bench, key=lambda p: sum(q == p for q in bench)) if bench else None
            bench_tasks = {(r.env_id, seed): sha for r in bench_rows for seed, sha in r.tasks.items()}
            for m in methods.values():
                proto = next(iter(m.by_env.values())).effective_protocol
                m.other_tasks = bool(m.protocol) and any(
                    bench_tasks.get((r.env_id, seed), sha) != sha for r in m.by_env.values() for seed, sha in r.tasks.items())
                m.protocol_differs = bench_protocol is not None and (proto != bench_protocol or m.other_tasks)
                if m.other_tasks:
                    m.shown_protocol += " (other tasks than the bench's seeds: eval --bench-tasks)"
                if bench_protocol is not None and not m.protocol_differs and m.protocol:
                    # an `eval` record made with the bench's protocol (README "Publish a result"): named and
                    # shown like the bench's rows, not by its protocol's entries
                    m.display, m.shown_protocol = m.algorithm, "same as bench"
            # the same method (algorithm, student, teacher) at several budgets: every line of it carries its
            # budget in the name, whatever its protocol
            budgets: dict[tuple, set] = {}
            for key in methods:
                budgets.setdefault(key[:3], set()).add(key[4])
            for key, m in methods.items():
                if len(budgets[key[:3]] - {None}) > 1 and key[4] is not None:
                    m.display += f" ({key[4]} episodes)"

            def rank_key(m: Method) -> tuple:
                sign = 1.0 if lower_is_better(metric) else -1.0
                values = []
                for env_id in env_ids:
                    r = m.by_env.get(env_id)
                    values.append(sign * r.metrics[metric][0] if r and metric in r.metrics else math.inf)
                return (*values, m.display, m.student)

            tables.append(FamilyTable(family, metric, env_ids, ranking_env, sorted(methods.values(), key=rank_key), bench_protocol))
        return tables

    # ---------------------------------------------------------------- rendering
    @staticmethod
    def interval_text(row: Row | None, metric: str) -> str:
        ci = row.interval(metric) if row is not None else None
        if ci is None:
            return "-"
        mean, low, high = ci
        return f"{mean:.3f} [{low:.3f}, {high:.3f}]"

    def markdown(self, rows: list[Row]) -> str:
        lines = ["# Leaderboard", "",
                 "Generated by `agentgym-opd leaderboard build` from `leaderboard/records/`; the page "
                 "(`index.html`) has the same tables, sortable, with curves and episode views.", "",
                 "Ranked tables: the primary metric per split as mean [95% interval] (seeds: Student-t over seed "
                 f"means; one record: {interval_words()}), ranked by the first (held-out) split. "
                 "A `*` marks a row whose evaluation protocol differs from the bench's, or that was evaluated on other tasks "
                 "than the bench's record of the same split and seed; `(reproduced)` a rerun.", ""]
        for table in self.family_tables(rows):
            lines += [f"## {md_cell(table.family)}", "",
                      f"Primary metric: `{md_cell(metric_title(table.family, table.metric))}`; ranked by "
                      f"{md_cell(table.ranking_env)}.", ""]
            head = ["#", "method", *[f"{table.metric} {e.split('/', 1)[1]}" for e in table.env_ids],
                    "rollout episodes", "tokens", "teacher", "student", "seeds", "protocol"]
            lines.append("| " + " | ".join(md_cell(h) for h in head) + " |")
            lines.append("|" + "|".join("---" for _ in head) + "|")
            for rank, m in enumerate(table.methods, 1):
                name = m.display + (" *" if m.protocol_differs else "") + (" (reproduced)" if m.reproduced else "")
                episodes, tokens = m.budget
                cells = [str(rank), name, *[self.interval_text(m.by_env.get(e), table.metric) for e in table.env_ids],
                         "-" if episodes is None else str(episodes), "-" if tokens is None else str(tokens),
                         m.teacher or "-", m.student, ",".join(map(str, m.seeds)), m.shown_protocol or "bench"]
                lines.append("| " + " | ".join(md_cell(c) for c in cells) + " |")
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
        lines += ["# Every metric", "", "Mean +- standard error; bold: best in the env split "
                  "(lowest for mean_turns and error rates).", ""]
        # each row named as its line of the ranked table names it (budget, `same as bench`)
        shown = {id(r): m.display for table in self.family_tables(rows) for m in table.methods for r in m.by_env.values()}
        for family, frows in self.by_family(rows).items():
            metrics = sorted({m for r in frows for m in r.metrics})
            best = {m: self.best(frows, m) for m in metrics}
            lines += [f"## {md_cell(family)}: every metric", ""]
            head = ["env", "algorithm", "student", "teacher", "seeds", "n"] + metrics
            lines.append("| " + " | ".join(md_cell(h) for h in head) + " |")
            lines.append("|" + "|".join("---" for _ in head) + "|")
            for r in frows:
                cells = [md_cell(x) for x in (r.env_id, shown.get(id(r), r.display_algorithm), r.student, r.teacher or "-",
                                              ",".join(map(str, r.seeds)), r.n_episodes)]
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

    def csv(self, rows: list[Row]) -> str:
        metrics = sorted({m for r in rows for m in r.metrics})
        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator="\n")
        writer.writerow(["env_family", "env_id", "split", "algorithm", "protocol", "student", "teacher", "seeds", "n_episodes",
                         "rollout_episodes", "tokens", "origin"]
                        + [f"{m}{s}" for m in metrics for s in ("", "_stderr", "_ci95_low", "_ci95_high")])
        for r in rows:
            values: list[Any] = []
            for m in metrics:
                ci = r.interval(m)
                values += [r.metrics[m][0], r.metrics[m][1], round(ci[1], 6), round(ci[2], 6)] if ci else ["", "", "", ""]
            episodes, tokens = r.budget
            writer.writerow([csv_cell(x) for x in
                             [env_family(r.env_id), r.env_id, r.split, r.algorithm, r.protocol, r.student, r.teacher or "",
                              " ".join(map(str, r.seeds)), r.n_episodes, "" if episodes is None else episodes,
                              "" if tokens is None else tokens, " ".join(sorted(set(r.origins)))]] + values)
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


def error_kinds(table: FamilyTable) -> list[str]:
    """The error kinds that occur anywhere in the family (the breakdown's columns)."""
    from agentgym_opd.types import ERROR_KINDS

    seen = {k.split("/", 1)[1] for m in table.methods for r in m.by_env.values() for k in r.metrics if k.startswith("error_rate/")}
    return [k for k in ERROR_KINDS if k in seen]


def _plain(record: Any) -> bool:
    try:
        json.dumps(record, allow_nan=False)
        return True
    except (TypeError, ValueError, RecursionError):
        return False


def _refuse(record: Any) -> dict[str, Any]:
    raise RecordError("a record must be plain, finite JSON (objects, lists, strings, finite numbers)")
