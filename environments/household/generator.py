"""Deterministic generation of goals, worlds and tasks from (split, index).

Every task is a pure function of its split and index: `random.Random` seeded with a string (stable across
processes and Python versions, unlike `hash`). The goal is drawn from its own stream, before the world,
so `task_ids()` can list thousands of ids without building a single world, and the id spells the goal
out: ``<split>:<index>:<task type>:<object type>:<target>`` e.g.
``valid_unseen:42:pick_heat_then_place:potato:countertop_2``.

The task type is ``TASK_TYPES[index % 6]``, so every split is balanced over the six types and a
per-type view of a split is the subset of its indices with that remainder.

Splits. A *combination* is (object type, target type): the target receptacle type of a placement goal
("cabinet"), or the lamp type of a look-in-light goal ("desklamp"). A fixed fifth of all combinations,
chosen by a CRC of their names (`is_unseen_combination`), is held out: `train` and `valid_seen` draw
goals only from the other combinations (with different world seeds), `valid_unseen` only from the held-out
ones, so no valid_unseen goal pairs an object type with a target type that any train goal pairs.
"""

from __future__ import annotations

import random
import zlib
from functools import lru_cache

from environments.household.goals import REQUIRED_STATE, TASK_TYPES, Goal
from environments.household.scenes import APPLIANCE_FOR, LAMP, SCENES, STATE_WORD, Scene
from environments.household.world import World

SPLITS = ("train", "valid_seen", "valid_unseen")
DEFAULT_NUM_TASKS = {"train": 2000, "valid_seen": 200, "valid_unseen": 200}
HOLDOUT_MODULUS = 5  # one combination in five is held out for valid_unseen


def is_unseen_combination(obj_type: str, target_type: str) -> bool:
    return zlib.crc32(f"{obj_type}|{target_type}".encode()) % HOLDOUT_MODULUS == 0


def _appliance_kind(task_type: str) -> str | None:
    bit = REQUIRED_STATE.get(task_type)
    if bit is None:
        return None
    verb = {"clean": "clean", "hot": "heat", "cool": "cool"}[STATE_WORD[bit]]
    return APPLIANCE_FOR[verb][1]


@lru_cache(maxsize=None)
def combinations(task_type: str) -> tuple[tuple[str, str, str], ...]:
    """Every (scene, object type, target type) a goal of this type may have, in a stable order."""
    out = []
    for scene in SCENES.values():
        if task_type == "look_at_obj_in_light":
            if scene.has_lamp:
                out += [(scene.name, o.name, LAMP) for o in scene.objects]
            continue
        appliance = _appliance_kind(task_type)
        required = REQUIRED_STATE.get(task_type, 0)
        if appliance is not None and all(r.name != appliance for r in scene.receptacles):
            continue
        for obj in scene.objects:
            if obj.can & required != required:
                continue
            for rec in scene.receptacles:
                if rec.target and rec.name != appliance:
                    out.append((scene.name, obj.name, rec.name))
    return tuple(out)


@lru_cache(maxsize=None)
def split_combinations(task_type: str, split: str) -> tuple[tuple[str, str, str], ...]:
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; household splits are {', '.join(SPLITS)}")
    unseen = split == "valid_unseen"
    combos = tuple(c for c in combinations(task_type) if is_unseen_combination(c[1], c[2]) == unseen)
    if not combos:
        raise RuntimeError(f"no {split} combinations for {task_type}")
    return combos


class GoalDraw:
    """The goal part of a task: scene, goal, the target's receptacle count, instruction variant."""

    __slots__ = ("split", "index", "scene", "goal", "target_count", "variant")

    def __init__(self, split: str, index: int):
        rng = random.Random(f"household/{split}/{index}/goal")
        task_type = TASK_TYPES[index % len(TASK_TYPES)]
        scene_name, obj_type, target_type = rng.choice(split_combinations(task_type, split))
        scene = SCENES[scene_name]
        self.split, self.index, self.scene = split, index, scene
        if target_type == LAMP:
            self.target_count = 0
            target = LAMP
        else:
            kind = scene.receptacle(target_type)
            self.target_count = rng.randint(max(1, kind.min_count), kind.max_count)
            target = f"{target_type} {rng.randint(1, self.target_count)}"
        self.goal = Goal(task_type, obj_type, target)
        self.variant = rng.randrange(2)

    @property
    def task_id(self) -> str:
        g = self.goal
        return f"{self.split}:{self.index}:{g.task_type}:{g.obj_type}:{g.target.replace(' ', '_')}"


def build_world(draw: GoalDraw) -> World:
    """The room of a task: receptacle counts, closed containers, goal objects away from the target."""
    rng = random.Random(f"household/{draw.split}/{draw.index}/world")
    scene: Scene = draw.scene
    goal = draw.goal
    target_type = goal.target.split(" ")[0] if goal.target != LAMP else None
    receptacles: list[tuple[str, str, bool, str]] = []
    for kind in scene.receptacles:
        n = draw.target_count if kind.name == target_type else rng.randint(kind.min_count, kind.max_count)
        receptacles += [(f"{kind.name} {i}", kind.name, kind.openable, kind.prep) for i in range(1, n + 1)]
    names = [r[0] for r in receptacles]
    target_rid = names.index(goal.target) if target_type else -1
    opened = {i for i, r in enumerate(receptacles) if r[2] and rng.random() < 0.15}
    opened.discard(target_rid)

    objects: list[tuple[str, str, int, bool, int]] = []
    kinds = {o.name: o for o in scene.objects}
    away = [i for i in range(len(receptacles)) if i != target_rid]
    n_goal = rng.randint(2, 3) if goal.task_type == "pick_two_obj_and_place" else rng.randint(1, 3)
    for i in range(1, n_goal + 1):
        objects.append((f"{goal.obj_type} {i}", goal.obj_type, kinds[goal.obj_type].can, False, rng.choice(away)))
    others = [o for o in scene.objects if o.name != goal.obj_type]
    counts: dict[str, int] = {}
    for _ in range(rng.randint(5, 12)):
        kind = rng.choice(others)
        counts[kind.name] = counts.get(kind.name, 0) + 1
        objects.append((f"{kind.name} {counts[kind.name]}", kind.name, kind.can, False, rng.randrange(len(receptacles))))
    if scene.has_lamp:
        stands = [i for i, r in enumerate(receptacles) if r[1] in scene.lamp_on]
        objects.append((f"{LAMP} 1", LAMP, 0, True, rng.choice(stands)))
    return World(scene.name, receptacles, objects, opened)


def task_indices(num_tasks: int, task_types: tuple[str, ...] | None = None) -> list[int]:
    """Indices 0..num_tasks-1 of a split, restricted to the given task types (index % 6 is the type)."""
    if task_types is None:
        return list(range(num_tasks))
    wanted = {TASK_TYPES.index(t) for t in task_types}
    return [i for i in range(num_tasks) if i % len(TASK_TYPES) in wanted]
