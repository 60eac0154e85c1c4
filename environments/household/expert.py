"""The observable expert: solves a task using only what the agent can see, the demonstrations SFT learns from.

The planner's walkthrough (`privileged["walkthrough"]`) walks straight to where a hidden object lies, which
no agent can observe: a model cloned on it memorises rooms and cannot generalise to new ones. This expert
acts as a careful person would, from the observations alone:

1. Search: visit the receptacles in the order the first observation lists them (skipping the target, where
   no task places the object it must be brought to, and anywhere already seen), opening closed ones, until
   a wanted object is seen; take it there.
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
    """Plays commands on a world and records their texts and what each look revealed."""

    def __init__(self, world: World, checker: GoalChecker, max_actions: int):
        self.world, self.checker, self.max_actions = world, checker, max_actions
        self.texts: list[str] = []
        self.seen: dict[int, list[int]] = {}  # receptacle -> objects seen there at the last look

    def do(self, cmd: Command) -> None:
        w = self.world
        text = next(t for t, c in w.admissible().items() if c == cmd)
        self.texts.append(text)
        if len(self.texts) > self.max_actions:
            raise RuntimeError(f"observable expert exceeded {self.max_actions} actions on {self.checker.goal}")
        w.apply(cmd)
        if cmd[0] in (GOTO, OPEN) and w.r_open[w.loc]:
            self.seen[w.loc] = list(w.contents[w.loc])
        elif cmd[0] == TAKE:
            self.seen[cmd[2]] = [o for o in self.seen.get(cmd[2], []) if o != cmd[1]]
        elif cmd[0] == PUT:
            self.seen.setdefault(cmd[2], []).append(cmd[1])

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
    start = world.snapshot()
    try:
        return _solve(_Actor(world, checker, max_actions))
    finally:
        world.restore(start)


def _solve(a: _Actor) -> list[str]:
    w, checker = a.world, a.checker
    goal_objs, lamps, target = set(checker.objs), set(checker.lamps), checker.target
    order = [r for r in range(len(w.r_names)) if r != target]
    visited: set[int] = set()

    def find(wanted: set[int], *, exclude_at_target: bool = True) -> tuple[int, int] | None:
        """Where a wanted object was already seen, else search on; (object, receptacle) or None."""
        for rid, objs in a.seen.items():
            if exclude_at_target and rid == target:
                continue
            hit = next((o for o in objs if o in wanted), None)
            if hit is not None:
                return hit, rid
        for rid in order:
            if rid in visited:
                continue
            visited.add(rid)
            a.go_and_look(rid)
            hit = next((o for o in w.contents[rid] if o in wanted), None)
            if hit is not None:
                return hit, rid
        return None

    def fetch() -> int:
        found = find(goal_objs)
        if found is None:
            raise RuntimeError(f"observable expert found no {checker.goal.obj_type}")
        obj, rid = found
        a.go_and_look(rid)
        a.do((TAKE, obj, rid))
        return obj

    if checker.goal.task_type == "look_at_obj_in_light":
        fetch()
        found = find(lamps, exclude_at_target=False)
        if found is None:
            raise RuntimeError("observable expert found no lamp")
        lamp, rid = found
        if w.loc != rid:
            a.do((GOTO, rid, -1))
        a.do((USE, lamp, -1))
        return a.texts

    treat = _TREAT_OP.get(checker.required, -1)
    while not a.done():
        obj = fetch()
        if treat >= 0:
            appliance = next(r for r, op in enumerate(w.r_appliance) if op == treat)
            if w.loc != appliance:
                a.do((GOTO, appliance, -1))
            a.do((treat, obj, appliance))
        a.go_and_look(target)
        a.do((PUT, obj, target))
    return a.texts
