"""Tolerant comparison of a submitted answer with the gold one.

WHY tolerant: a model may write 12.5 as "12.50", "$12.5" or "12.5 EUR", and an order id in any case.
Numbers match within 0.01 absolute or 0.5% relative (money is rounded to cents, conversions may be
redone by hand); strings match after case-folding and trimming whitespace and trailing punctuation.
"""

from __future__ import annotations

import re
from typing import Any

_NUMBER = re.compile(r"-?\d+(?:,\d{3})*(?:\.\d+)?")


def _as_number(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    found = _NUMBER.findall(str(value))
    return float(found[0].replace(",", "")) if len(found) == 1 else None


def _norm(value: Any) -> str:
    return str(value).strip().strip(".!").strip().casefold()


def answers_match(given: Any, gold: Any) -> bool:
    if isinstance(gold, (int, float)) and not isinstance(gold, bool):
        number = _as_number(given)
        return number is not None and abs(number - gold) <= max(0.01, 0.005 * abs(gold)) + 1e-9
    return _norm(given) == _norm(gold)
