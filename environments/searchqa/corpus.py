"""Passage corpora for retrieval: built from HotpotQA's own context paragraphs, or read from JSONL.

A passage is one Wikipedia paragraph with its title, the unit Search-R1 and DPR retrieve. HotpotQA's
distractor rows each carry ten paragraphs (two supporting, eight distractors); pooling a split's
paragraphs, deduplicated by title, gives a self-contained corpus whose distractors were chosen to be
confusable, so retrieval over it is a real test. A user's own corpus is a JSONL file with `id`,
`title`, `text` per line (the format of Search-R1's `wiki-18.jsonl` after splitting `contents`).
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence


@dataclass(frozen=True)
class Passage:
    id: str
    title: str
    text: str
    sentences: tuple[str, ...] = ()

    @property
    def contents(self) -> str:
        """What the retrievers index: the title helps both BM25 and the dense model."""
        return f"{self.title}\n{self.text}" if self.title else self.text


def passages_from_hotpotqa_rows(rows: Iterable[dict[str, Any]]) -> list[Passage]:
    """Pool the `context` paragraphs of HotpotQA rows, first occurrence of each title wins."""
    seen: dict[str, Passage] = {}
    for row in rows:
        context = row.get("context") or {}
        for title, sentences in zip(context.get("title", []), context.get("sentences", [])):
            if title in seen:
                continue
            sentences = tuple(str(s) for s in sentences)
            seen[title] = Passage(id=str(len(seen)), title=title, text="".join(sentences).strip(), sentences=sentences)
    return list(seen.values())


def load_passages_jsonl(path: str | os.PathLike) -> list[Passage]:
    """Read a passage file: one JSON object per line with `title` and `text` (or `contents`), `id` optional.

    `contents` is Search-R1's wiki-18 layout: a quoted title on the first line, the text after it.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"passage corpus {path} does not exist (expected JSONL with id/title/text per line)")
    passages: list[Passage] = []
    with path.open(encoding="utf-8") as handle:
        for line_no, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{line_no}: not a JSON object ({exc})") from exc
            if "text" in record:
                title, text = str(record.get("title", "")), str(record["text"])
            elif "contents" in record:
                head, _, rest = str(record["contents"]).partition("\n")
                title, text = head.strip().strip('"'), rest.strip()
            else:
                raise ValueError(f"{path}:{line_no}: a passage needs a 'text' (or 'contents') field")
            passages.append(Passage(id=str(record.get("id", len(passages))), title=title, text=text))
    if not passages:
        raise ValueError(f"passage corpus {path} is empty")
    return passages


def corpus_fingerprint(passages: Sequence[Passage]) -> str:
    """A hash of the indexed content, in order: the on-disk index cache is keyed by it."""
    digest = hashlib.sha256()
    for passage in passages:
        for part in (passage.id, passage.title, passage.text):
            digest.update(part.encode("utf-8", "surrogatepass"))
            digest.update(b"\x1f")
        digest.update(b"\x1e")
    return digest.hexdigest()
