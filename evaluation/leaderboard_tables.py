"""The leaderboard's numbers: records pooled over seeds into rows, rows into each env family's ranked table.

`aggregate_rows` groups records of the same env split x algorithm x student x teacher x budget x protocol x
origin over seeds; a share's cell pools the seeds' episodes and `Row.interval` is Wilson's 95% interval over
them (the one interval every output shows, `interval_words`); `family_tables` ranks each track's methods
(`evaluation.leaderboard_tracks`) by its primary metric on the held-out split, and
`evaluation.leaderboard_ranks` groups ranks and pairs rows from the per-episode evidence.
`evaluation.leaderboard` stores records and renders these tables (the module docstring there says what a
reader sees); nothing here reads or writes a file.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass, field
from typing import Any

from evaluation.records import (BENCH_CONTEXT_TOKENS, REFERENCE_ROWS, dirty_revisions, env_args_label, env_family,
                                is_rate, lower_is_better, protocol_label, record_id)
from evaluation.judge_diagnostics import judge_untested
from evaluation.leaderboard_tracks import BENCH_PROTOCOL, Track, assign_tracks

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
def wilson_interval(p: float, n: int) -> tuple[float, float]:
    """Wilson's 95% score interval of a success share ``p`` over ``n`` episodes: the bench's own
    (`evaluation.bench.stats`), so the leaderboard and the bench print the same interval for a cell. Unlike
    mean +- 1.96 se it does not collapse to a point at 0 or 1, which small evaluations hit all the time."""
    from evaluation.bench.stats import wilson_interval as bench_wilson

    return bench_wilson(round(p * n, 9), n)


def interval_words() -> str:
    """How ``Row.interval`` computes a cell's interval, in words, for the tables' captions (one place, so the
    caption cannot drift from the numbers)."""
    return ("Wilson's 95% score interval over the row's evaluation episodes pooled over its seeds (n: those "
            "episodes; a row that trains nothing counts tasks it replayed under several seeds once); a metric "
            "that is not a share: mean +- 1.96 se")


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
    outcomes: dict[tuple[int, str], float] = field(default_factory=dict)  # (seed, task) -> success, where recorded
    pooled: dict[str, tuple[float, int]] = field(default_factory=dict)  # rate metric -> (sum over episodes, episodes)
    training: dict[str, dict[str, float]] = field(default_factory=dict)  # record id -> its `training` diagnostics
    dirty: bool = False  # a record behind it was made from a tree with uncommitted changes (add --allow-dirty)
    bench_track: str = ""  # the named bench track (`bench --track NAME`) a bench record ran, else ""
    curve_tasks: int | None = None  # the tasks each training-curve point plays (the bench preset's curve_episodes)

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
        if metric in self.pooled:
            total, n = self.pooled[metric]
            return (total / n, *wilson_interval(total / n, n))
        mean, se = self.metrics[metric]
        return mean, mean - 1.96 * se, mean + 1.96 * se

    def episodes_behind(self, metric: str) -> int:
        """The n of ``interval(metric)``: the pooled episodes behind a rate, else the row's episodes."""
        return self.pooled[metric][1] if metric in self.pooled else self.n_episodes


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

    @property
    def dirty(self) -> bool:
        return any(r.dirty for r in self.by_env.values())

    @property
    def judge_untested(self) -> str | None:
        """Why this SAGE-OPD method's runs did not test its judge (they weighted error turns only), or None."""
        if self.algorithm != "sage_opd":
            return None
        return judge_untested(t for r in self.by_env.values() for t in r.training.values())


@dataclass
class FamilyTable:
    family: str
    metric: str  # the primary metric
    env_ids: list[str]  # split columns, held-out first
    ranking_env: str
    methods: list[Method]  # ranked
    bench_protocol: dict[str, Any] | None
    track: Track | None = None  # the starting point every method of the table shares



def aggregate_rows(records: list[dict[str, Any]]) -> list[Row]:
    """One row per env split x method (algorithm, student, teacher, protocol, budget, origin), pooled over its
    seeds: one record's own mean and standard error, or the mean of the seed means and their standard error."""
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
        row.pooled = pooled_rates(recs)
        for name, (total, n) in row.pooled.items():  # a rate's mean is the pooled one its interval is about
            row.metrics[name] = (total / n, row.metrics[name][1])
        row.outcomes = {(r["seed"], task): float(v) for r in recs for task, v in (r.get("outcomes") or {}).items()}
        row.curves = [r["curve"] for r in recs if r.get("curve")]
        row.episodes = {rid: r["episodes"] for rid, r in zip(row.record_ids, recs) if r.get("episodes")}
        row.training = {rid: r["training"] for rid, r in zip(row.record_ids, recs) if r.get("training")}
        row.tasks = {r["seed"]: r["provenance"]["tasks_sha256"] for r in recs if r.get("provenance")}
        row.dirty = any(dirty_revisions(r) for r in recs)
        bench = (recs[0].get("algorithm_config") or {}).get("bench")
        row.bench_track = str(bench.get("track") or "") if isinstance(bench, dict) else ""
        row.curve_tasks = curve_tasks(recs[0]) if row.curves else None
        rows.append(row)
    return rows


