"""Result records: the one format every evaluation writes and the leaderboard reads, with its schema.

A record is a JSON object. Schema version 1:

| field | type | meaning |
|---|---|---|
| `schema_version` | int (1) | this table's version |
| `env_id`, `split` | str | what was evaluated (`household/valid_unseen`, `valid_unseen`) |
| `metrics` | {name: {"mean": float, "stderr": float}} | every metric the env defines (success_rate, score, em, f1, pass@k, mean_turns, error_rate/<kind>) |
| `n_episodes` | int > 0 | episodes behind the means |
| `algorithm` | str | registered algorithm name, or `base` for an untrained model |
| `algorithm_config` | object | the algorithm's config as run |
| `student`, `teacher` | str, str or null | model paths / names |
| `code_revision` | str | git revision of the code that produced it |
| `seed` | int | the run's seed |
| `wall_time_s` | float >= 0 | evaluation wall time |
| `created` | str | ISO-8601 time the record was written |
| `curve` | optional list of {"rollouts": int, "success_rate": float} | training curve (success against rollout budget) |
| `protocol` | optional {name: str/number/bool/null} | how it was evaluated (temperature, samples, max_new_tokens, max_turns, backend, action_parser, system_prompt; `partial: true` for an interrupted run); records with different protocols are different leaderboard rows |
| `throughput` | optional {"agent_tokens": int, "tokens_per_s": number} | tokens the policy generated, and per second of wall time |

Validation names the first field that is missing or wrong and what it should be, so a record is either
accepted whole or refused whole.
"""

from __future__ import annotations

import hashlib
import json
import math
from datetime import datetime
from typing import Any, Callable

SCHEMA_VERSION = 1

# metrics where smaller is better; every other metric is "higher is better"
LOWER_IS_BETTER_PREFIXES = ("mean_turns", "error_rate")


class RecordError(ValueError):
    """A record that does not match the schema; the message names the field."""


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _check_metrics(value: Any) -> str | None:
    if not isinstance(value, dict) or not value:
        return "must be a non-empty object {name: {'mean': number, 'stderr': number}}"
    for name, m in value.items():
        if not isinstance(m, dict) or set(m) != {"mean", "stderr"}:
            return f"entry {name!r} must be exactly {{'mean': number, 'stderr': number}}, got {m!r}"
        if not (_is_number(m["mean"]) and _is_number(m["stderr"]) and m["stderr"] >= 0):
            return f"entry {name!r} needs a finite mean and a finite stderr >= 0, got {m!r}"
    return None


def _check_curve(value: Any) -> str | None:
    if not isinstance(value, list):
        return "must be a list of {'rollouts': int, 'success_rate': number}"
    for point in value:
        if not (isinstance(point, dict) and isinstance(point.get("rollouts"), int) and _is_number(point.get("success_rate"))):
            return f"point {point!r} must be {{'rollouts': int, 'success_rate': number}}"
    return None


def _check_created(value: Any) -> str | None:
    try:
        datetime.fromisoformat(value)
    except (TypeError, ValueError):
        return f"must be an ISO-8601 time string, got {value!r}"
    return None


def _typed(kind: type | tuple[type, ...], extra: Callable[[Any], bool] = lambda v: True, want: str = "") -> Callable[[Any], str | None]:
    def check(value: Any) -> str | None:
        if isinstance(value, bool) and kind is not bool or not isinstance(value, kind) or not extra(value):
            return f"must be {want or kind}, got {value!r}"
        return None

    return check


