"""SearchQA: answer a question by searching a passage corpus, in the style of Search-R1.

Turn protocol (Search-R1's tags, and a plain-line form for models that do not use tags):

* `<search>query</search>` or a line `search: query` -> the top-k passages, numbered with their
  titles, wrapped in `<information>...</information>`, as the observation;
* `<answer>text</answer>` or a line `answer: text` -> the episode ends and is scored.

Reasoning around the tag (e.g. `<think>...</think>`) is allowed. Where a turn holds several actions the
first one to *close* counts, as Search-R1 cuts a generation at the first `</search>`/`</answer>`. A turn
with neither form, or an empty query/answer, is a `parse_error`; a search beyond `max_searches` is an
`invalid_action` (answer now). The turn limit (`max_turns`, default 5) truncates with feedback.

Scoring: `success` = exact match and `score` = token F1 (SQuAD normalisation, max over the accepted
answers); the reward on the answering turn is the exact match (Search-R1's outcome reward), or the F1 with
`reward="f1"`.

Data: `dataset="hotpotqa"` reads `hotpotqa/<split>.jsonl` (split "train" or "dev") from the data root
and searches the split's own paragraphs; `dataset="hf"` takes any `datasets` QA set (`qa_path`, the
answer field) plus a JSONL passage corpus (`corpus_path`). See `environments.searchqa.datasets`.
`limit=N` keeps the first N questions (for HotpotQA also only their own paragraphs).
"""

from __future__ import annotations

import re

from agentgym_opd.core import StepOutcome, TextEnv, UnknownTaskError
from agentgym_opd.types import StepError, Task
from environments.searchqa.datasets import QAExample, load_hf_qa, load_hotpotqa
from environments.searchqa.qa_metrics import max_exact_match, max_token_f1
from environments.searchqa.retrievers import Retriever, build_retriever

INSTRUCTION = (
    "Answer the given question. You can reason first. If you lack knowledge, call the search engine with "
    "<search> query </search>; it returns the top results between <information> and </information>. You "
    "can search as many times as you want (up to {max_searches} searches in {max_turns} turns). When you "
    "know the answer, give it without explanation as <answer> your answer </answer>, e.g. <answer> Beijing "
    "</answer>. One action per turn.\nQuestion: {question}"
)

_TAG = re.compile(r"<(search|answer)>(.*?)</\1>", re.IGNORECASE | re.DOTALL)
_LINE = re.compile(r"^[ \t]*(search|answer)[ \t]*:[ \t]*(.*)$", re.IGNORECASE | re.MULTILINE)
_OPEN_TAG = re.compile(r"<(search|answer)>", re.IGNORECASE)


def parse_action(text: str) -> tuple[str, str] | None:
    """(kind, argument) of the first action in `text`, kind in {"search", "answer"}; None if there is none.

    Tags win where they exist; plain `search:`/`answer:` lines are the fallback. The argument is stripped
    and may be empty (the env reports that).
    """
    tag = _TAG.search(text)
    if tag:
        return tag.group(1).lower(), tag.group(2).strip()
    opened = _OPEN_TAG.search(text)
    if opened:  # an unclosed tag, e.g. a generation stopped at the closing tag: take the rest of the turn
        return opened.group(1).lower(), text[opened.end():].strip()
    line = _LINE.search(text)
    if line:
        return line.group(1).lower(), line.group(2).strip()
    return None


def format_passages(hits) -> str:
    body = "\n".join(f"Doc {n} (Title: {p.title}) {p.text}" for n, (p, _) in enumerate(hits, 1))
    return f"<information>{body or 'No passage matched the query.'}</information>"


