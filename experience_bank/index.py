"""The faiss index over experience embeddings: a rebuildable cache of the store, written atomically.

Inner product over L2-normalised vectors (cosine), exact (`IndexFlatIP`) behind an `IndexIDMap2` so the
faiss ids are the store's row ids. The file is written in full to a temporary file of its own (a unique
name per write, so several processes saving at once never share one) and moved over the index with
`os.replace`, under an exclusive lock on `<index>.lock`; a crash mid-write leaves the previous file.
On open the index is compared with the store's id set and rebuilt from the stored embeddings when they
differ (e.g. a crash between a commit and the index save).
"""

from __future__ import annotations

import fcntl
import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import faiss
import numpy as np


class VectorIndex:
    def __init__(self, dim: int):
        self.dim = dim
        self.index = faiss.IndexIDMap2(faiss.IndexFlatIP(dim))

    @property
    def size(self) -> int:
        return int(self.index.ntotal)

    def ids(self) -> np.ndarray:
        return np.sort(faiss.vector_to_array(self.index.id_map).astype(np.int64))

    def add(self, ids: np.ndarray, vectors: np.ndarray) -> None:
        if len(ids):
            self.index.add_with_ids(np.ascontiguousarray(vectors, dtype=np.float32), np.asarray(ids, dtype=np.int64))

    def remove(self, ids: list[int]) -> None:
        self.index.remove_ids(np.asarray(ids, dtype=np.int64))

    def search(self, query: np.ndarray, k: int, allowed_ids: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Top-k (scores, ids) for each query row; `allowed_ids` restricts the search (e.g. one env's rows)."""
        query = np.ascontiguousarray(query, dtype=np.float32).reshape(-1, self.dim)
        k = min(k, self.size)
        if k == 0:
            return np.zeros((len(query), 0), np.float32), np.zeros((len(query), 0), np.int64)
        params = None
        if allowed_ids is not None:
            params = faiss.SearchParameters(sel=faiss.IDSelectorBatch(np.asarray(allowed_ids, dtype=np.int64)))
        scores, ids = self.index.search(query, k, params=params)
        return scores, ids

    def save(self, path: Path) -> None:
        """Write to a unique temporary file beside `path`, then swap it in; call under `index_lock`."""
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
        try:
            os.close(fd)
            faiss.write_index(self.index, tmp)
            with open(tmp, "rb") as fh:
                os.fsync(fh.fileno())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    @classmethod
    def load(cls, path: Path, dim: int) -> "VectorIndex | None":
        """The saved index, or None when the file is missing, unreadable or of another width."""
        if not path.exists():
            return None
        try:
            loaded = faiss.read_index(str(path))
        except RuntimeError:
            return None
        if loaded.d != dim:
            return None
        out = cls(dim)
        out.index = faiss.downcast_index(loaded) if not isinstance(loaded, faiss.IndexIDMap2) else loaded
        if not isinstance(out.index, faiss.IndexIDMap2):
            return None
        return out


@contextmanager
def index_lock(path: Path) -> Iterator[None]:
    """An exclusive lock (flock on `<index>.lock`) held while a process swaps in a new index file, so the
    file another process is about to read or replace is never one being swapped."""
    with open(path.with_name(path.name + ".lock"), "a") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)
