"""Several teachers in one run: each task is routed to one of them by a rule in the run config.

Why: one teacher rarely covers every task family a student trains on (a household expert, a tool-use expert).
``train --algo opd --teacher household=PATH_A --teacher tools=PATH_B`` names two; the config's
``model.teacher_route`` says what of a task picks its teacher, and ``model.teacher_routes`` maps values of it
to teacher names:

| ``model.teacher_route`` | the key of a task |
|---|---|
| ``env`` | its env id (``household/train``) |
| ``family`` | the env id's family (``household``) |
| ``split`` | its split (``train``) |
| ``metadata.<field>`` | ``task.metadata[field]`` as text (e.g. ``metadata.task_type``) |

``model.teacher_routes`` is an ordered mapping ``pattern -> teacher name``: the first pattern the key matches
(shell-style: ``household/*``; ``*`` matches anything) names the teacher. Without routes, the teacher whose
name equals the key is chosen (``--teacher household=A --teacher tooluse=B model.teacher_route=family``).
A task no rule covers is an error naming its key and the rules, never a silent default.

Each teacher is loaded once, where it is cheapest to score (in process, or served: ``model.teacher_backend``
applies to all). Each one takes the same-tokenizer or the cross-tokenizer path by itself
(:mod:`agentgym_opd.cross_tokenizer`). A micro-batch is split by teacher; since the loss is a weighted sum over
rows, the groups' losses add up to the batch's. The metrics give each teacher's share of the batch's agent
tokens (``teacher_share/<name>``); records and the leaderboard name every teacher as ``name=model,...``.
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Sequence

import torch

from agentgym_opd.rollout import RolloutBatch
from agentgym_opd.types import Task

ROUTE_KEYS = ("env", "family", "split")
TEACHER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,39}")
SHARE_METRIC = "teacher_share/{}"


# ----------------------------------------------------------------------------------------------------
# The command line and the config
# ----------------------------------------------------------------------------------------------------


def parse_teacher_flags(values: Sequence[str] | None) -> tuple[str | None, dict[str, str]]:
    """``--teacher`` values -> ``(model.teacher, model.teachers)``.

    One plain ``PATH`` is the single teacher, as before. ``NAME=PATH`` (repeatable) names several; a name is
    1-40 letters, digits, ``_ . -``. Mixing the two forms, or naming a teacher twice, is an error."""
    values = list(values or [])
    named: dict[str, str] = {}
    plain: list[str] = []
    for value in values:
        name, sep, path = value.partition("=")
        if sep and TEACHER_NAME.fullmatch(name) and path:
            if name in named:
                raise ValueError(f"--teacher {name}=... is given twice; each teacher needs its own name")
            named[name] = path
        else:
            plain.append(value)
    if plain and named:
        raise ValueError("--teacher: give one PATH, or several NAME=PATH, not both (e.g. --teacher household=PATH_A "
                         "--teacher tools=PATH_B)")
    if len(plain) > 1:
        raise ValueError(f"--teacher given {len(plain)} times without names: name each, e.g. --teacher a=PATH_A "
                         "--teacher b=PATH_B, and route tasks with model.teacher_route / model.teacher_routes")
    return (plain[0] if plain else None), named


def check_teacher_settings(teacher: str | None, teachers: Mapping[str, str], route: str,
                           routes: Mapping[str, str]) -> None:
    """The ``model`` section's teacher keys agree with each other (raises ValueError saying how to fix it)."""
    if teacher and teachers:
        raise ValueError("give model.teacher (one teacher) or model.teachers (several, by name), not both")
    for name in teachers:
        if not TEACHER_NAME.fullmatch(str(name)):
            raise ValueError(f"model.teachers: {name!r} is not a teacher name (1-40 letters, digits, _ . -)")
    if not (route in ROUTE_KEYS or (route.startswith("metadata.") and len(route) > len("metadata."))):
        raise ValueError(f"model.teacher_route={route!r}: use one of {', '.join(ROUTE_KEYS)} or metadata.<field>")
    unknown = sorted({n for n in routes.values() if n not in teachers})
    if routes and not teachers:
        raise ValueError("model.teacher_routes needs model.teachers (several teachers by name)")
    if unknown:
        raise ValueError(f"model.teacher_routes names {unknown}, which model.teachers does not have "
                         f"({sorted(teachers)})")


# ----------------------------------------------------------------------------------------------------
# Routing
# ----------------------------------------------------------------------------------------------------


