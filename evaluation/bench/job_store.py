"""Finished jobs of a bench kept on disk, so a killed bench resumes without redoing them (``--resume``; tracks).

A real-LM track takes hours: each job's outcome (records, per-task outcomes, curve point, messages, wall time,
error) is written to ``<out>/jobs/<job>.json`` the moment the job ends, beside a key: a hash of the job and of
everything its result depends on (the bench's settings, less what only changes how it runs, such as progress
bars and the worker count, and less which other jobs it runs; the student it starts from, the teacher it trains
with). A rerun reads back every outcome whose key matches and runs only the rest, so ``--algos`` can add a method
to a finished bench's folder; a changed setting changes the key, so a stale outcome is never reused.
Failed jobs are not kept: a rerun tries them again. Writes go through a temporary file and a rename, so a kill
mid-write leaves the previous state, never half a file.

Inside a job, its parts are kept too (a SmolLM2 job trains for half an hour and evaluates for as long): each
split's evaluation (its records and per-task outcomes) under ``<out>/jobs/parts/``, by the job's key, as it ends;
a trained run checkpoints every step into its run folder, which is marked with the job's key, and a rerun
continues from the newest checkpoint (`jobs.train_and_evaluate`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from pathlib import Path
from typing import Any

# settings that change how a bench runs, not what a job computes
RUN_ONLY_SETTINGS = ("progress", "jobs", "publish", "resume", "output_dir")
# settings that choose which jobs a bench runs: a job's key carries only its own share of them (its algorithm's
# overrides; the teacher where the job uses one), so adding a method to a finished bench's folder (``--algos``)
# reuses every job it already holds
PLAN_SETTINGS = ("algos", "references", "algo_overrides", "teacher")


def job_file_stem(job: Any) -> str:
    """The file name (without .json) a job's outcome is kept under: its kind, name and seed."""
    seed = getattr(job, "seed", None)
    name = f"{type(job).__name__}-{job.name}" + (f"-seed{seed}" if seed is not None else "")
    return name.replace("/", "_").replace("+", "_plus_")


def outcome_pairs(rows: list[list[Any]]) -> dict[tuple[int, str], float]:
    """Per-task outcomes as kept on disk (``[[seed, task, success], ...]``: JSON has no tuple keys) back to
    ``{(seed, task): success}``."""
    return {(int(seed), str(task)): float(value) for seed, task, value in rows}


def part_path(folder: Path, job: Any, part: str) -> Path:
    """Where a part of a running job (a split's evaluation) is kept: also read by the bench's progress bar."""
    return Path(folder) / "parts" / f"{job_file_stem(job)}__{part.replace('/', '_')}.json"


def eval_progress_path(folder: Path, job: Any, part: str) -> Path:
    """Where a running split's evaluation writes ``done/total`` games as each ends (the bench's progress bar reads it;
    an hour-long split would otherwise count as nothing until its part is kept)."""
    return part_path(folder, job, part).with_suffix(".progress")


def read_eval_progress(folder: Path, job: Any, part: str) -> tuple[int, int] | None:
    """(games ended, games) of a split being played, from its progress file; None when there is none or it was
    caught mid-write."""
    try:
        done, total = eval_progress_path(folder, job, part).read_text(encoding="utf-8").split("/")
        return int(done), int(total)
    except (OSError, ValueError):
        return None


class JobStore:
    """Outcomes of finished jobs under ``<out>/jobs``, keyed by what they depend on."""

    def __init__(self, folder: Path, context: Any):
        self.folder = Path(folder)
        settings = {k: v for k, v in dataclasses.asdict(context.settings).items()
                    if k not in RUN_ONLY_SETTINGS + PLAN_SETTINGS}
        self.shared = {"settings": settings, "env_ids": list(context.env_ids), "student": context.student_path,
                       "student_label": context.labels.get("student")}
        self.teacher = {"teacher": context.teacher_path, "teacher_label": context.labels.get("teacher")}
        self.algo_overrides = dict(context.settings.algo_overrides)

    def key(self, job: Any) -> str:
        """A hash of the job and of what its result depends on: the shared settings, the student it starts from,
        its own algorithm's overrides, and the teacher only where it trains with one (a reference row's model is
        one of its fields)."""
        payload = {**self.shared, "job": type(job).__name__, "fields": dataclasses.asdict(job),
                   "algo_overrides": list(self.algo_overrides.get(job.name, []))}
        if getattr(job, "needs_teacher", False):
            payload.update(self.teacher)
        return hashlib.sha1(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()

    def path(self, job: Any) -> Path:
        return self.folder / (job_file_stem(job) + ".json")

    def load(self, job: Any) -> Any | None:
        """The stored outcome of ``job`` if one with the same key exists, else None."""
        from evaluation.bench.jobs import JobOutcome

        try:
            data = json.loads(self.path(job).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        if data.get("key") != self.key(job):
            return None
        fields = data["outcome"]
        fields["outcomes"] = {env: outcome_pairs(rows) for env, rows in fields["outcomes"].items()}
        return JobOutcome(**fields)

    def part_path(self, job: Any, part: str) -> Path:
        return part_path(self.folder, job, part)

    def load_part(self, job: Any, part: str) -> dict[str, Any] | None:
        """A part of ``job`` (a split's evaluation: ``{"records", "outcomes"}``) kept by an earlier run with the
        same key, else None. Outcomes come back as {(seed, task): success}."""
        try:
            data = json.loads(self.part_path(job, part).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        if data.get("key") != self.key(job):
            return None
        value = data["value"]
        if "outcomes" in value:
            value["outcomes"] = outcome_pairs(value["outcomes"])
        return value

    def save_part(self, job: Any, part: str, value: dict[str, Any]) -> None:
        """Keep a finished part of a job that is still running (written like `save`: whole or not at all)."""
        value = dict(value)
        if "outcomes" in value:
            value["outcomes"] = [[seed, task, v] for (seed, task), v in value["outcomes"].items()]
        self._write(self.part_path(job, part), {"key": self.key(job), "value": value})

    def _write(self, target: Path, data: dict[str, Any]) -> None:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(target.name + f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(data) + "\n", encoding="utf-8")
        os.replace(tmp, target)

    def save(self, job: Any, outcome: Any) -> None:
        """Keep a finished job's outcome (a failed one is not kept: a rerun tries it again)."""
        if outcome.error is not None:
            return
        fields = dataclasses.asdict(outcome)
        fields["outcomes"] = {env: [[seed, task, value] for (seed, task), value in rows.items()]
                              for env, rows in outcome.outcomes.items()}
        self._write(self.path(job), {"key": self.key(job), "outcome": fields})
