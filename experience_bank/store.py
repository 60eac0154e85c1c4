"""SQLite storage of experiences and their embeddings: the single source of truth of the bank.

Why SQLite: transactions make a batch of adds all-or-nothing, WAL mode with `synchronous=FULL` makes a
commit durable before `add` returns, and a reader never sees a half-written batch. Several processes may
write one store: each write takes SQLite's write lock (`BEGIN IMMEDIATE`, waiting up to `BUSY_TIMEOUT_S`),
and `data_version` tells a process cheaply whether another one committed since it last looked. The embeddings live
here too (float32 blobs), so the faiss index is a cache that can always be rebuilt from this file alone.
"""

from __future__ import annotations

import json
import sqlite3
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np

from experience_bank.records import Experience

SCHEMA_VERSION = 1
BUSY_TIMEOUT_S = 120.0  # how long a writer waits for another process's write lock

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS experiences (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    env_id TEXT NOT NULL,
    task_id TEXT NOT NULL,
    instruction TEXT NOT NULL,
    trace TEXT NOT NULL,
    score REAL NOT NULL,
    trace_hash TEXT NOT NULL,
    created REAL NOT NULL,
    metadata TEXT NOT NULL,
    embedding BLOB NOT NULL,
    UNIQUE (env_id, trace_hash)
);
CREATE INDEX IF NOT EXISTS experiences_env ON experiences (env_id);
"""


class StoreError(ValueError):
    pass


def _validate(exp: Experience) -> None:
    problems = []
    for name in ("env_id", "task_id", "instruction"):
        if not isinstance(getattr(exp, name), str) or not getattr(exp, name):
            problems.append(f"{name} must be a non-empty string, got {getattr(exp, name)!r}")
    if not isinstance(exp.trace, (list, tuple)) or not all(
        isinstance(step, (list, tuple)) and len(step) == 2 and all(isinstance(x, str) for x in step) for step in exp.trace
    ):
        problems.append("trace must be a list of (action, observation) string pairs")
    try:
        float(exp.score)
    except (TypeError, ValueError):
        problems.append(f"score must be a number, got {exp.score!r}")
    try:
        json.dumps(exp.metadata)
    except (TypeError, ValueError) as err:
        problems.append(f"metadata must be JSON-serialisable ({err})")
    if problems:
        raise StoreError("invalid experience record: " + "; ".join(problems))


class ExperienceStore:
    def __init__(self, path: str | Path, *, embedder_name: str, dim: int):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.conn = sqlite3.connect(str(self.path), isolation_level=None, check_same_thread=False,
                                    timeout=BUSY_TIMEOUT_S)
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.execute("PRAGMA synchronous=FULL")
        with self.transaction() as conn:  # one process creates the schema; the others wait, then see it
            for statement in filter(str.strip, _SCHEMA.split(";")):
                conn.execute(statement)
        self.dim = dim
        self._check_meta(embedder_name, dim)

    def _check_meta(self, embedder_name: str, dim: int) -> None:
        with self.transaction() as conn:  # read-and-create as one step: two new writers agree on one meta
            meta = dict(conn.execute("SELECT key, value FROM meta").fetchall())
            if not meta:
                conn.executemany(
                    "INSERT INTO meta VALUES (?, ?)",
                    [("schema_version", str(SCHEMA_VERSION)), ("embedder", embedder_name), ("dim", str(dim))],
                )
                return
        if int(meta["dim"]) != dim or meta["embedder"] != embedder_name:
            raise StoreError(
                f"{self.path} holds {meta['dim']}-dim embeddings from {meta['embedder']!r}, but this bank was opened "
                f"with {embedder_name!r} ({dim} dims). Open it with the same embedder, or use a new path "
                "(the stored rows are untouched)."
            )

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """BEGIN IMMEDIATE ... COMMIT; any exception (or a killed process) leaves nothing of the batch behind."""
        self.conn.execute("BEGIN IMMEDIATE")
        try:
            yield self.conn
        except BaseException:
            self.conn.execute("ROLLBACK")
            raise
        self.conn.execute("COMMIT")

    def insert(self, conn: sqlite3.Connection, exp: Experience, vector: np.ndarray) -> tuple[int, bool]:
        """Insert inside an open transaction; returns (id, inserted). A duplicate returns the existing id."""
        _validate(exp)
        vector = np.asarray(vector, dtype=np.float32).reshape(-1)
        if vector.shape[0] != self.dim:
            raise StoreError(f"embedding has {vector.shape[0]} dims; this store holds {self.dim}-dim embeddings")
        digest = exp.trace_hash()
        row = conn.execute("SELECT id FROM experiences WHERE env_id = ? AND trace_hash = ?", (exp.env_id, digest)).fetchone()
        if row is not None:
            return int(row[0]), False
        cur = conn.execute(
            "INSERT INTO experiences (env_id, task_id, instruction, trace, score, trace_hash, created, metadata, embedding)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (exp.env_id, exp.task_id, exp.instruction, json.dumps([list(s) for s in exp.trace]), float(exp.score),
             digest, exp.created or time.time(), json.dumps(exp.metadata), vector.tobytes()),
        )
        return int(cur.lastrowid), True

    def get(self, ids: Iterable[int]) -> list[Experience]:
        ids = [int(i) for i in ids]
        if not ids:
            return []
        marks = ",".join("?" * len(ids))
        rows = self.conn.execute(
            f"SELECT id, env_id, task_id, instruction, trace, score, created, metadata FROM experiences WHERE id IN ({marks})", ids
        ).fetchall()
        by_id = {}
        for rid, env_id, task_id, instruction, trace, score, created, metadata in rows:
            by_id[rid] = Experience(env_id, task_id, instruction, [tuple(s) for s in json.loads(trace)], score,
                                    json.loads(metadata), id=rid, created=created)
        return [by_id[i] for i in ids if i in by_id]

    def delete(self, exp_id: int) -> None:
        with self.transaction() as conn:
            if conn.execute("DELETE FROM experiences WHERE id = ?", (int(exp_id),)).rowcount == 0:
                raise KeyError(f"no experience with id {exp_id} in {self.path}")

    def count(self, env_id: str | None = None) -> int:
        if env_id is None:
            return int(self.conn.execute("SELECT COUNT(*) FROM experiences").fetchone()[0])
        return int(self.conn.execute("SELECT COUNT(*) FROM experiences WHERE env_id = ?", (env_id,)).fetchone()[0])

    def ids(self, env_id: str | None = None) -> np.ndarray:
        sql, args = "SELECT id FROM experiences", ()
        if env_id is not None:
            sql, args = sql + " WHERE env_id = ?", (env_id,)
        return np.array([r[0] for r in self.conn.execute(sql + " ORDER BY id", args)], dtype=np.int64)

    def data_version(self) -> int:
        """SQLite's counter of commits by *other* connections: unchanged means nobody else wrote."""
        return int(self.conn.execute("PRAGMA data_version").fetchone()[0])

    def embeddings(self, ids: Iterable[int] | None = None) -> tuple[np.ndarray, np.ndarray, list[int]]:
        """(ids, vectors, damaged) of every row, or of the given ids, for (re)building the index. A stored
        vector that is not ``dim`` finite float32 values is left out of ids and vectors and its row id listed in
        ``damaged``: the caller embeds that row's text again (`set_embeddings`), so no row goes missing."""
        if ids is None:
            rows = self.conn.execute("SELECT id, embedding FROM experiences ORDER BY id")
        else:
            wanted = [int(i) for i in ids]
            rows = [r for start in range(0, len(wanted), 500) for r in self.conn.execute(
                f"SELECT id, embedding FROM experiences WHERE id IN ({','.join('?' * len(wanted[start:start + 500]))}) "
                "ORDER BY id", wanted[start:start + 500])]
        ids, vecs, damaged = [], [], []
        for rid, blob in rows:
            vector = np.frombuffer(blob, dtype=np.float32) if isinstance(blob, bytes) and len(blob) == 4 * self.dim else None
            if vector is None or not np.isfinite(vector).all():
                damaged.append(int(rid))
                continue
            ids.append(rid)
            vecs.append(vector)
        if not ids:
            return np.zeros(0, dtype=np.int64), np.zeros((0, self.dim), dtype=np.float32), damaged
        return np.array(ids, dtype=np.int64), np.vstack(vecs), damaged

    def set_embeddings(self, ids: Iterable[int], vectors: np.ndarray) -> None:
        """Replace the stored vectors of existing rows (a damaged one embedded again), in one transaction."""
        vectors = np.asarray(vectors, dtype=np.float32).reshape(-1, self.dim)
        with self.transaction() as conn:
            conn.executemany("UPDATE experiences SET embedding = ? WHERE id = ?",
                             [(v.tobytes(), int(i)) for i, v in zip(ids, vectors)])

    def instructions(self, ids: Iterable[int]) -> dict[int, str]:
        """The task instruction (the embedded text) of each given row that exists."""
        return {e.id: e.instruction for e in self.get(ids) if e.id is not None}

    def export(self) -> list[dict]:
        return [vars(e) for e in self.get(self.ids().tolist())]

    def close(self) -> None:
        self.conn.close()
