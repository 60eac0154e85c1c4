"""The observable expert: solves a task using only what the agent can see, the demonstrations SFT learns from.

The planner's walkthrough (`privileged["walkthrough"]`) walks straight to where a hidden object lies, which
no agent can observe: a model cloned on it memorises rooms and cannot generalise to new ones. This expert
acts as a careful person would, from the observations alone:

1. Search: from the first receptacle the first observation lists, always go to the neighbour the last
   observation named (opening closed receptacles), until a wanted object is seen that is not already at
   the target; take it there. The target is visited like any other place: skipping it would need the
   receptacle after the neighbour, which no single observation names, and a small model learns a search
   whose every step reads the latest observation far more easily.
2. Treat it if the goal asks (`heat`/`cool`/`clean` it with the first microwave/fridge/sink basin).
3. Bring it to the target (opening it if closed) and put it there; for two objects, search on (first going
   back to any place where a second one was already seen). For a look-in-light goal: holding the object,
   go to a place where a desk lamp was seen (or search on for one) and use it.

What it remembers is exactly what the agent was shown: the contents of each receptacle at the moment it
looked. Its action list is deterministic per task (`privileged["demonstration"]`), so it can be replayed
turn by turn like the walkthrough; the replay sees the same observations the expert decided on.
"""

from __future__ import annotations

from environments.household.goals import GoalChecker
from environments.household.world import (
    CLEAN_OP, COOL, GOTO, HEAT, OPEN, PUT, TAKE, TREAT_BIT, USE, World,
)

Command = tuple[int, int, int]
_TREAT_OP = {TREAT_BIT[HEAT]: HEAT, TREAT_BIT[COOL]: COOL, TREAT_BIT[CLEAN_OP]: CLEAN_OP}


class _Actor:
    """Plays commands on a world and records their texts."""

    def __init__(self, world: World, checker: GoalChecker, max_actions: int):
        self.world, self.checker, self.max_actions = world, checker, max_actions
        self.texts: list[str] = []

    def do(self, cmd: Command) -> None:
        w = self.world
        text = next(t for t, c in w.admissible().items() if c == cmd)
        self.texts.append(text)
        if len(self.texts) > self.max_actions:
            raise RuntimeError(f"observable expert exceeded {self.max_actions} actions on {self.checker.goal}")
        w.apply(cmd)

    def go_and_look(self, rid: int) -> None:
        w = self.world
        if w.loc != rid:
            self.do((GOTO, rid, -1))
        if not w.r_open[rid]:
            self.do((OPEN, rid, -1))

    def done(self) -> bool:
        return self.checker.check()[0]


def demonstration(world: World, checker: GoalChecker, max_actions: int = 80) -> list[str]:
    """The observable expert's action texts for the world's task (the world is left in its start state)."""
    return continuation(world, checker, max_actions)


def continuation(world: World, checker: GoalChecker, max_actions: int = 80) -> list[str]:
    """The observable expert's action texts from the world's current state, whoever brought it there.

    From the start state this is `demonstration`. From a state an agent reached (a student holding the wrong
    object, standing at a closed drawer, with an unheated mug already at the target) it is what the expert
    would do next: put down what the task does not need, search on from where the agent stands, treat what
    is not yet treated. That is the label of an imitation learner asked about a student's own states
    (DAgger). The world is left as it was."""
    start = world.snapshot()
    try:
        return _solve(_Actor(world, checker, max_actions))
    finally:
        world.restore(start)


def _solve(a: _Actor) -> list[str]:
    w, checker = a.world, a.checker
    goal_objs, lamps, target, required = set(checker.objs), set(checker.lamps), checker.target, checker.required

    def search(wanted: set[int], start: int) -> tuple[int, int]:
        """Walk the ring from `start` (opening closed receptacles) until a wanted object is in view (one already
        put at the target does not count, unless a full round found nothing else and it still lacks its
        treatment: an agent other than the expert put it there too early)."""
        cursor = start
        for _ in range(2 * len(w.r_names)):
            a.go_and_look(cursor)
            hit = next((o for o in w.contents[cursor] if o in wanted and cursor != target), None)
            if hit is not None:
                return hit, cursor
            cursor = w.neighbour(cursor)
        if target >= 0 and required:
            a.go_and_look(target)
            hit = next((o for o in w.contents[target] if o in wanted and w.o_state[o] & required != required), None)
            if hit is not None:
                return hit, target
        raise RuntimeError(f"observable expert walked the whole room without finding {checker.goal}")

    def put_down() -> None:
        """The hand holds what the task does not need: put it where the agent stands."""
        a.go_and_look(w.loc)
        a.do((PUT, w.held, w.loc))

    if checker.goal.task_type == "look_at_obj_in_light":
        if w.held >= 0 and w.held not in goal_objs:
            put_down()
        if w.held < 0:
            obj, _ = search(goal_objs, max(w.loc, 0))
            a.do((TAKE, obj, w.loc))
        at = w.loc
        lamp = next((o for o in w.contents[at] if o in lamps), None) if w.r_open[at] else None
        if lamp is None:
            lamp, at = search(lamps, w.neighbour(at))
        if not a.done():
            a.do((USE, lamp, -1))
        return a.texts

    treat = _TREAT_OP.get(required, -1)
    start = max(w.loc, 0)  # from the middle of the room: the first receptacle listed
    while not a.done():
        if w.held >= 0 and w.held not in goal_objs:
            put_down()
        if w.held < 0:
            obj, at = search(goal_objs, start)
            a.do((TAKE, obj, at))
            start = at  # a second object: back to where the first was found, then on around the ring
        obj = w.held
        if treat >= 0 and w.o_state[obj] & required != required:
            appliance = next(r for r, op in enumerate(w.r_appliance) if op == treat)
            if w.loc != appliance:
                a.do((GOTO, appliance, -1))
            a.do((treat, obj, appliance))
        a.go_and_look(target)
        a.do((PUT, obj, target))
    return a.texts