def route_key(task: Task, route: str) -> str:
    """The value of ``task`` that picks its teacher (module docstring's table)."""
    if route == "env":
        return task.env_id
    if route == "family":
        return task.env_id.split("/", 1)[0]
    if route == "split":
        return task.split
    field = route.split(".", 1)[1]
    value = (task.metadata or {}).get(field)
    if value is None:
        raise ValueError(f"task {task.id!r} ({task.env_id}) has no metadata field {field!r} to route its teacher by "
                         f"(its fields: {sorted(task.metadata or {})}); pick another model.teacher_route")
    return str(value)


@dataclass(frozen=True)
class RoutingRule:
    """``by``: what of a task is the key; ``routes``: ``(pattern, teacher)`` pairs, first match wins."""

    by: str
    routes: tuple[tuple[str, str], ...]
    names: tuple[str, ...]

    def teacher_for(self, task: Task) -> str:
        key = route_key(task, self.by)
        for pattern, name in self.routes:
            if fnmatch.fnmatchcase(key, pattern):
                return name
        if not self.routes and key in self.names:
            return key
        rules = (", ".join(f"{p} -> {n}" for p, n in self.routes)
                 or f"a teacher named after the key ({', '.join(self.names)})")
        raise ValueError(f"task {task.id!r}: no teacher for {self.by}={key!r} (rules: {rules}); add a route in "
                         f"model.teacher_routes, e.g. \"model.teacher_routes={{'{key}': {self.names[0]}}}\"")


class TeacherSet:
    """Named teacher policies, each loaded once, and the rule that routes each task to one of them."""

    def __init__(self, teachers: Mapping[str, Any], rule: RoutingRule, labels: Mapping[str, str] | None = None):
        if not teachers:
            raise ValueError("a TeacherSet needs at least one teacher")
        self.teachers = dict(teachers)
        self.rule = rule
        self.labels = dict(labels or {name: name for name in teachers})

    def __len__(self) -> int:
        return len(self.teachers)

    def names(self) -> list[str]:
        return list(self.teachers)

    def route(self, episodes: Iterable[Any]) -> list[str]:
        """The teacher name of each episode (by its task)."""
        return [self.rule.teacher_for(e.task) for e in episodes]

    def label(self) -> str:
        return teachers_label(self.labels)


def teachers_label(named: Mapping[str, str]) -> str:
    """How a record names several teachers: ``name=model`` pairs joined by commas, in the config's order."""
    return ",".join(f"{name}={model}" for name, model in named.items())


def run_teacher_name(model: Mapping[str, Any]) -> str | None:
    """How a record names a run's teacher (a run config's ``model`` section as a dict): ``model.teacher``'s
    name, or ``name=model,...`` for ``model.teachers`` (the record schema's ``teacher`` is one printable string)."""
    from agentgym_opd.policy.loading import model_name

    if model.get("teachers"):
        return teachers_label({str(n): model_name(str(p)) or str(p) for n, p in dict(model["teachers"]).items()})
    return model_name(model.get("teacher") or None)


def routing_rule(teachers: Mapping[str, str], route: str, routes: Mapping[str, str]) -> RoutingRule:
    return RoutingRule(route, tuple((str(p), str(n)) for p, n in routes.items()), tuple(teachers))


def load_teachers(config: Any, algo_cls: Any, algo_config: Any, load_one: Callable[[Any, Any], Any]) -> Any:
    """The run's teacher: ``load_one(config, algo_config)`` for ``model.teacher`` (one teacher, as before), or a
    :class:`TeacherSet` loading each of ``model.teachers`` once through the same function."""
    import dataclasses

    from agentgym_opd.policy.loading import model_name

    m = config.model
    if not m.teachers:
        return load_one(config, algo_config)
    if not getattr(algo_cls, "supports_teacher_set", False):
        raise ValueError(f"{config.algorithm} does not route tasks to several teachers (model.teachers): "
                         "use --algo opd, or give one --teacher PATH")
    loaded = {}
    for name, path in m.teachers.items():
        one = dataclasses.replace(config, model=dataclasses.replace(m, teacher=path, teachers={}, teacher_routes={}))
        loaded[name] = load_one(one, algo_config)
    labels = {name: model_name(path) or path for name, path in m.teachers.items()}
    return TeacherSet(loaded, routing_rule(m.teachers, m.teacher_route, m.teacher_routes), labels)