class SearchQAEnv(TextEnv):
    description = "question answering with a search tool over a passage corpus (Search-R1 style)"

    def __init__(
        self,
        split: str = "train",
        *,
        dataset: str = "hotpotqa",
        retriever: str | Retriever = "bm25",
        top_k: int = 3,
        max_turns: int = 5,
        max_searches: int | None = None,
        reward: str = "em",
        data_root: str | None = None,
        cache_dir: str | None = None,
        model_path: str | None = None,
        qa_path: str | None = None,
        corpus_path: str | None = None,
        question_field: str = "question",
        answer_field: str = "answer",
        id_field: str | None = "id",
        config_name: str | None = None,
        limit: int | None = None,
        max_action_chars: int = 4096,
        env_id: str | None = None,
        render_mode: str | None = None,
    ):
        super().__init__(split, max_turns=max_turns, max_action_chars=max_action_chars,
                         env_id=env_id or f"searchqa/{dataset}_{split}", render_mode=render_mode)
        if reward not in ("em", "f1"):
            raise ValueError(f"reward must be 'em' or 'f1', got {reward!r}")
        if top_k < 1:
            raise ValueError(f"top_k must be at least 1, got {top_k}")
        self.top_k, self.reward_kind = top_k, reward
        self.max_searches = max_turns - 1 if max_searches is None else max_searches
        if dataset == "hotpotqa":
            examples, passages = load_hotpotqa(split, data_root=data_root, limit=limit)
        elif dataset == "hf":
            if not qa_path:
                raise ValueError("dataset='hf' needs qa_path= (a local file/folder or a cached datasets name)")
            examples, passages = load_hf_qa(qa_path, split=split, corpus_path=corpus_path,
                                            question_field=question_field, answer_field=answer_field,
                                            id_field=id_field, config_name=config_name, limit=limit)
        else:
            raise ValueError(f"dataset must be 'hotpotqa' or 'hf', got {dataset!r}")
        self.examples: dict[str, QAExample] = {e.id: e for e in examples}
        self._ids = list(self.examples)
        self.passages = passages
        self.retriever = retriever if isinstance(retriever, Retriever) else build_retriever(
            retriever, passages, cache_dir=cache_dir, model_path=model_path)
        self._reset_episode_state()

    # ---------------------------------------------------------------- tasks
    def task_ids(self) -> list[str]:
        return list(self._ids)

    def get_task(self, task_id: str) -> Task:
        example = self.examples.get(task_id)
        if example is None:
            raise UnknownTaskError(task_id, self._ids)
        walkthrough = [f"<search> {t} </search>" for t in example.supporting_titles[: self.max_searches]]
        if not walkthrough and self.max_searches > 0:
            walkthrough = [f"<search> {example.question} </search>"]
        walkthrough = walkthrough[: self.max_turns - 1] + [f"<answer> {example.answers[0]} </answer>"]
        return Task(
            id=example.id,
            env_id=self.env_id,
            split=self.split,
            instruction=INSTRUCTION.format(question=example.question, max_searches=self.max_searches,
                                           max_turns=self.max_turns),
            privileged={"answer": list(example.answers), "evidence": list(example.evidence),
                        "walkthrough": walkthrough},
            metadata={"question": example.question, "supporting_titles": list(example.supporting_titles),
                      **{k: v for k, v in example.metadata.items() if v is not None}},
        )

    # ---------------------------------------------------------------- episode
    def _reset_episode_state(self) -> None:
        self.queries: list[str] = []
        self.retrieved_titles: set[str] = set()
        self.prediction: str | None = None
        self.em = self.f1 = 0.0

    def _start(self, task: Task) -> str:
        self._reset_episode_state()
        self.example = self.examples[task.id]
        return task.instruction

    def _act(self, action: str) -> StepOutcome:
        parsed = parse_action(action)
        if parsed is None:
            return self._error("parse_error", "No action found. Write <search> query </search> to search or "
                               "<answer> text </answer> to answer (one per turn).")
        kind, argument = parsed
        if kind == "search":
            return self._search(argument)
        if not argument:
            return self._error("parse_error", "The answer is empty. Put the answer itself between <answer> and </answer>.")
        self.prediction = argument
        self.em = max_exact_match(argument, self.example.answers)
        self.f1 = max_token_f1(argument, self.example.answers)
        reward = self.em if self.reward_kind == "em" else self.f1
        return StepOutcome(f"Your answer: {argument}", reward=reward, terminated=True,
                           feedback=self.episode_feedback())

    def _search(self, query: str) -> StepOutcome:
        if not query:
            return self._error("parse_error", "The search query is empty. Put words between <search> and </search>.")
        if len(self.queries) >= self.max_searches:
            return self._error("invalid_action", f"You have used all {self.max_searches} searches. "
                               "Answer now with <answer> text </answer>.")
        try:
            hits = self.retriever.search(query, self.top_k)
        except Exception as exc:  # a broken backend is the tool's failure, not the agent's
            return self._error("tool_error", f"The search engine failed ({type(exc).__name__}: {exc}). Try again.")
        self.queries.append(query)
        self.retrieved_titles.update(p.title for p, _ in hits)
        return StepOutcome(format_passages(hits))

    def _error(self, kind: str, message: str) -> StepOutcome:
        return StepOutcome(message, error=StepError(kind, message))

    def progress(self) -> tuple[bool, float]:
        return self.em == 1.0, self.f1

    def episode_feedback(self) -> str:
        """What went wrong, without giving the gold answer away (a feedback-conditioned teacher would copy it)."""
        example = self.example
        missed = [t for t in example.supporting_titles if t not in self.retrieved_titles]
        about = " and ".join(f"'{t}'" for t in example.supporting_titles)
        if self.prediction is not None and self.em == 1.0:
            return f"Correct answer after {len(self.queries)} searches."
        lines = []
        if self.prediction is None:
            lines.append(f"You gave no answer within {self.max_turns} turns; answer with <answer> text </answer> "
                         "before the turn limit.")
        elif self.f1 > 0:
            lines.append(f"The answer '{self.prediction}' did not match exactly (token F1 {self.f1:.2f}): it is "
                         "partly right; give just the answer span.")
        else:
            lines.append(f"The answer '{self.prediction}' did not match the accepted answer.")
        if about:
            lines.append(f"The supporting passages were about {about}.")
        if not self.queries:
            lines.append("You never searched.")
        elif missed:
            lines.append("Your searches never retrieved " + " or ".join(f"'{t}'" for t in missed)
                         + f" (queries: {'; '.join(self.queries)}).")
        if self.error_log:
            lines.append(f"{len(self.error_log)} of {self.turn} turns failed; the last error: {self.error_log[-1]}")
        return " ".join(lines)
