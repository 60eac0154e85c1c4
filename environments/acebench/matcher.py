"""AST match of parsed calls against ACEBench's possible answers.

ACEBench's answers are concrete calls, not BFCL-style lists of accepted values, so the match is by
value after normalisation. The rules, in order:

* An answer is a set of calls; one of the listed alternatives must match. Order of calls is free, each
  answer call is matched to exactly one agent call, and the counts must agree.
* An answer key `name_1` / `name_2` means a repeated call of `name` (ACEBench's way of keeping dict keys
  unique): the suffix is dropped when the bare name is a documented function and the suffixed one is not.
* Function names must be equal; the agent's argument names must equal the answer's (a missing argument
  and an extra one both fail: the answer lists exactly what the user asked for).
* Values: numbers equal numerically (1 == 1.0), a numeric string equals the number it spells, "true"
  equals True; strings equal after lower-casing and removing spaces and `,./-_*^` (BFCL's and ACEBench's
  `standardize_string`), so "New York" == "new york" and "2023-08-01" == "20230801"; dicts match
  key by key, recursively; lists match element by element, in any order (ACEBench's lists are sets of
  items: metrics, tags, designers).
"""

from __future__ import annotations

import re
from typing import Any

from environments.bfcl.calls import Call

_STANDARDIZE = re.compile(r"[ ,./\-_*^]")
_SUFFIX = re.compile(r"^(.*)_\d+$")


def standardize(text: str) -> str:
    return _STANDARDIZE.sub("", text).lower().replace("'", '"')


def resolve_answer_name(name: str, documented: set[str]) -> str:
    match = _SUFFIX.match(name)
    if name not in documented and match and match.group(1) in documented:
        return match.group(1)
    return name


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value.strip())
        except ValueError:
            return None
    return None


def values_equal(got: Any, want: Any) -> bool:
    if isinstance(want, dict) or isinstance(got, dict):
        return (isinstance(want, dict) and isinstance(got, dict) and set(got) == set(want)
                and all(values_equal(got[k], want[k]) for k in want))
    if isinstance(want, (list, tuple)) or isinstance(got, (list, tuple)):
        if not (isinstance(want, (list, tuple)) and isinstance(got, (list, tuple)) and len(got) == len(want)):
            return False
        return _assign(list(got), list(want), values_equal)
    if isinstance(want, bool) or isinstance(got, bool):
        return str(got).strip().lower() == str(want).strip().lower()
    if (isinstance(want, (int, float)) or isinstance(got, (int, float))):
        a, b = _number(got), _number(want)
        return a is not None and b is not None and abs(a - b) <= 1e-9 * max(1.0, abs(b))
    if isinstance(want, str) and isinstance(got, str):
        return standardize(got) == standardize(want)
    return got == want


def _assign(got: list, want: list, equal) -> bool:
    """Is there a one-to-one pairing of `got` and `want` under `equal`?

    A bipartite matching (augmenting paths, Kuhn's algorithm) over the table of `equal` for every pair:
    at most len(want)**2 comparisons and O(n**3) steps. WHY not backtracking over orders: agent text picks
    `got`, and a list of near-duplicates makes backtracking try every order before it fails (12 equal items
    and one different: 12! orders). The comparisons run want-major (each answer item against every agent
    item in order), so a caller that records reasons sees the first mismatch first."""
    if len(got) != len(want):
        return False
    fits = [[i for i, candidate in enumerate(got) if equal(candidate, item)] for item in want]
    owner: dict[int, int] = {}  # agent item -> the answer item it is paired with

    def augment(j: int, seen: set[int]) -> bool:
        for i in fits[j]:
            if i in seen:
                continue
            seen.add(i)
            if i not in owner or augment(owner[i], seen):
                owner[i] = j
                return True
        return False

    return all(augment(j, set()) for j in range(len(want)))


def _call_mismatch(call: Call, name: str, params: dict) -> str | None:
    if call.name != name:
        return f"called {call.name!r}, expected {name!r}"
    if set(call.kwargs) != set(params):
        missing, extra = sorted(set(params) - set(call.kwargs)), sorted(set(call.kwargs) - set(params))
        parts = ([f"missing argument(s) {', '.join(missing)}"] if missing else []) + (
            [f"unexpected argument(s) {', '.join(extra)}"] if extra else [])
        return f"{name}: " + "; ".join(parts)
    for key, want in params.items():
        if not values_equal(call.kwargs[key], want):
            return f"{name}: argument {key!r} is {call.kwargs[key]!r}, expected {want!r}"
    return None


def match_answer(calls: list[Call], answer: dict, documented: set[str]) -> str | None:
    """None when `calls` match one answer, else why not (the closest reason found)."""
    expected = [(resolve_answer_name(name, documented), params) for name, params in answer.items()]
    if len(calls) != len(expected):
        return f"made {len(calls)} call(s), expected {len(expected)} ({', '.join(n for n, _ in expected)})"
    reasons: list[str] = []

    def equal(call: Call, item: tuple[str, dict]) -> bool:
        reason = _call_mismatch(call, *item)
        if reason:
            reasons.append(reason)
        return reason is None

    if _assign(list(calls), expected, equal):
        return None
    same_name = [r for r in reasons if not r.startswith("called ")]
    return (same_name or reasons or ["no matching call"])[0]


def match(calls: list[Call], ground_truth: dict | list[dict], documented: set[str]) -> tuple[bool, str]:
    """(matched, reason) against every accepted alternative of an ACEBench possible answer."""
    alternatives = ground_truth if isinstance(ground_truth, list) else [ground_truth]
    reasons = []
    for answer in alternatives:
        reason = match_answer(calls, answer, documented)
        if reason is None:
            return True, ""
        reasons.append(reason)
    return False, reasons[0]


def render_answer(answer: dict, documented: set[str]) -> str:
    """One accepted answer in Python call syntax (the privileged solution)."""
    calls = [Call(resolve_answer_name(name, documented), dict(params)) for name, params in answer.items()]
    return "[" + ", ".join(c.to_source() for c in calls) + "]"
