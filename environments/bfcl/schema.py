"""Check parsed calls against the function docs the agent was shown: the execution-error signal.

WHY a check of our own beside BFCL's checker: the checker says whether the calls match the *answer*;
this says whether they are *callable at all* with the documented signature (unknown function, missing
required argument, an argument the function does not have, a value of the wrong JSON-schema type). Those
are what a real tool would reject, so they become `tool_error` `StepError`s with a message naming the
function's real parameters, which a model can learn from. The verdict itself stays BFCL's (or, for
ACEBench, its possible-answer match).

Docs are BFCL/ACEBench style: `{"name", "description", "parameters" | "arguments": {"type", "properties",
"required"}}`. Types follow both benchmarks' vocabularies (`dict`/`object`, `float`/`number`, `tuple`,
`any`); integers are accepted where a float is documented, null where an argument is optional;
unknown type names are not checked.
"""

from __future__ import annotations

from typing import Any

from environments.bfcl.calls import Call

_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "str": (str,),
    "integer": (int,),
    "int": (int,),
    "float": (int, float),
    "number": (int, float),
    "boolean": (bool,),
    "bool": (bool,),
    "array": (list, tuple),
    "list": (list, tuple),
    "tuple": (list, tuple),
    "dict": (dict,),
    "object": (dict,),
}


def doc_parameters(doc: dict) -> dict:
    params = doc.get("parameters")
    if params is None:
        params = doc.get("arguments")
    return params if isinstance(params, dict) else {}


def type_ok(value: Any, type_name: Any) -> bool:
    if not isinstance(type_name, str) or type_name.lower() not in _TYPES:
        return True  # "any", or a type name we do not know: do not guess
    expected = _TYPES[type_name.lower()]
    if isinstance(value, bool) and bool not in expected:
        return False  # True is an int in Python, never in JSON schema
    return isinstance(value, expected)


def _signature(name: str, params: dict) -> str:
    props = params.get("properties", {}) or {}
    required = set(params.get("required", []) or [])
    parts = [f"{p}: {(spec or {}).get('type', 'any')}{'' if p in required else ' (optional)'}" for p, spec in props.items()]
    return f"{name}({', '.join(parts)})"


def check_calls(calls: list[Call], docs: list[dict], *, allow_positional: bool = False,
                resolve_name=None) -> list[str]:
    """Problems that make the calls uncallable as documented, one message each (empty: all callable).

    `resolve_name` maps a called name to a documented one (ACEBench's `_1` suffixes); default: identity.
    """
    by_name = {d.get("name"): d for d in docs if isinstance(d, dict)}
    problems: list[str] = []
    for call in calls:
        name = resolve_name(call.name) if resolve_name else call.name
        doc = by_name.get(name)
        if doc is None:
            problems.append(f"Unknown function {call.name!r}. The available functions are: {', '.join(sorted(map(str, by_name)))}.")
            continue
        params = doc_parameters(doc)
        props = params.get("properties", {}) or {}
        signature = _signature(name, params)
        if call.args and not allow_positional:
            problems.append(f"{call.name}: pass arguments by name (name=value), not positionally. Signature: {signature}.")
        for param in params.get("required", []) or []:
            if param not in call.kwargs and not (allow_positional and call.args):
                problems.append(f"{call.name}: missing required argument {param!r}. Signature: {signature}.")
        for param, value in call.kwargs.items():
            if param not in props:
                problems.append(f"{call.name}: unexpected argument {param!r}. Signature: {signature}.")
                continue
            expected = (props[param] or {}).get("type")
            if value is None and param not in (params.get("required", []) or []):
                continue  # null for an optional argument: "not given" (BFCL's live answers write it so)
            if not type_ok(value, expected):
                problems.append(
                    f"{call.name}: argument {param!r} should be of type {expected}, got {type(value).__name__} {value!r:.80}."
                )
    return problems
