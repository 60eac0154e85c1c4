"""Answer normalisation, exact match and token F1, as in the SQuAD evaluation script.

Search-R1, HotpotQA and the NQ/TriviaQA open-domain papers all score with these two numbers, so
SearchQA reports them the same way: `success` is exact match, `score` is token F1, each the maximum
over the accepted gold answers (a question may have several aliases). Normalisation: lowercase,
drop punctuation, drop the articles a/an/the, collapse whitespace.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from typing import Iterable

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = set(string.punctuation)


def normalize_answer(text: str) -> str:
    """SQuAD normalisation: lowercase, strip punctuation and articles, collapse whitespace."""
    text = text.lower()
    text = "".join(ch for ch in text if ch not in _PUNCTUATION)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def exact_match(prediction: str, gold: str) -> float:
    return float(normalize_answer(prediction) == normalize_answer(gold))


def token_f1(prediction: str, gold: str) -> float:
    """Harmonic mean of token precision and recall after normalisation.

    As in the HotpotQA script, yes/no/noanswer answers only count when matched exactly: a partial
    overlap with "yes" is meaningless.
    """
    pred, ref = normalize_answer(prediction), normalize_answer(gold)
    special = {"yes", "no", "noanswer"}
    if (pred in special or ref in special) and pred != ref:
        return 0.0
    pred_tokens, ref_tokens = pred.split(), ref.split()
    if not pred_tokens or not ref_tokens:
        return float(pred_tokens == ref_tokens)
    common = sum((Counter(pred_tokens) & Counter(ref_tokens)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(pred_tokens), common / len(ref_tokens)
    return 2 * precision * recall / (precision + recall)


def _as_list(golds: str | Iterable[str]) -> list[str]:
    golds = [golds] if isinstance(golds, str) else list(golds)
    if not golds:
        raise ValueError("at least one gold answer is needed to score a prediction")
    return golds


def max_exact_match(prediction: str, golds: str | Iterable[str]) -> float:
    return max(exact_match(prediction, g) for g in _as_list(golds))


def max_token_f1(prediction: str, golds: str | Iterable[str]) -> float:
    return max(token_f1(prediction, g) for g in _as_list(golds))