FIELDS: dict[str, tuple[bool, Callable[[Any], str | None]]] = {
    "schema_version": (True, _typed(int, lambda v: v == SCHEMA_VERSION, f"the integer {SCHEMA_VERSION}")),
    "env_id": (True, _typed(str, lambda v: "/" in v, "a registered env id such as 'household/valid_unseen'")),
    "split": (True, _typed(str, bool, "a non-empty string")),
    "metrics": (True, _check_metrics),
    "n_episodes": (True, _typed(int, lambda v: v > 0, "a positive integer")),
    "algorithm": (True, _typed(str, bool, "a non-empty string")),
    "algorithm_config": (True, _typed(dict, want="an object")),
    "student": (True, _typed(str, bool, "a non-empty string")),
    "teacher": (True, lambda v: None if v is None or (isinstance(v, str) and v) else f"must be a non-empty string or null, got {v!r}"),
    "code_revision": (True, _typed(str, bool, "a non-empty string")),
    "seed": (True, _typed(int, want="an integer")),
    "wall_time_s": (True, lambda v: None if _is_number(v) and v >= 0 else f"must be a number >= 0, got {v!r}"),
    "created": (True, _check_created),
    "curve": (False, _check_curve),
    "protocol": (False, lambda v: _check_protocol(v)),
    "throughput": (False, lambda v: None if isinstance(v, dict) and set(v) == {"agent_tokens", "tokens_per_s"}
                   and isinstance(v["agent_tokens"], int) and v["agent_tokens"] >= 0 and _is_number(v["tokens_per_s"])
                   and v["tokens_per_s"] >= 0 else f"must be {{'agent_tokens': int >= 0, 'tokens_per_s': number >= 0}}, got {v!r}"),
}


def _check_protocol(value: Any) -> str | None:
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        return f"must be an object {{name: scalar}}, got {value!r}"
    for k, v in value.items():
        if not (v is None or isinstance(v, (str, bool)) or _is_number(v)):
            return f"entry {k!r} must be a string, number, bool or null, got {v!r}"
    return None


# the `agentgym-opd eval` defaults: a display label leaves these out (identity always uses every entry)
PROTOCOL_DEFAULTS: dict[str, Any] = {"temperature": 0.0, "top_p": 1.0, "samples": 1, "max_new_tokens": 128,
                                     "max_turns": None, "backend": "hf", "action_parser": "text"}


def protocol_label(record: dict[str, Any], *, short: bool = False) -> str:
    """A stable text for a record's evaluation protocol ('' when it has none): part of its identity.
    ``short`` drops the entries equal to the eval defaults, for tables."""
    protocol = record.get("protocol") or {}
    keys = [k for k in sorted(protocol) if not (short and k in PROTOCOL_DEFAULTS and protocol[k] == PROTOCOL_DEFAULTS[k])]
    shown = {k: str(protocol[k]) for k in keys}
    if short and isinstance(protocol.get("system_prompt"), str):  # a paragraph: a table shows its fingerprint
        shown["system_prompt"] = "#" + hashlib.sha256(protocol["system_prompt"].encode()).hexdigest()[:6]
    return " ".join(f"{k}={shown[k]}" for k in keys)


def validate_record(record: Any) -> dict[str, Any]:
    """Return the record if it matches the schema; raise RecordError naming the offending field otherwise."""
    if not isinstance(record, dict):
        raise RecordError(f"a result record is a JSON object, got {type(record).__name__}")
    for name, (required, check) in FIELDS.items():
        if name not in record:
            if required:
                raise RecordError(f"record is missing the required field {name!r}")
            continue
        problem = check(record[name])
        if problem:
            raise RecordError(f"field {name!r} {problem}")
    unknown = sorted(set(record) - set(FIELDS))
    if unknown:
        raise RecordError(f"unknown field(s) {unknown}; schema version {SCHEMA_VERSION} has {sorted(FIELDS)}")
    try:
        json.dumps(record["algorithm_config"], allow_nan=False)
    except (TypeError, ValueError) as err:
        raise RecordError(f"field 'algorithm_config' must be plain JSON ({err})") from err
    return record


def record_id(record: dict[str, Any]) -> str:
    """Content address of a record: identical content, identical id (duplicates are refused by it)."""
    canonical = json.dumps(record, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def env_family(env_id: str) -> str:
    return env_id.split("/", 1)[0]


def lower_is_better(metric: str) -> bool:
    return metric.startswith(LOWER_IS_BETTER_PREFIXES)
