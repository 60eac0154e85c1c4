"""`ExperienceBank`: add successful episodes, retrieve the top-J most similar for a new task.

The bank is a folder with `bank.sqlite` (the truth: rows, their texts and their embeddings) and
`index.faiss` with its checksum `index.faiss.sha256` (a cache). Adds commit to SQLite first, then update the
in-memory index; the index file is saved on `flush()` / `close()`. Opening a bank removes the temporary
files of killed writers and rebuilds the index from the store, with a warning in the log saying why, when
the saved one cannot be trusted: missing, damaged (it does not match its checksum: a flipped byte, a
truncated file), or not holding the store's rows (a crash between a commit and the index save). A row
whose stored embedding is itself damaged is embedded again from its text. So nothing committed is ever
missing from retrieval or retrieved by a corrupted vector.

Several processes may share one bank folder (e.g. rollout workers adding while a trainer retrieves):
SQLite serialises their commits; each process keeps its own in-memory index and, before it retrieves or
saves, brings it up to date with rows other processes committed or deleted (`sync`, cheap when nobody
else wrote: one `PRAGMA data_version`). Saving the index file takes a file lock and a unique temporary
file (`index.py`), so concurrent saves never collide; the last one holds every row committed before it.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from agentgym_opd.embedding import Embedder, SentenceEmbedder
from agentgym_opd.types import Episode, Task
from experience_bank.index import UnusableIndex, VectorIndex
from experience_bank.records import Experience, trace_from_episode
from experience_bank.store import ExperienceStore, StoreError

logger = logging.getLogger(__name__)


class ExperienceBank:
    def __init__(self, path: str | Path, embedder: Embedder | None = None):
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        self.embedder = embedder if embedder is not None else SentenceEmbedder()
        self.store = ExperienceStore(self.path / "bank.sqlite", embedder_name=self.embedder.name, dim=self.embedder.dim)
        self.index_path = self.path / "index.faiss"
        self._seen_version = self.store.data_version()
        problem = self._open_index()
        self.rebuilt_on_open = problem is not None
        if problem is not None:
            if self.store.count():  # a new bank has nothing to rebuild: no warning
                logger.warning("experience bank %s: %s; rebuilt the index from the %d rows of %s (nothing is lost)",
                               self.path, problem, self.store.count(), self.store.path.name)
            self.rebuild_index()

    def _open_index(self) -> str | None:
        """Load the saved index into ``self.index``; None when it is usable, else why it is not."""
        try:
            index = VectorIndex.load(self.index_path, self.embedder.dim)
        except UnusableIndex as err:
            return str(err)
        if not np.array_equal(index.ids(), self.store.ids()):
            return f"{self.index_path} does not hold the store's rows (a crash between a commit and the index save)"
        self.index = index
        return None

    # ------------------------------------------------------------------ writing
    def add(self, item: Episode | Experience) -> int:
        return self.add_many([item])[0]

    def add_many(self, items: Iterable[Episode | Experience]) -> list[int]:
        """Add in one transaction (all or nothing); duplicates are not stored again and return the existing id."""
        experiences = [self._as_experience(x) for x in items]
        vectors = self.embedder.embed([e.instruction for e in experiences])
        ids, new_ids, new_rows = [], [], []
        with self.store.transaction() as conn:
            for row, (exp, vec) in enumerate(zip(experiences, vectors)):
                exp_id, inserted = self.store.insert(conn, exp, vec)
                ids.append(exp_id)
                if inserted:
                    new_ids.append(exp_id)
                    new_rows.append(row)
        self.index.add(np.array(new_ids, dtype=np.int64), vectors[new_rows])
        return ids

    def delete(self, exp_id: int) -> None:
        self.store.delete(exp_id)
        self.index.remove([exp_id])

    def rebuild_index(self) -> None:
        """A new index from the store's rows, saved."""
        self._seen_version = self.store.data_version()
        self.index = VectorIndex(self.embedder.dim)
        self.index.add(*self._stored_vectors())
        self._save()

    def _stored_vectors(self, ids: list[int] | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(ids, vectors) of the store's rows (all, or ``ids``); a row whose stored vector is damaged is
        embedded again from its text, written back to the store, and logged, so it is never left out."""
        found, vectors, damaged = self.store.embeddings(ids)
        if not damaged:
            return found, vectors
        texts = self.store.instructions(damaged)
        fixed_ids = [i for i in damaged if i in texts]  # a row deleted meanwhile needs nothing
        fresh = self.embedder.embed([texts[i] for i in fixed_ids])
        self.store.set_embeddings(fixed_ids, fresh)
        logger.warning("experience bank %s: %d stored embedding(s) were damaged (ids %s); embedded their texts again",
                       self.path, len(fixed_ids), fixed_ids[:10])
        return (np.concatenate([found, np.array(fixed_ids, dtype=np.int64)]),
                np.vstack([vectors, np.asarray(fresh, dtype=np.float32).reshape(-1, self.embedder.dim)]))

    def sync(self) -> bool:
        """Bring the in-memory index up to date with rows other processes committed or deleted since this
        process last looked; returns whether anything changed."""
        version = self.store.data_version()
        if version == self._seen_version:
            return False
        self._seen_version = version
        stored, indexed = self.store.ids(), self.index.ids()
        gone = np.setdiff1d(indexed, stored)
        new = np.setdiff1d(stored, indexed)
        if len(gone):
            self.index.remove(gone.tolist())
        if len(new):
            self.index.add(*self._stored_vectors(new.tolist()))
        return bool(len(gone) or len(new))

    def flush(self) -> None:
        self.sync()
        self._save()

    def _save(self) -> None:
        self.index.save(self.index_path)  # under the index lock, with its checksum (`VectorIndex.save`)

    # ------------------------------------------------------------------ reading
    def retrieve(self, query: str | Task, k: int = 3, *, env_id: str | None = None) -> list[Experience]:
        """The k stored experiences whose task is most similar to `query` (best first), optionally of one env."""
        text = query.instruction if isinstance(query, Task) else query
        if not isinstance(text, str) or not text.strip():
            raise ValueError("retrieve needs a non-empty task instruction or Task")
        self.sync()
        allowed = self.store.ids(env_id) if env_id is not None else None
        if allowed is not None and len(allowed) == 0:
            return []
        scores, ids = self.index.search(self.embedder.embed([text]), k, allowed)
        similarity = {int(i): float(s) for i, s in zip(ids[0], scores[0]) if i >= 0}
        found = self.store.get(list(similarity))
        for exp in found:
            exp.metadata = {**exp.metadata, "similarity": similarity[exp.id]}
        return found

    def get(self, exp_id: int) -> Experience:
        found = self.store.get([exp_id])
        if not found:
            raise KeyError(f"no experience with id {exp_id} in {self.store.path}")
        return found[0]

    def count(self, env_id: str | None = None) -> int:
        return self.store.count(env_id)

    def export(self) -> list[dict]:
        return self.store.export()

    # ------------------------------------------------------------------ lifecycle
    def close(self) -> None:
        self.flush()
        self.store.close()

    def __enter__(self) -> "ExperienceBank":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @staticmethod
    def _as_experience(item: Episode | Experience) -> Experience:
        if isinstance(item, Episode):
            return trace_from_episode(item)
        if isinstance(item, Experience):
            return item
        raise StoreError(f"the bank stores Episodes or Experiences, got {type(item).__name__}")


__all__ = ["ExperienceBank", "Experience", "StoreError", "trace_from_episode"]


def texts_of(experiences: Sequence[Experience]) -> list[str]:
    """Plain-text context of retrieved experiences, for text-context methods."""
    return [e.as_text() for e in experiences]