def curve_tasks(record: dict[str, Any]) -> int | None:
    """How many tasks each point of a bench record's training curve plays: its preset's ``curve_episodes`` (no
    bench flag changes it, so the preset its provenance command names, `--track NAME` and `--quick`, holds it);
    None where the command names no known preset."""
    from evaluation.bench.settings import BenchError, BenchSettings, curve_task_count

    argv = ((record.get("provenance") or {}).get("training") or record.get("provenance") or {}).get("command") or []
    if "bench" not in argv:
        return None
    quick = "--quick" in argv
    try:
        if "--track" in argv[:-1]:
            from evaluation.bench.tracks import track_settings

            # env_args given: the track's own would locate its training data, which the count does not need
            return curve_task_count(track_settings(argv[argv.index("--track") + 1], quick=quick, env_args={}))
        env = (record.get("algorithm_config") or {}).get("bench", {}).get("train_env")
        preset = BenchSettings.quick if quick else BenchSettings.full
        return curve_task_count(preset(env=env) if env else preset())
    except (BenchError, TypeError, ValueError):  # a track this install does not register, a preset that refuses
        return None


def pooled_rates(records: list[dict[str, Any]]) -> dict[str, tuple[float, int]]:
    """Per rate metric, (sum over episodes, episodes) of the seed records pooled: the row's cell is the share
    over every evaluation episode, as the bench prints it. A row that trains nothing (the warm start, the
    teacher, an untrained model) evaluated the same tasks under several seeds played the same episodes again,
    so those tasks count once."""
    trains_nothing = all(record_budget(r)[0] in (0, None) and not r.get("curve") for r in records)
    seen: set[str] = set()
    kept = []
    for r in records:
        tasks = (r.get("provenance") or {}).get("tasks_sha256")
        if trains_nothing and tasks is not None:
            if tasks in seen:
                continue
            seen.add(tasks)
        kept.append(r)
    pooled: dict[str, tuple[float, int]] = {}
    for name in sorted({m for r in kept for m in r["metrics"] if is_rate(m)}):
        having = [r for r in kept if name in r["metrics"]]
        pooled[name] = (sum(r["metrics"][name]["mean"] * r["n_episodes"] for r in having),
                        sum(r["n_episodes"] for r in having))
    return pooled


def rows_by_family(rows: list[Row]) -> dict[str, list[Row]]:
    """Rows per env family: families the bench itself evaluated (rows without an eval protocol) first,
    since that is the table a reader comes for, then the others alphabetically."""
    out: dict[str, list[Row]] = {}
    for row in rows:
        out.setdefault(env_family(row.env_id), []).append(row)
    return dict(sorted(out.items(), key=lambda kv: (not any(r.protocol == "" for r in kv[1]), kv[0])))


def best_values(rows: list[Row], metric: str) -> dict[str, float]:
    """Best value of `metric` per env split (rows compete only within the same env split); a split
    where every row has the same value has no best (nothing to highlight when all are 0.000)."""
    values: dict[str, list[float]] = {}
    for row in rows:
        if metric in row.metrics:
            values.setdefault(f"{row.env_id}|{row.split}", []).append(row.metrics[metric][0])
    return {key: (min(v) if lower_is_better(metric) else max(v)) for key, v in values.items() if len(set(v)) > 1}


def primary_metric(family: str, rows: list[Row]) -> str:
    names = {m for r in rows for m in r.metrics}
    headline = HEADLINE_METRICS.get(family)
    if headline in names:
        return headline  # type: ignore[return-value]
    return "success_rate" if "success_rate" in names or not names else sorted(names)[0]


def family_tables(rows: list[Row]) -> list[FamilyTable]:
    """The ranked table of each track (``evaluation.leaderboard_tracks``): per env family, the bench's track
    first, then the others by name; a row ranks only against the rows of its own track."""
    tables = []
    for family, frows in rows_by_family(rows).items():
        metric = primary_metric(family, frows)
        env_ids = sorted({r.env_id for r in frows}, key=lambda e: split_key(e.split("/", 1)[1]))
        methods, bench_protocol = family_methods(frows)
        tracks = assign_tracks(methods.values(), family, student=lambda m: m.student, teacher=lambda m: m.teacher,
                               protocol=lambda m: track_protocol(m, bench_protocol),
                               is_teacher_reference=lambda m: m.algorithm == "teacher" and not m.protocol)
        family_bench_first = sorted(tracks.items(), key=lambda kv: (kv[0].protocol != BENCH_PROTOCOL,
                                                                    not any(m.protocol == "" for m in kv[1]), kv[0].title))
        for track, members in family_bench_first:
            named = {r.bench_track for m in members for r in m.by_env.values() if r.protocol == "" and r.bench_track}
            if track.protocol == BENCH_PROTOCOL and len(named) == 1:
                track = dataclasses.replace(track, bench_track=named.pop())
            track_envs = [e for e in env_ids if any(e in m.by_env for m in members)]
            ranked = sorted(members, key=lambda m: rank_key(m, metric, track_envs))
            tables.append(FamilyTable(family, metric, track_envs, track_envs[0], ranked, bench_protocol, track))
    return tables


