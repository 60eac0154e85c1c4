"""QA sets for SearchQA: HotpotQA from the data root, or any Hugging Face `datasets` QA set.

Every loader returns `QAExample`s plus the passage corpus to search. HotpotQA (the project's data root,
`hotpotqa/<split>.jsonl` in the HF `hotpot_qa` row format) brings its own supporting facts, so the
examples carry evidence sentences and the titles a gold walkthrough searches for. A generic set (NQ,
TriviaQA, ...) gives only question and answers; evidence is then empty and the walkthrough searches the
question itself.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from agentgym_opd.data import resolve_data_path
from environments.searchqa.corpus import Passage, load_passages_jsonl, passages_from_hotpotqa_rows

HOTPOTQA_SPLITS = ("train", "dev")
HOW_TO_GET_HOTPOTQA = (
    "export it with `datasets`: load_dataset('hotpotqa/hotpot_qa', 'distractor', split='validation')"
    ".to_json('<root>/hotpotqa/dev.jsonl') (same for train), or use the searchqa/qa env with qa_path= and corpus_path="
)


@dataclass(frozen=True)
class QAExample:
    id: str
    question: str
    answers: tuple[str, ...]
    supporting_titles: tuple[str, ...] = ()
    evidence: tuple[str, ...] = ()  # "Title: sentence" strings
    metadata: dict[str, Any] = field(default_factory=dict)


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    import json

    with path.open(encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def hotpotqa_example(row: dict[str, Any]) -> QAExample:
    """One HF-format HotpotQA row -> QAExample, evidence = the supporting sentences with their titles."""
    context = row.get("context") or {}
    by_title = dict(zip(context.get("title", []), context.get("sentences", [])))
    facts = row.get("supporting_facts") or {}
    titles, evidence = [], []
    for title, sent_id in zip(facts.get("title", []), facts.get("sent_id", [])):
        if title not in titles:
            titles.append(title)
        sentences = by_title.get(title, [])
        if 0 <= int(sent_id) < len(sentences):
            evidence.append(f"{title}: {sentences[int(sent_id)].strip()}")
    return QAExample(
        id=str(row["id"]),
        question=str(row["question"]),
        answers=(str(row["answer"]),),
        supporting_titles=tuple(titles),
        evidence=tuple(evidence),
        metadata={"type": row.get("type"), "level": row.get("level")},
    )


def load_hotpotqa(split: str = "train", *, data_root: str | os.PathLike | None = None,
                  limit: int | None = None) -> tuple[list[QAExample], list[Passage]]:
    """HotpotQA `split` from the data root; the corpus is that split's own context paragraphs.

    `limit` keeps the first N questions *and only their paragraphs*: a smaller self-contained benchmark
    (each question still has its eight distractors), cheap to embed.
    """
    if split not in HOTPOTQA_SPLITS:
        raise ValueError(f"HotpotQA split must be one of {HOTPOTQA_SPLITS}, got {split!r}")
    path = resolve_data_path(f"hotpotqa/{split}.jsonl", data_root=data_root, how_to_get=HOW_TO_GET_HOTPOTQA)
    rows = _read_jsonl(path)[:limit]
    return [hotpotqa_example(row) for row in rows], passages_from_hotpotqa_rows(rows)


def _field(row: dict[str, Any], dotted: str) -> Any:
    value: Any = row
    for part in dotted.split("."):
        if not isinstance(value, dict) or part not in value:
            raise KeyError(f"QA row has no field {dotted!r} (row keys: {sorted(row)})")
        value = value[part]
    return value


def _answers(value: Any) -> tuple[str, ...]:
    """Accept a string, a list of strings, or a dict holding them (TriviaQA `answer`, SQuAD `answers`)."""
    if isinstance(value, str):
        return (value,)
    if isinstance(value, dict):
        for key in ("aliases", "normalized_aliases", "text", "value"):
            if key in value and value[key]:
                return _answers(value[key])
        raise ValueError(f"cannot find answer strings in {sorted(value)}")
    if isinstance(value, Iterable):
        out = tuple(str(v) for v in value if str(v).strip())
        if out:
            return out
    raise ValueError(f"an answer field must hold a string or a list of strings, got {value!r}")


def load_hf_qa(
    qa_path: str,
    *,
    split: str = "train",
    corpus_path: str | os.PathLike | None = None,
    question_field: str = "question",
    answer_field: str = "answer",
    id_field: str | None = "id",
    config_name: str | None = None,
    limit: int | None = None,
) -> tuple[list[QAExample], list[Passage]]:
    """Any `datasets` QA set: a local JSON/JSONL/Parquet file, a `save_to_disk` folder, or a dataset name
    already in the local HF cache (a name only works online or when cached; nothing here forces a download).

    `answer_field` may be dotted ("answer.aliases"). The corpus is `corpus_path` (JSONL id/title/text);
    without it, rows in HotpotQA format supply their own context paragraphs.
    """
    import datasets

    path = Path(qa_path).expanduser()
    if path.is_file():
        builder = {".json": "json", ".jsonl": "json", ".parquet": "parquet", ".csv": "csv"}.get(path.suffix.lower())
        if builder is None:
            raise ValueError(f"unsupported QA file type {path.suffix!r} (use .json, .jsonl, .parquet or .csv)")
        data = datasets.load_dataset(builder, data_files=str(path), split="train")
    elif path.is_dir() and ((path / "dataset_info.json").exists() or (path / "dataset_dict.json").exists()):
        data = datasets.load_from_disk(str(path))
        if isinstance(data, datasets.DatasetDict):
            data = data[split]
    else:
        data = datasets.load_dataset(qa_path, config_name, split=split)
    if limit is not None:
        data = data.select(range(min(limit, len(data))))  # rows' own paragraphs follow the limit too
    rows = [dict(r) for r in data]
    examples = []
    for index, row in enumerate(rows):
        if "supporting_facts" in row and "context" in row and question_field == "question":
            example = hotpotqa_example(row)
            if answer_field != "answer":
                example = QAExample(example.id, example.question, _answers(_field(row, answer_field)),
                                    example.supporting_titles, example.evidence, example.metadata)
        else:
            qid = str(row[id_field]) if id_field and id_field in row else str(index)
            example = QAExample(qid, str(_field(row, question_field)), _answers(_field(row, answer_field)))
        examples.append(example)
    if corpus_path is not None:
        passages = load_passages_jsonl(corpus_path)
    elif rows and "context" in rows[0]:
        passages = passages_from_hotpotqa_rows(rows)
    else:
        raise ValueError(f"{qa_path}: pass corpus_path= (JSONL with id/title/text): the QA rows carry no passages")
    return examples, passages
