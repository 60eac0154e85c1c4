"""SAGE-OPD's judge: the teacher labels each turn Skip, Weak or Strong (prompt, transcript, verdict parsing).

Kept apart from :mod:`algorithms.sage_opd` (the method: weights, confidence, loss) because it is prompt
engineering and text heuristics, not the paper's formula: how a turn is shown to the teacher, and how its
free-text answer is read. The rules:

- a turn whose env answer is an execution error of the agent (``AGENT_ERRORS``) is Strong without asking;
  faults of the environment (a crashed backend, a timeout) are not the agent's error, so those turns are
  judged like clean ones;
- every other turn is shown to the teacher (its own chat template, thinking off unless asked) with the
  first observation, up to ``judge_history_turns`` earlier turns and the turn itself, trimmed to
  ``judge_max_prompt_tokens``; all such turns of a batch go to one greedy ``generate`` call;
- :func:`parse_verdict` reads the answer after any ``</think>``; an unreadable one gets ``default_label``;
- ``algo.judge=teacher_scored`` asks the same question but reads no text: the label is the one whose first
  token the teacher finds likeliest as its answer's first token (its answer constrained to the three words,
  :func:`scored_labels`), so every asked turn gets a verdict, for a teacher too small to answer in words.
  Whether those verdicts separate turns is what ``judge_modal_label_share`` reports.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Sequence

import torch

from agentgym_opd.policy.base import SamplingParams
from agentgym_opd.policy.batching import PREFILL_TOKEN_BUDGET, length_buckets
from agentgym_opd.types import Episode

LABELS: tuple[str, ...] = ("skip", "weak", "strong")

AGENT_ERRORS = frozenset({"invalid_action", "parse_error", "tool_error", "runtime_error"})  # not env faults
NEGATIONS = frozenset({"not", "no", "never", "isnt", "nor", "without", "t"})  # "t": the tail of isn't, wasn't...

JUDGE_SYSTEM = ("You review one turn of an agent acting in a text environment and decide how much the agent "
                "should learn from it. Reply with exactly one word: Skip, Weak or Strong.")
JUDGE_QUESTION = ("How much should the agent learn from turn {k}?\n"
                  "Strong: a mistake, or a decisive step it must get right.\n"
                  "Weak: acceptable, but it could be better.\n"
                  "Skip: correct and routine, nothing to learn.\n"
                  "Answer with one word: Skip, Weak or Strong.")


# ----------------------------------------------------------------------------------------------------
# Verdicts: parsing the judge's answer, and the labels of a batch
# ----------------------------------------------------------------------------------------------------


def parse_verdict(text: str | None) -> str | None:
    """The first label the answer names (``"skip"``, ``"weak"``, ``"strong"``), or None if it names none.

    Only the text after the last ``</think>`` counts (a thinking teacher's reasoning is not its verdict; an
    unfinished ``<think>`` is no verdict). Robust to case, punctuation and markup ("**STRONG**.",
    "label: weak") and inflections ("strongly", "skipped"); a word right after a negation ("not strong")
    does not count. No synonyms: filler such as "Okay" or "fine" is not a verdict.
    """
    if not text:
        return None
    if "</think>" in text:
        text = text.rsplit("</think>", 1)[1]
    elif "<think>" in text:
        return None
    words = re.findall(r"[a-z]+", text.lower())
    for position, word in enumerate(words):
        if position > 0 and words[position - 1] in NEGATIONS:
            continue
        label = next((lab for lab in LABELS if word.startswith(lab)), None)
        if label is not None:
            return label
    return None


@dataclass
class TurnVerdicts:
    """Per row, per turn: the label, where it came from (``error`` / ``judge`` / ``default``) and the
    judge's raw answer (None where it was not asked)."""

    labels: list[list[str]]
    sources: list[list[str]]
    raw: list[list[str | None]]

    def counts(self) -> dict[str, float]:
        """The step's label statistics: label shares over turns, and how each label was decided."""
        flat = [label for row in self.labels for label in row]
        sources = [s for row in self.sources for s in row]
        n = max(len(flat), 1)
        asked = sum(1 for row in self.raw for answer in row if answer is not None)
        defaulted = sum(1 for row_raw, row_src in zip(self.raw, self.sources)
                        for answer, src in zip(row_raw, row_src) if answer is not None and src == "default")
        judged = [label for row, row_src in zip(self.labels, self.sources) for label, src in zip(row, row_src)
                  if src == "judge"]
        modal = max((judged.count(label) for label in LABELS), default=0) / len(judged) if judged else 0.0
        return {**{f"share_{label}": flat.count(label) / n for label in LABELS},
                "turns_judged": float(sources.count("judge")), "turns_error_forced": float(sources.count("error")),
                "turns_defaulted": float(sources.count("default")),
                "judge_defaulted_share": defaulted / asked if asked else 0.0,
                # a judge that gives every turn the same label separates no turns: errors-only weighting again
                "judge_modal_label_share": modal}


def transcript(episode: Episode, turn: int, history_turns: int) -> str:
    """The judge's view of turn ``turn``: the first observation, recent earlier turns, then the turn itself."""
    first = episode.initial_observation
    start = max(0, turn - history_turns)
    lines = [f"Task and first observation:\n{first}"]
    if start > 0:
        lines.append(f"({start} earlier turns omitted)")
    for k in range(start, turn + 1):
        step = episode.turns[k]
        lines.append(f"Turn {k + 1} action: {step.action.strip()}")
        lines.append(f"Environment: {step.observation.strip()}")
        if step.error is not None and step.error.message.strip() not in step.observation:
            lines.append(f"Error: {step.error}")
        if step.feedback and step.feedback.strip() != step.observation.strip():
            lines.append(f"Feedback: {step.feedback.strip()}")
    return "\n".join(lines)