# ----------------------------------------------------------------------------------------------------
# Splitting a batch by teacher
# ----------------------------------------------------------------------------------------------------


def select_rows(batch: RolloutBatch, rows: Sequence[int]) -> RolloutBatch:
    """The sub-batch of ``rows`` (in that order): the same episodes and token tensors, re-indexed."""
    index = torch.tensor(list(rows), dtype=torch.long)
    return RolloutBatch(
        episodes=[batch.episodes[r] for r in rows], input_ids=batch.input_ids[index],
        attention_mask=batch.attention_mask[index], loss_mask=batch.loss_mask[index],
        turn_index=batch.turn_index[index], behaviour_logprobs=batch.behaviour_logprobs[index],
        group_ids=batch.group_ids[index],
        rewards=batch.rewards[index] if batch.rewards.numel() == len(batch) else batch.rewards)


def token_shares(batch: RolloutBatch, names: Sequence[str], teachers: Sequence[str],
                 dist: Any = None) -> dict[str, float]:
    """Each teacher's share of the batch's agent tokens: ``teacher_share/<name>`` (every teacher listed, 0 if
    no row went to it).

    Under torchrun (``dist``: the algorithm's :class:`agentgym_opd.distributed.DistContext`) the token counts
    are summed over ranks first, so every rank holds the share of the *global* batch (a mean of the ranks'
    own shares would weigh a rank with few tokens like one with many)."""
    from agentgym_opd.distributed import all_reduce_sum_list

    tokens = batch.loss_mask.sum(dim=1).float()
    counts = {t: 0.0 for t in teachers}
    for row, name in enumerate(names):
        counts[name] += float(tokens[row])
    if dist is not None:
        counts = dict(zip(counts, all_reduce_sum_list(list(counts.values()), dist)))
    total = sum(counts.values()) or 1.0
    return {SHARE_METRIC.format(t): count / total for t, count in counts.items()}


def grouped_rows(names: Sequence[str], rows: slice) -> dict[str, list[int]]:
    """Micro-batch rows by teacher: name -> the rows' offsets within ``rows``, in order of first appearance."""
    groups: dict[str, list[int]] = {}
    for k, row in enumerate(range(rows.start, rows.stop)):
        groups.setdefault(names[row], []).append(k)
    return groups


def routed_loss(algorithm: Any, batch: RolloutBatch, rows: slice, coef: dict[str, torch.Tensor], state: Any,
                step: Any) -> tuple[torch.Tensor, dict[str, float]]:
    """``rows``' share of the batch loss with each row scored by its own teacher: the rows are split by teacher,
    each group's loss is the algorithm's single-teacher loss on the sub-batch (inside
    ``algorithm.routed_to(name)``), and the groups' losses and metric contributions add up (both are sums over
    rows weighted by ``coef``)."""
    import dataclasses

    names = algorithm.teacher_set.route(batch.episodes)
    total: torch.Tensor | None = None
    metrics: dict[str, float] = {}
    for name, local in grouped_rows(names, rows).items():
        absolute = [rows.start + k for k in local]
        sub = select_rows(batch, absolute)
        sub_state = dataclasses.replace(state, contexts=[state.contexts[r] for r in absolute])
        sub_coef = {key: value[torch.tensor(local, dtype=torch.long)] for key, value in coef.items()}
        with algorithm.routed_to(name):
            loss, parts = algorithm.compute_loss(sub, slice(0, len(local)), sub_coef, sub_state, step)
        total = loss if total is None else total + loss
        for key, value in parts.items():
            metrics[key] = metrics.get(key, 0.0) + float(value)
    assert total is not None  # rows is never empty
    for key in routed_metric_keys(algorithm):
        metrics.setdefault(key, 0.0)
    return total, metrics


def routed_metric_keys(algorithm: Any) -> tuple[str, ...]:
    """The metrics some teacher's path reports and another's may not: every micro-batch reports them all.

    Under torchrun the ranks sum their metrics as one list in key order, so a rank whose rows all went to a
    same-tokenizer teacher must still report the cross-tokenizer path's ``cross/full_share`` (as 0: none of
    its tokens took that path) when a rank beside it scored rows with a teacher of another tokenizer."""
    from agentgym_opd.cross_tokenizer import FULL_SHARE_METRIC

    cross = getattr(algorithm, "cross_teachers", {}) or {}
    return (FULL_SHARE_METRIC,) if any(c is not None for c in cross.values()) else ()
