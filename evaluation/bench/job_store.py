"""Finished jobs of a bench kept on disk, so a killed bench resumes without redoing them (``--resume``; tracks).

A real-LM track takes hours: each job's outcome (records, per-task outcomes, curve point, messages, wall time,
error) is written to ``<out>/jobs/<job>.json`` the moment the job ends, beside a key: a hash of the job and of
everything its result depends on (the bench's settings, less what only changes how it runs: progress bars,
worker count; the student and teacher it starts from). A rerun of the same bench reads back every outcome whose
key matches and runs only the rest; a changed setting changes the key, so a stale outcome is never reused.
Failed jobs are not kept: a rerun tries them again. Writes go through a temporary file and a rename, so a kill
mid-write leaves the previous state, never half a file.
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


class JobStore:
    """Outcomes of finished jobs under ``<out>/jobs``, keyed by what they depend on."""

    def __init__(self, folder: Path, context: Any):
        self.folder = Path(folder)
        settings = {k: v for k, v in dataclasses.asdict(context.settings).items() if k not in RUN_ONLY_SETTINGS}
        self.shared = {"settings": settings, "env_ids": list(context.env_ids), "student": context.student_path,
                       "teacher": context.teacher_path, "labels": context.labels}

    def key(self, job: Any) -> str:
        payload = {**self.shared, "job": type(job).__name__, "fields": dataclasses.asdict(job)}
        return hashlib.sha1(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()

    def path(self, job: Any) -> Path:
        seed = getattr(job, "seed", None)
        name = f"{type(job).__name__}-{job.name}" + (f"-seed{seed}" if seed is not None else "")
        return self.folder / (name.replace("/", "_").replace("+", "_plus_") + ".json")

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
        fields["outcomes"] = {env: {(int(seed), task): float(value) for seed, task, value in rows}
                              for env, rows in fields["outcomes"].items()}
        return JobOutcome(**fields)

    def save(self, job: Any, outcome: Any) -> None:
        """Keep a finished job's outcome (a failed one is not kept: a rerun tries it again)."""
        if outcome.error is not None:
            return
        fields = dataclasses.asdict(outcome)
        fields["outcomes"] = {env: [[seed, task, value] for (seed, task), value in rows.items()]
                              for env, rows in outcome.outcomes.items()}
        self.folder.mkdir(parents=True, exist_ok=True)
        target = self.path(job)
        tmp = target.with_name(target.name + f".tmp{os.getpid()}")
        tmp.write_text(json.dumps({"key": self.key(job), "outcome": fields}) + "\n", encoding="utf-8")
        os.replace(tmp, target)
