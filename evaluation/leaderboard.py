"""The leaderboard: published result records in `leaderboard/records/`, rendered to Markdown, CSV and HTML.

`add` accepts a record only if it validates and is not already there (same content, or the same run:
env, split, algorithm, student, teacher and seed); it is written atomically, so a refused or interrupted
add leaves the folder as it was. `build` reads every record (a corrupt one stops the build, naming the
file, before anything is written), groups records of the same env split x algorithm x student x teacher
over seeds, and renders one table per env family with mean +- standard error and the best value per
column in bold.

Aggregating over seeds: with one record a cell shows that record's mean and its own standard error
(over episodes); with k >= 2 seed records it shows the mean of the seed means and the standard error of
that mean across seeds (std/sqrt(k)), the usual way to report seed-to-seed variation.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from evaluation.records import RecordError, env_family, lower_is_better, protocol_label, record_id, validate_record

IDENTITY_FIELDS = ("env_id", "split", "algorithm", "student", "teacher", "seed")


def identity(record: dict[str, Any]) -> tuple:
    """What makes two records the same run: the identity fields plus the evaluation protocol."""
    return (*(record[f] for f in IDENTITY_FIELDS), protocol_label(record))


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
    protocol_short: str = ""  # the same without the eval defaults, for tables

    @property
    def display_algorithm(self) -> str:
        return f"{self.algorithm} [{self.protocol_short}]" if self.protocol_short else self.algorithm


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


class Leaderboard:
    def __init__(self, root: str | Path = "leaderboard"):
        self.root = Path(root)
        self.records_dir = self.root / "records"

    # ---------------------------------------------------------------- records
    def load_records(self) -> list[dict[str, Any]]:
        records = []
        for path in sorted(self.records_dir.glob("*.json")) if self.records_dir.is_dir() else []:
            try:
                record = json.loads(path.read_text())
            except (json.JSONDecodeError, UnicodeDecodeError) as err:
                raise RecordError(f"{path} is not valid JSON ({err}); fix or remove it, then build again") from err
            try:
                records.append(validate_record(record))
            except RecordError as err:
                raise RecordError(f"{path}: {err}") from err
        return records

    def add(self, record: dict[str, Any] | str | Path) -> Path:
        if isinstance(record, (str, Path)):
            path = Path(record)
            try:
                record = json.loads(path.read_text())
            except (OSError, json.JSONDecodeError, UnicodeDecodeError) as err:
                raise RecordError(f"cannot read a JSON record from {path}: {err}") from err
        validate_record(record)
        rid = record_id(record)
        target = self.records_dir / f"{rid}.json"
        if target.exists():
            raise RecordError(f"duplicate record: identical content is already published as {target}")
        key = identity(record)
        for existing in self.load_records():
            if identity(existing) == key:
                raise RecordError(
                    "duplicate record: a result for the same run "
                    f"({', '.join(f'{f}={v!r}' for f, v in zip(IDENTITY_FIELDS, key))}) is already published; "
                    "use another seed or remove the old record first"
                )
        self.records_dir.mkdir(parents=True, exist_ok=True)
        _write_atomic(target, json.dumps(record, indent=2, sort_keys=True) + "\n")
        return target

    # ---------------------------------------------------------------- aggregation
    @staticmethod
    def rows(records: list[dict[str, Any]]) -> list[Row]:
        groups: dict[tuple, list[dict[str, Any]]] = {}
        for r in records:
            groups.setdefault((r["env_id"], r["split"], r["algorithm"], r["student"], r["teacher"], protocol_label(r)),
                              []).append(r)
        rows = []
        for (env_id, split, algo, student, teacher, protocol), recs in sorted(groups.items(), key=lambda kv: tuple(str(x) for x in kv[0])):
            row = Row(env_id, split, algo, student, teacher, sorted(r["seed"] for r in recs), sum(r["n_episodes"] for r in recs),
                      protocol=protocol, protocol_short=protocol_label(recs[0], short=True))
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
            rows.append(row)
        return rows

    @staticmethod
    def by_family(rows: list[Row]) -> dict[str, list[Row]]:
        out: dict[str, list[Row]] = {}
        for row in rows:
            out.setdefault(env_family(row.env_id), []).append(row)
        return out

    @staticmethod
    def best(rows: list[Row], metric: str) -> dict[str, float]:
        """Best value of `metric` per env split (rows compete only within the same env split)."""
        best: dict[str, float] = {}
        for row in rows:
            if metric in row.metrics:
                value = row.metrics[metric][0]
                key = f"{row.env_id}|{row.split}"
                if key not in best or (value < best[key] if lower_is_better(metric) else value > best[key]):
                    best[key] = value
        return best

    # ---------------------------------------------------------------- rendering
    def markdown(self, rows: list[Row]) -> str:
        lines = ["# Leaderboard", "", "Generated by `agentgym-opd leaderboard build` from `leaderboard/records/`. "
                 "Cells: mean +- standard error; bold: best in the env split "
                 "(lowest for mean_turns and error rates).", ""]
        for family, frows in self.by_family(rows).items():
            metrics = sorted({m for r in frows for m in r.metrics})
            best = {m: self.best(frows, m) for m in metrics}
            lines += [f"## {family}", ""]
            head = ["env", "algorithm", "student", "teacher", "seeds", "n"] + metrics
            lines.append("| " + " | ".join(head) + " |")
            lines.append("|" + "|".join("---" for _ in head) + "|")
            for r in frows:
                cells = [f"{r.env_id}", r.display_algorithm, r.student, r.teacher or "-", ",".join(map(str, r.seeds)), str(r.n_episodes)]
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
        writer = csv.writer(buf)
        writer.writerow(["env_family", "env_id", "split", "algorithm", "protocol", "student", "teacher", "seeds", "n_episodes"]
                        + [f"{m}{s}" for m in metrics for s in ("", "_stderr")])
        for r in rows:
            values = []
            for m in metrics:
                values += list(r.metrics[m]) if m in r.metrics else ["", ""]
            writer.writerow([env_family(r.env_id), r.env_id, r.split, r.algorithm, r.protocol, r.student, r.teacher or "",
                             " ".join(map(str, r.seeds)), r.n_episodes] + values)
        return buf.getvalue()

    def build(self) -> list[Path]:
        """Render LEADERBOARD.md, leaderboard.csv and index.html; nothing is written if any record is bad."""
        from evaluation.leaderboard_html import render_html

        rows = self.rows(self.load_records())
        outputs = {
            self.root / "LEADERBOARD.md": self.markdown(rows),
            self.root / "leaderboard.csv": self.csv(rows),
            self.root / "index.html": render_html(self, rows),
        }
        self.root.mkdir(parents=True, exist_ok=True)
        for path, text in outputs.items():
            _write_atomic(path, text)
        return list(outputs)
