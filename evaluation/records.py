"""Result records: the one format every evaluation writes and the leaderboard reads, with its schema.

A record is a JSON object. Schema version 1 (fields below the line are optional):

| field | type | meaning |
|---|---|---|
| `schema_version` | int (1) | this table's version |
| `env_id`, `split` | str | what was evaluated (`household/valid_unseen`, `valid_unseen`) |
| `metrics` | {name: {"mean": float, "stderr": float}} | every metric the env defines (success_rate, score, em, f1, pass@k, mean_turns, error_rate/<kind>); rates lie in [0, 1] |
| `n_episodes` | int > 0 | episodes behind the means |
| `algorithm` | str | registered algorithm name, or `base` for an untrained model |
| `algorithm_config` | object | the algorithm's config as run |
| `student`, `teacher` | str, str or null | model paths / names |
| `code_revision` | str | git revision of the code that produced it; ``+dirty`` (uncommitted changes, here or in ``provenance.training``) is refused by `leaderboard add` and `import-bench` unless ``--allow-dirty`` (``dirty_problem``) |
| `seed` | int | the run's seed |
| `wall_time_s` | float >= 0 | evaluation wall time |
| `created` | str | ISO-8601 time the record was written; not in the future (``CLOCK_SKEW`` allowed; no zone: UTC) |
| `curve` | list of {"rollouts": int, "success_rate": float} | training curve (success against rollout budget) |
| `training` | optional {name: number} | diagnostics of the training run behind the record: `judge_defaulted_share` (SAGE-OPD: share of judged turns whose verdict was unreadable and defaulted; a warning is printed above `evaluation.judge_diagnostics.DEFAULTED_WARN_SHARE`). A name says what kind of quantity it is (``quantity_kind``): a count (`steps`, `*_episodes`, `*_tokens`, ...) is an integer in [0, 10**15], a share (`*_share`, `*_rate`) lies in [0, 1], a duration (`*_s`) in [0, 1e9], anything else in [-1e9, 1e9] |
| `protocol` | {name: str/number/bool/null} | how it was evaluated (temperature, samples, max_new_tokens, max_turns, backend, action_parser, system_prompt; `partial: true` for an interrupted run); records with different protocols are different leaderboard rows |
| `budget` | {"rollout_episodes": int, "tokens": int or null} | training spent: rollout episodes and agent tokens generated |
| `origin` | "original" or "reproduced" | a first result, or a rerun of a published one (absent: original) |
| `reproduces` | str (16 hex digits) | with `origin: reproduced` only, and then required: the record id of the published record it reruns (same env, split, algorithm, models and seed); a leaderboard folder publishes it only beside that record |
| `provenance` | object, see `evaluation.provenance` | package versions, task-set hash, chat-template hash, weights hash, full command, seeds; `training` (optional, see `evaluation.training_provenance`): the training that made the policy |
| `episodes` | list of episode traces, see `evaluation.episode_trace` | a few evaluation episodes, turn by turn, with per-token divergences for distillation methods |
| `outcomes` | optional {task id: number in [0, 1]} | each evaluated task's success (the mean over its samples), at most ``MAX_OUTCOMES`` tasks: the leaderboard pairs two rows over the same (seed, task) episodes with them |
| `throughput` | optional {"agent_tokens": int, "tokens_per_s": number} | tokens the policy generated, and per second of wall time |

Every field is bounded (a record is at most ``MAX_RECORD_BYTES`` of JSON, ``MAX_METRICS`` metrics, names at
most ``MAX_NAME_CHARS`` printable characters, seeds 64-bit), because records come from third parties and
are published on a page: an unbounded record is a denial of service, a control character a forged row.
Validation names the first field that is missing or wrong and what it should be, so a record is either
accepted whole or refused whole. Adding a field is one line in ``FIELDS``.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from datetime import datetime, timedelta, timezone
from typing import Any, Callable, Mapping

from agentgym_opd.policy.loading import DEFAULT_MAX_CONTEXT_TOKENS

SCHEMA_VERSION = 1

MAX_RECORD_BYTES = 1_000_000
MAX_METRICS = 200
MAX_NAME_CHARS = 200
MAX_CURVE_POINTS = 1000
MAX_OUTCOMES = 20_000  # tasks whose outcome one record keeps (ALFWorld's splits and HumanEval+ are far smaller)
MAX_PROTOCOL_ENTRIES = 50
MAX_PROMPT_CHARS = 8000  # a protocol's system prompt (BFCL's own is ~1,000 characters over several lines)
SEED_LIMIT = 2**63  # seeds are 64-bit: |seed| < 2**63
MAX_COUNT = 10**15  # episodes, tokens, steps: exact as a float64, so the page (JavaScript numbers) shows them as written
MAX_MAGNITUDE = 1e9  # any other number a record states (a mean, a loss, a duration in seconds)
CLOCK_SKEW = timedelta(days=1)  # how far ahead of this machine's clock a record's `created` may be
METRIC_NAME = re.compile(r"[A-Za-z0-9_@/.:+-]{1,64}")
RECORD_ID = re.compile(r"[0-9a-f]{16}")  # what `record_id` returns: the name of a published record's file

# metrics where smaller is better; every other metric is "higher is better"
LOWER_IS_BETTER_PREFIXES = ("mean_turns", "error_rate")
# metrics that are shares of episodes or turns: their means lie in [0, 1]
RATE_NAMES = frozenset({"success_rate", "error_rate", "em", "f1", "accuracy", "exact_match"})
RATE_PREFIXES = ("error_rate/", "pass@")
ORIGINS = ("original", "reproduced")
# what a reproduction shares with the record it reruns: the same run, rerun
RERUN_FIELDS = ("env_id", "split", "algorithm", "student", "teacher", "seed")
# the last word of a name that counts something (`steps`, `rollout_episodes`, `max_new_tokens`)
COUNT_WORDS = frozenset({"steps", "step", "episodes", "tokens", "rollouts", "samples", "turns", "count", "updates"})
# the bench's rows that train nothing: the start, the start with privileged context in its prompt, the teacher
REFERENCE_ROWS = ("warm_start", "warm_start+context", "teacher")
# a code revision with uncommitted changes (`evaluation.runner.code_revision`): nobody can rerun that code
DIRTY_SUFFIX = "+dirty"


class RecordError(ValueError):
    """A record that does not match the schema; the message names the field."""


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def is_rate(metric: str) -> bool:
    return metric in RATE_NAMES or metric.startswith(RATE_PREFIXES) or metric.endswith("_rate")


def _printable_name(value: Any, limit: int = MAX_NAME_CHARS) -> bool:
    """A short, single-line, printable string: what a table cell can show without being forged."""
    return isinstance(value, str) and 0 < len(value) <= limit and value.isprintable()


def _check_metrics(value: Any) -> str | None:
    if not isinstance(value, dict) or not value:
        return "must be a non-empty object {name: {'mean': number, 'stderr': number}}"
    if len(value) > MAX_METRICS:
        return f"has {len(value)} metrics; at most {MAX_METRICS} are accepted"
    for name, m in value.items():
        if not METRIC_NAME.fullmatch(name):
            return f"name {name[:80]!r} must be 1-64 characters of letters, digits and _@/.:+-"
        if not isinstance(m, dict) or set(m) != {"mean", "stderr"}:
            return f"entry {name!r} must be exactly {{'mean': number, 'stderr': number}}, got {m!r:.200}"
        if not (_is_number(m["mean"]) and _is_number(m["stderr"]) and m["stderr"] >= 0):
            return f"entry {name!r} needs a finite mean and a finite stderr >= 0, got {m!r:.200}"
        if abs(m["mean"]) > 1e9 or m["stderr"] > 1e9:
            return f"entry {name!r} is out of range (|mean| and stderr at most 1e9), got {m!r:.200}"
        if is_rate(name) and not (0.0 <= m["mean"] <= 1.0 and m["stderr"] <= 1.0):
            return f"entry {name!r} is a rate: its mean must lie in [0, 1] (stderr <= 1), got {m!r:.200}"
        if name.startswith("mean_turns") and m["mean"] < 0:
            return f"entry {name!r} counts turns: its mean must be >= 0, got {m!r:.200}"
    return None


def _check_curve(value: Any) -> str | None:
    if not isinstance(value, list) or len(value) > MAX_CURVE_POINTS:
        return f"must be a list of at most {MAX_CURVE_POINTS} {{'rollouts': int, 'success_rate': number}}"
    for point in value:
        if not (isinstance(point, dict) and set(point) == {"rollouts", "success_rate"}
                and isinstance(point["rollouts"], int) and not isinstance(point["rollouts"], bool)
                and 0 <= point["rollouts"] <= MAX_COUNT
                and _is_number(point["success_rate"]) and 0 <= point["success_rate"] <= 1):
            return f"point {point!r:.200} must be {{'rollouts': int >= 0, 'success_rate': number in [0, 1]}}"
    return None


def quantity_kind(name: str) -> str:
    """What a number named ``name`` measures, read from its name, so a record's free-form numbers (``training``,
    ``protocol``) get a range without a list of every name: 'share' (``*_share``, ``*_rate``, ``*_fraction``,
    ``top_p``), 'duration' (``*_s``, ``*_seconds``), 'count' (last word ``steps``, ``episodes``, ``tokens``, ...,
    or ``n_*``/``num_*``; not a ``mean_``/``avg_`` of one) or 'real'."""
    name = name.lower()
    if name.endswith(("_share", "_rate", "_fraction")) or name == "top_p":
        return "share"
    if name.endswith(("_s", "_seconds")):
        return "duration"
    averaged = name.startswith(("mean_", "avg_", "average_"))
    if not averaged and (re.split(r"[_/.:@+-]", name)[-1] in COUNT_WORDS or name.startswith(("n_", "num_"))):
        return "count"
    return "real"


def _check_quantity(name: str, value: Any) -> str | None:
    """None when ``value`` is a sane number for what its name says it measures (``quantity_kind``), else the
    problem and the fix: 1e308 steps, -3 episodes, 12.5 tokens or a share of 7 are refused, not published."""
    kind = quantity_kind(name)
    if kind == "count":
        if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_COUNT:
            return None
        return (f"entry {name!r} is a count: it must be a whole number in [0, {MAX_COUNT:.0e}] written as an integer "
                f"(12, not 12.0 or 12.5), got {value!r:.80}")
    if not _is_number(value):
        return f"entry {name!r} must be a finite number (not a string, bool, NaN or infinity), got {value!r:.80}"
    low, high, what = {"share": (0.0, 1.0, "a share: a number in [0, 1]"),
                       "duration": (0.0, MAX_MAGNITUDE, f"a duration: seconds in [0, {MAX_MAGNITUDE:.0e}]"),
                       "real": (-MAX_MAGNITUDE, MAX_MAGNITUDE, f"a number in [-{MAX_MAGNITUDE:.0e}, {MAX_MAGNITUDE:.0e}]")}[kind]
    if low <= value <= high:
        return None
    return f"entry {name!r} is {what}, got {value!r:.80}"


def _check_training(value: Any) -> str | None:
    if not isinstance(value, dict) or len(value) > MAX_METRICS:
        return f"must be an object {{name: number}} of at most {MAX_METRICS} entries, got {value!r:.200}"
    for name, x in value.items():
        if not METRIC_NAME.fullmatch(name):
            return f"name {name[:80]!r} must be 1-64 characters of letters, digits and _@/.:+-"
        problem = _check_quantity(name, x)
        if problem:
            return problem
    return None


def _check_created(value: Any, now: datetime | None = None) -> str | None:
    try:
        if not isinstance(value, str) or len(value) > 64:
            raise ValueError
        when = datetime.fromisoformat(value)
    except (TypeError, ValueError):
        return f"must be an ISO-8601 time string, got {value!r:.80}"
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    now = now or datetime.now(timezone.utc)
    if when > now + CLOCK_SKEW:  # (when - skew would overflow for year 1)
        return (f"is in the future ({value}; this machine's clock reads {now:%Y-%m-%dT%H:%M}Z and allows "
                f"{CLOCK_SKEW.days} day of clock skew): state when the record was made (eval writes it itself), or fix "
                "the clock of the machine that wrote it")
    return None


def _printable_text(value: Any, limit: int) -> bool:
    """A paragraph: printable characters, newlines and tabs (a system prompt), at most ``limit`` characters."""
    return (isinstance(value, str) and 0 < len(value) <= limit
            and all(ch.isprintable() or ch in "\n\t" for ch in value))


def _check_protocol(value: Any) -> str | None:
    if not isinstance(value, dict) or len(value) > MAX_PROTOCOL_ENTRIES:
        return f"must be an object {{name: scalar}} of at most {MAX_PROTOCOL_ENTRIES} entries, got {value!r:.200}"
    for k, v in value.items():
        if not _printable_name(k, 64):
            return f"key {k!r:.80} must be a printable name of at most 64 characters"
        if k == "system_prompt" and _printable_text(v, MAX_PROMPT_CHARS):
            continue  # a paragraph; tables show its fingerprint (`protocol_label(short=True)`)
        if not (v is None or isinstance(v, bool) or _is_number(v) or _printable_name(v)):
            return (f"entry {k!r} must be a printable string, number, bool or null (system_prompt: printable "
                    f"text with newlines, at most {MAX_PROMPT_CHARS} characters), got {v!r:.200}")
        if _is_number(v) or (isinstance(v, bool) and quantity_kind(k) == "count"):
            problem = _check_quantity(k, v)  # max_turns=true, samples=1e308, top_p=7: not a protocol
            if problem:
                return problem
    return None


def _check_budget(value: Any) -> str | None:
    want = "must be {'rollout_episodes': int >= 0, 'tokens': int >= 0 or null}"
    if not isinstance(value, dict) or set(value) != {"rollout_episodes", "tokens"}:
        return f"{want}, got {value!r:.200}"
    for key in ("rollout_episodes", "tokens"):
        if value[key] is None and key == "tokens":
            continue
        problem = _check_quantity(key, value[key])
        if problem:
            return problem
    return None


def _typed(kind: type | tuple[type, ...], extra: Callable[[Any], bool] = lambda v: True, want: str = "") -> Callable[[Any], str | None]:
    def check(value: Any) -> str | None:
        if isinstance(value, bool) and kind is not bool or not isinstance(value, kind) or not extra(value):
            return f"must be {want or kind}, got {value!r:.200}"
        return None

    return check


_NAME = f"a printable string of 1-{MAX_NAME_CHARS} characters (no newline or control character)"


def _name(extra: Callable[[str], bool] = lambda v: True, want: str = _NAME) -> Callable[[Any], str | None]:
    return _typed(str, lambda v: _printable_name(v) and extra(v), want)


def _lazy(name: str) -> Callable[[Any], str | None]:
    """A check that lives in another module (which imports this one): looked up when first used."""
    def check(value: Any) -> str | None:
        import importlib

        module, func = name.rsplit(":", 1)
        return getattr(importlib.import_module(module), func)(value)

    return check


def _check_outcomes(value: Any) -> str | None:
    """Per-task success shares: task ids are names (printable, bounded), values lie in [0, 1]."""
    want = f"must be {{task id: number in [0, 1]}} with at most {MAX_OUTCOMES} tasks"
    if not isinstance(value, dict) or not 0 < len(value) <= MAX_OUTCOMES:
        return f"{want}, got {type(value).__name__} of {len(value) if isinstance(value, dict) else '?'} entries"
    for task, share in value.items():
        if not _printable_name(task) or not (_is_number(share) and 0 <= share <= 1):
            return f"{want}; {task!r:.80}: {share!r:.40}"
    return None


# name: (required, check). Adding a field is one line here (and one row in the docstring's table).
FIELDS: dict[str, tuple[bool, Callable[[Any], str | None]]] = {
    "schema_version": (True, _typed(int, lambda v: v == SCHEMA_VERSION, f"the integer {SCHEMA_VERSION}")),
    "env_id": (True, _name(lambda v: "/" in v, "a registered env id such as 'household/valid_unseen'")),
    "split": (True, _name()),
    "metrics": (True, _check_metrics),
    "n_episodes": (True, _typed(int, lambda v: 0 < v <= MAX_COUNT, f"a positive integer of at most {MAX_COUNT:.0e}")),
    "algorithm": (True, _name()),
    "algorithm_config": (True, _typed(dict, want="an object")),
    "student": (True, _name()),
    "teacher": (True, lambda v: None if v is None or _printable_name(v) else f"must be {_NAME} or null, got {v!r:.200}"),
    "code_revision": (True, _name()),
    "seed": (True, _typed(int, lambda v: -SEED_LIMIT < v < SEED_LIMIT, "an integer with |seed| < 2**63")),
    "wall_time_s": (True, lambda v: None if _is_number(v) and 0 <= v <= 1e9 else f"must be a number in [0, 1e9], got {v!r:.80}"),
    "created": (True, _check_created),
    "curve": (False, _check_curve),
    "protocol": (False, _check_protocol),
    "budget": (False, _check_budget),
    "origin": (False, _typed(str, lambda v: v in ORIGINS, f"one of {ORIGINS}")),
    "reproduces": (False, _typed(str, lambda v: bool(RECORD_ID.fullmatch(v)),
                                 "the 16-hex-digit id of the published record it reruns (its file name in records/)")),
    "provenance": (False, _lazy("evaluation.provenance:check_provenance")),
    "episodes": (False, _lazy("evaluation.episode_trace:check_episodes")),
    "training": (False, _check_training),
    "outcomes": (False, _check_outcomes),
    "throughput": (False, lambda v: None if isinstance(v, dict) and set(v) == {"agent_tokens", "tokens_per_s"}
                   and _check_quantity("agent_tokens", v["agent_tokens"]) is None and _is_number(v["tokens_per_s"])
                   and 0 <= v["tokens_per_s"] <= 1e12 else f"must be {{'agent_tokens': int >= 0, 'tokens_per_s': number >= 0}}, got {v!r:.200}"),
}

BENCH_CONTEXT_TOKENS = 4096  # the bench's evaluation context budget (a longer history is cut from the front)


def env_args_label(env_args: dict[str, Any] | None) -> str | None:
    """The env constructor options an evaluation used, as one protocol entry: sorted ``key=<JSON value>``
    pairs (``max_turns`` left out: it has its own entry), a fingerprint when longer than a table cell, None
    when there are none. Observations depend on them (``status_line=true`` restates the task every turn),
    so two evaluations that differ here are not comparable."""
    shown = {k: v for k, v in (env_args or {}).items() if k != "max_turns"}
    if not shown:
        return None
    text = " ".join(f"{k}={json.dumps(shown[k], sort_keys=True)}" for k in sorted(shown))
    if len(text) > MAX_NAME_CHARS or not text.isprintable():
        return "#" + hashlib.sha256(text.encode()).hexdigest()[:12]
    return text


# the `agentgym-opd eval` defaults: a display label leaves these out (identity always uses every entry)
PROTOCOL_DEFAULTS: dict[str, Any] = {"temperature": 0.0, "top_p": 1.0, "samples": 1, "max_new_tokens": 128,
                                     "max_turns": None, "backend": "hf", "action_parser": "text",
                                     "max_context_tokens": DEFAULT_MAX_CONTEXT_TOKENS}


def protocol_label(record: dict[str, Any], *, short: bool = False, fingerprint_prompt: bool = False) -> str:
    """A stable text for a record's evaluation protocol ('' when it has none): part of its identity.
    ``short`` drops the entries equal to the eval defaults and shows the system prompt by its fingerprint,
    for a method's name; ``fingerprint_prompt`` only the latter, for a table's protocol column."""
    protocol = record.get("protocol") or {}
    keys = [k for k in sorted(protocol) if not (short and k in PROTOCOL_DEFAULTS and protocol[k] == PROTOCOL_DEFAULTS[k])]
    shown = {k: str(protocol[k]) for k in keys}
    if (short or fingerprint_prompt) and isinstance(protocol.get("system_prompt"), str):  # a paragraph
        shown["system_prompt"] = "#" + hashlib.sha256(protocol["system_prompt"].encode()).hexdigest()[:6]
    return " ".join(f"{k}={shown[k]}" for k in keys)


def validate_record(record: Any) -> dict[str, Any]:
    """Return the record if it matches the schema; raise RecordError naming the offending field otherwise."""
    if not isinstance(record, dict):
        raise RecordError(f"a result record is a JSON object, got {type(record).__name__}")
    unknown = sorted(set(record) - set(FIELDS))
    if unknown:
        raise RecordError(f"unknown field(s) {[u[:80] for u in unknown[:10]]}; schema version {SCHEMA_VERSION} has {sorted(FIELDS)}")
    try:
        size = len(json.dumps(record, sort_keys=True))
    except (TypeError, ValueError, RecursionError) as err:
        raise RecordError(f"a record must be plain JSON ({str(err)[:200]})") from err
    if size > MAX_RECORD_BYTES:
        raise RecordError(f"record is {size} bytes of JSON; at most {MAX_RECORD_BYTES} are accepted "
                          "(keep fewer episodes, or shorter texts, in it)")
    for name, (required, check) in FIELDS.items():
        if name not in record:
            if required:
                raise RecordError(f"record is missing the required field {name!r}")
            continue
        problem = check(record[name])
        if problem:
            raise RecordError(f"field {name!r} {problem}")
    problem = _check_origin_link(record)
    if problem:
        raise RecordError(problem)
    for name in record:
        try:
            json.dumps(record[name], allow_nan=False)
        except ValueError as err:
            raise RecordError(f"field {name!r} must be plain, finite JSON ({err})") from err
    return record


def _check_origin_link(record: dict[str, Any]) -> str | None:
    """A reproduction names the record it reruns, and only a reproduction does: a bare "(reproduced)" row
    would claim a rerun of nothing."""
    reproduced = record.get("origin") == "reproduced"
    if reproduced and "reproduces" not in record:
        return ("field 'reproduces' is missing: a record with origin 'reproduced' must name the record it reruns "
                "(`agentgym-opd leaderboard reproduce ORIGINAL --add` writes it); a first result has origin 'original'")
    if not reproduced and "reproduces" in record:
        return ("field 'reproduces' names a rerun's original, but origin is not 'reproduced': set origin to "
                "'reproduced' for a rerun, or drop 'reproduces' from a first result")
    return None


def dirty_revisions(record: dict[str, Any]) -> list[str]:
    """Each revision of the code behind a record that had uncommitted changes, as 'field revision'."""
    found = []
    if str(record.get("code_revision", "")).endswith(DIRTY_SUFFIX):
        found.append(f"code_revision {record['code_revision']}")
    training = (record.get("provenance") or {}).get("training") or {}
    if str(training.get("code_revision", "")).endswith(DIRTY_SUFFIX):
        found.append(f"provenance.training.code_revision {training['code_revision']}")
    return found


def dirty_problem(source: str, record: dict[str, Any]) -> str | None:
    """Why a record from a tree with uncommitted changes is refused, with the fix; None for a clean one."""
    dirty = dirty_revisions(record)
    if not dirty:
        return None
    return (f"{source or 'record'}: made from a tree with uncommitted changes ({'; '.join(dirty)}): nobody can rerun "
            "that code. Commit the changes and rerun from the clean checkout, or pass --allow-dirty to publish it "
            "marked as from a dirty tree")


def reproduces_id(record: dict[str, Any]) -> str:
    """The id a rerun of ``record`` reproduces: the record's own, or its original's when it is itself a rerun."""
    return record["reproduces"] if record.get("origin") == "reproduced" else record_id(record)


def reproduction_problem(record: dict[str, Any], originals: Mapping[str, dict[str, Any]]) -> str | None:
    """Why a reproduction cannot be published beside ``originals`` (record id -> record: what a leaderboard
    folder holds, plus the batch being added), or None. Its original must be there, be an original, and be
    the same run (``RERUN_FIELDS``): otherwise the page would show a "(reproduced)" row that reruns nothing."""
    if record.get("origin") != "reproduced":
        return None
    wanted = record["reproduces"]
    original = originals.get(wanted)
    if original is None:
        return (f"it reproduces record {wanted}, which is not published in this leaderboard folder: publish the "
                "original first (`agentgym-opd leaderboard add ORIGINAL.json`), or add the rerun to the folder "
                "that holds it")
    if original.get("origin") == "reproduced":
        return f"it names record {wanted}, itself a reproduction: 'reproduces' must name the original record"
    differs = [f"{f} (rerun: {record[f]!r:.60}, original: {original[f]!r:.60})" for f in RERUN_FIELDS if record[f] != original[f]]
    if differs:
        return (f"it is not a rerun of record {wanted}: they differ on {'; '.join(differs)}; a reproduction reruns "
                "the same run")
    return None


def parse_record(text: str | bytes, source: str = "record") -> dict[str, Any]:
    """JSON text -> a validated record; every way the text can be bad is a RecordError naming ``source``.

    The size is checked before parsing; Python's own limits (integers over 4300 digits, deep nesting)
    surface as ValueError/RecursionError, which are caught here too, so no input reaches the user as a
    traceback.
    """
    if len(text) > MAX_RECORD_BYTES:
        raise RecordError(f"{source} is {len(text)} bytes; a record is at most {MAX_RECORD_BYTES} bytes of JSON")
    try:
        record = json.loads(text)
    except (ValueError, RecursionError) as err:  # JSONDecodeError, UnicodeDecodeError, int digit limit
        raise RecordError(f"cannot read a JSON record from {source}: not valid JSON ({str(err)[:200]}); fix or remove it") from err
    try:
        return validate_record(record)
    except RecordError as err:
        raise RecordError(f"{source}: {err}") from err


def record_id(record: dict[str, Any]) -> str:
    """Content address of a record: identical content, identical id (duplicates are refused by it)."""
    canonical = json.dumps(record, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def env_family(env_id: str) -> str:
    return env_id.split("/", 1)[0]


def lower_is_better(metric: str) -> bool:
    return metric.startswith(LOWER_IS_BETTER_PREFIXES)