def judge_template(teacher: Any, messages: list[dict[str, str]], thinking: bool) -> list[int]:
    """The teacher's chat-template ids for the judge, with the template's thinking mode set (Qwen3-style
    ``enable_thinking``; templates without it ignore the flag)."""
    tokenizer = getattr(teacher, "tokenizer", None)
    if tokenizer is not None and hasattr(teacher, "encode") and getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True,
                                             enable_thinking=thinking)
        return list(teacher.encode(text))
    return list(teacher.apply_chat_template(messages, add_generation_prompt=True))


def judge_prompt(teacher: Any, episode: Episode, turn: int, history_turns: int, max_tokens: int,
                 thinking: bool = False) -> list[int]:
    """Teacher chat-template ids asking for the verdict on ``turn``; history trimmed until it fits."""
    for shown in range(history_turns, -1, -1):
        body = transcript(episode, turn, shown) + "\n\n" + JUDGE_QUESTION.format(k=turn + 1)
        messages = [{"role": "system", "content": JUDGE_SYSTEM}, {"role": "user", "content": body}]
        ids = judge_template(teacher, messages, thinking)
        if len(ids) <= max_tokens:
            return ids
    # even the turn alone is too long: keep the template's end (question + assistant header) intact
    return ids[:1] + ids[len(ids) - max_tokens + 1:]


def agent_error(turn: Any) -> bool:
    """True when the turn's env answer is an execution error of the agent (an env fault is not)."""
    return turn.error is not None and turn.error.kind in AGENT_ERRORS


def error_first_verdicts(episodes: Sequence[Episode], default_label: str) -> TurnVerdicts:
    """Turns with an agent execution error are Strong; every other turn provisionally gets ``default_label``."""
    labels, sources, raw = [], [], []
    for episode in episodes:
        labels.append(["strong" if agent_error(t) else default_label for t in episode.turns])
        sources.append(["error" if agent_error(t) else "default" for t in episode.turns])
        raw.append([None] * len(episode.turns))
    return TurnVerdicts(labels, sources, raw)


# padded tokens per scoring forward: judge prompts go in buckets of similar length (`length_buckets`), so a
# short prompt is not padded to the longest of the batch
SCORED_TOKEN_BUDGET = PREFILL_TOKEN_BUDGET


def label_first_tokens(teacher: Any) -> list[int]:
    """The first token of each label as the judge's answer would start it ("Skip", "Weak", "Strong", the
    capitalised words the question asks for), in ``LABELS`` order; refused when two labels share it."""
    firsts = [teacher.encode(word.capitalize())[0] for word in LABELS]
    if len(set(firsts)) < len(LABELS):
        raise ValueError(f"algo.judge=teacher_scored: the teacher's tokenizer starts two labels with the same token "
                         f"({dict(zip(LABELS, firsts))}); use algo.judge=teacher")
    return firsts


def scored_labels(teacher: Any, prompts: Sequence[Sequence[int]]) -> list[tuple[str, str]]:
    """Per judge prompt: the label whose first token the teacher gives the highest probability as the first
    token of its answer, and a line stating the three log-probs (kept as the judge's raw answer)."""
    firsts = label_first_tokens(teacher)
    support = torch.tensor([firsts], dtype=torch.long)  # [1 position, 3 labels]
    out: list[tuple[str, str] | None] = [None] * len(prompts)
    for bucket in length_buckets([len(p) for p in prompts], SCORED_TOKEN_BUDGET):
        chunk = [prompts[i] for i in bucket]
        scores = teacher.score(chunk, [[firsts[0]]] * len(chunk), support_ids=[support] * len(chunk))
        for i, s in zip(bucket, scores):
            logprobs = [float(x) for x in s.top_logprobs[0]]
            best = max(range(len(LABELS)), key=lambda j: logprobs[j])
            out[i] = (LABELS[best], "scored " + " ".join(f"{lab}={lp:.2f}" for lab, lp in zip(LABELS, logprobs)))
    return out  # type: ignore[return-value]


def judge_turns(teacher: Any, episodes: Sequence[Episode], config: Any) -> TurnVerdicts:
    """Label every turn of ``episodes``: errors first, then one batched greedy judge call for the rest.

    ``config``: a :class:`algorithms.sage_opd.SAGEOPDConfig` (``judge``, ``default_label``, ``judge_*``)."""
    verdicts = error_first_verdicts(episodes, config.default_label)
    if config.judge == "errors_only":
        return verdicts
    asked = [(row, k) for row, episode in enumerate(episodes) for k, t in enumerate(episode.turns) if not agent_error(t)]
    if not asked:
        return verdicts
    prompts = [judge_prompt(teacher, episodes[row], k, config.judge_history_turns, config.judge_max_prompt_tokens,
                            config.judge_thinking) for row, k in asked]
    if config.judge == "teacher_scored":
        for (row, k), (label, raw) in zip(asked, scored_labels(teacher, prompts)):
            verdicts.labels[row][k], verdicts.sources[row][k], verdicts.raw[row][k] = label, "judge", raw
        return verdicts
    answers = teacher.generate(prompts, SamplingParams(max_new_tokens=config.judge_max_new_tokens, temperature=0.0))
    for (row, k), answer in zip(asked, answers):
        label = parse_verdict(answer.text)
        verdicts.raw[row][k] = answer.text
        if label is not None:
            verdicts.labels[row][k], verdicts.sources[row][k] = label, "judge"
    return verdicts