def family_methods(frows: list[Row]) -> tuple[dict[tuple, Method], dict[str, Any] | None]:
    """A family's rows gathered into methods (a method's rows on every split), each marked where its protocol
    or its tasks differ from the bench's, and the bench's protocol (the one most of its rows share)."""
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
    return methods, bench_protocol


def is_zero_shot(table: FamilyTable) -> bool:
    """A track of untrained models evaluated under their own protocol (no bench rows to compare with): shown
    together in one zero-shot table rather than as a ranked table of one row each."""
    return (table.track is not None and table.track.protocol != BENCH_PROTOCOL
            and all(m.algorithm == "base" and not m.teacher for m in table.methods))


def track_protocol(m: Method, bench_protocol: dict[str, Any] | None) -> str:
    """The protocol part of a method's track: the bench's where the family has bench rows and the method was
    evaluated like them, else the method's own protocol."""
    if m.protocol_differs or (bench_protocol is None and m.protocol):
        return m.shown_protocol
    return BENCH_PROTOCOL


def rank_key(m: Method, metric: str, env_ids: list[str]) -> tuple:
    """Best first by ``metric`` on the first split, then the next splits; missing values last."""
    sign = 1.0 if lower_is_better(metric) else -1.0
    values = []
    for env_id in env_ids:
        r = m.by_env.get(env_id)
        values.append(sign * r.metrics[metric][0] if r and metric in r.metrics else math.inf)
    return (*values, m.display, m.budget[0] if m.budget[0] is not None else -1, m.student)


def interval_text(row: Row | None, metric: str) -> str:
    ci = row.interval(metric) if row is not None else None
    if ci is None:
        return "-"
    mean, low, high = ci
    return f"{mean:.3f} [{low:.3f}, {high:.3f}]"


def error_kinds(table: FamilyTable) -> list[str]:
    """The error kinds that occur anywhere in the family (the breakdown's columns)."""
    from agentgym_opd.types import ERROR_KINDS

    seen = {k.split("/", 1)[1] for m in table.methods for r in m.by_env.values() for k in r.metrics if k.startswith("error_rate/")}
    return [k for k in ERROR_KINDS if k in seen]


# ----------------------------------------------------------------------------------------------------
# The CSV's track columns: what the page shows of a row beyond its cells
# ----------------------------------------------------------------------------------------------------

# after every other column of leaderboard.csv; ``paired_ci95``: the exact McNemar-consistent 95% interval of a
# paired difference over the same (seed, task) episodes (a normal one where outcomes are not 0/1), the page's
TRACK_CSV_COLUMNS = ("track", "rank_group", *(f"vs_{ref}_{part}" for ref in ("warm_start", "opd")
                                              for part in ("paired_diff", "paired_ci95_low", "paired_ci95_high",
                                                           "paired_n")))


def track_csv_cells(rows: list[Row]) -> dict[int, list[Any]]:
    """Per row (by ``id``), the ``TRACK_CSV_COLUMNS`` cells: its track's title; its method's rank group on the
    row of the split the track ranks by (other splits' rows are not ranked: empty); and its paired difference
    from the track's warm start and OPD rows on the row's own split (the page's numbers on the ranking split),
    '' where there is nothing to pair. A zero-shot track ranks nothing: no rank group."""
    from evaluation.leaderboard_ranks import REFERENCES, paired, rank_groups, reference_method

    cells: dict[int, list[Any]] = {}
    for table in family_tables(rows):
        title = table.track.title if table.track else table.family
        groups = [""] * len(table.methods) if is_zero_shot(table) else rank_groups(table)
        for group, method in zip(groups, table.methods):
            refs = {name: reference_method(table, name, method.budget[0]) for name in REFERENCES}
            for env_id, row in method.by_env.items():
                out: list[Any] = [title, group if env_id == table.ranking_env else ""]
                for name in REFERENCES:
                    ref = refs[name]
                    diff = None if ref is None or ref is method else paired(row, ref.by_env.get(env_id))
                    out += ["", "", "", ""] if diff is None else [round(diff.mean, 6), round(diff.low, 6),
                                                                  round(diff.high, 6), diff.n]
                cells[id(row)] = out
    return cells
