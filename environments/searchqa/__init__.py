"""SearchQA (Search-R1 style): multi-turn search-then-answer over a passage corpus.

Ids: `searchqa/hotpotqa` (HotpotQA train split, the default `split="train"`), `searchqa/hotpotqa_dev`
(the dev split), both over the split's own context paragraphs with BM25 by default
(`retriever="dense"` for faiss + MiniLM); `searchqa/qa` for any `datasets` QA set with `qa_path=`,
`answer_field=` and `corpus_path=` (JSONL id/title/text). Import-light: nothing heavy is imported here.
"""

from __future__ import annotations


def register_envs() -> None:
    from agentgym_opd.registry import register

    entry = "environments.searchqa.env:SearchQAEnv"
    register("searchqa/hotpotqa", entry_point=entry, description="HotpotQA (train split) with a search tool, EM/F1 scored",
             dataset="hotpotqa", split="train", action_parser="tags")
    register("searchqa/hotpotqa_dev", entry_point=entry, description="HotpotQA (dev split) with a search tool, EM/F1 scored",
             dataset="hotpotqa", split="dev", action_parser="tags")
    register("searchqa/qa", entry_point=entry,
             description="any datasets QA set (qa_path=, answer_field=) over a JSONL passage corpus (corpus_path=)",
             dataset="hf", split="train", action_parser="tags")
