"""The faiss index over experience embeddings: a rebuildable cache of the store, written atomically, checked on load.

Inner product over L2-normalised vectors (cosine), exact (`IndexFlatIP`) behind an `IndexIDMap2` so the
faiss ids are the store's row ids.

Writing: under an exclusive lock on `<index>.lock` (`index_lock`), the index is written in full to a
temporary file of its own (a unique `<index>.<random>.tmp` per write) and moved over the index with
`os.replace`, then its sha256 goes the same way into `<index>.sha256`. A crash mid-write leaves the previous
files, plus at most the writer's temporary file.

Loading: under the same lock, every `<index>.*.tmp` is removed first. A temporary file exists only while
its writer holds the lock (it is created and swapped in or removed inside it, and the kernel drops a killed
process's lock), so any one seen while holding the lock is the leftover of a killed writer, never a live
writer's. Then the index bytes are read and compared with the checksum before faiss parses them: a flipped
byte, a truncated file, a missing or stale checksum (a crash between the two swaps) all make the file
unusable (`UnusableIndex`, saying why), and the bank rebuilds it from the store. The bank also compares
the loaded index's ids with the store's (a crash between a commit and the index save).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import faiss
import numpy as np


class UnusableIndex(ValueError):
    """The saved index cannot be trusted; the message says why. The bank rebuilds it from the store."""


def checksum_path(path: Path) -> Path:
    return path.with_name(path.name + ".sha256")


def temporary_files(path: Path) -> list[Path]:
    """The temporary files writers of ``path`` (and of its checksum) create: ``<index>.<random>.tmp``."""
    return sorted(path.parent.glob(path.name + ".*.tmp"))


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
        """Swap in the index file and then its checksum, each written to a temporary file first, under
        `index_lock` (taken here: a process must not hold it already)."""
        data = faiss.serialize_index(self.index).tobytes()
        with index_lock(path):
            _replace_atomically(path, data)
            _replace_atomically(checksum_path(path), hashlib.sha256(data).hexdigest().encode() + b"\n")

    @classmethod
    def load(cls, path: Path, dim: int) -> "VectorIndex":
        """The saved index, after removing killed writers' temporary files; UnusableIndex (saying why) when
        the file is missing, does not match its checksum, cannot be parsed, or is of another width."""
        with index_lock(path):
            for stale in temporary_files(path):
                stale.unlink(missing_ok=True)
            try:
                data = path.read_bytes()
            except FileNotFoundError:
                raise UnusableIndex(f"{path} does not exist yet") from None
            try:
                recorded = checksum_path(path).read_text(encoding="ascii").strip()
            except (FileNotFoundError, UnicodeDecodeError):
                recorded = None
        if recorded is None:
            raise UnusableIndex(f"{path} has no readable checksum ({checksum_path(path).name}): it may be damaged, "
                                "or was written by a version that wrote none")
        if hashlib.sha256(data).hexdigest() != recorded:
            raise UnusableIndex(f"{path} does not match its checksum: damaged (flipped or lost bytes), or a crash "
                                "came between saving it and its checksum")
        try:
            loaded = faiss.deserialize_index(np.frombuffer(data, dtype=np.uint8))
        except RuntimeError as err:
            raise UnusableIndex(f"{path} cannot be read by faiss ({str(err).splitlines()[0][:200]})") from err
        if loaded.d != dim:
            raise UnusableIndex(f"{path} holds {loaded.d}-dim vectors, the bank's embedder makes {dim}")
        out = cls(dim)
        out.index = loaded if isinstance(loaded, faiss.IndexIDMap2) else faiss.downcast_index(loaded)
        if not isinstance(out.index, faiss.IndexIDMap2):
            raise UnusableIndex(f"{path} is a {type(out.index).__name__}, not the bank's IndexIDMap2")
        return out


def _replace_atomically(path: Path, data: bytes) -> None:
    """Write ``data`` to a unique temporary file beside ``path``, flush it to disk, then move it over ``path``;
    any failure removes the temporary file and leaves ``path`` as it was. Call under `index_lock`."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@contextmanager
def index_lock(path: Path) -> Iterator[None]:
    """An exclusive lock (flock on `<index>.lock`) held while a process writes or reads the index and its
    checksum: a reader never sees one swapped without the other, and a temporary file seen by a holder is
    never a live writer's. Not re-entrant: a process that holds it must not take it again."""
    with open(path.with_name(path.name + ".lock"), "a") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)
