"""Exact shortest walkthroughs by breadth-first search over the world's own transition function.

The search is restricted to goal-relevant commands, which keeps it to a few hundred states while the
unrestricted state space (every object anywhere, every drawer open or shut) is astronomically large.
Why the restriction cannot lose optimality (`tests/test_household.py` also checks it against an
unrestricted BFS on small worlds): no goal condition and no precondition depends on anything the
restriction leaves out. Closing never enables a command; describing (`look`, `examine`, `inventory`)
changes nothing; an object that is not of the goal type never has to move, because the hand is the only
shared resource and a shortest plan never picks up what it need not; going to, or opening, a receptacle
that neither holds a goal object, nor is the target, an appliance the goal needs, or a lamp's place, is
a wasted turn; and a goal object already in the target in the required state need not be taken out.
Removing such commands from any plan leaves a plan that is still executable and no longer.
"""

from __future__ import annotations

from typing import Callable

from environments.household.goals import GoalChecker
from environments.household.world import (
    CLEAN_OP, COOL, GOTO, HEAT, OPEN, PUT, TAKE, TREAT_BIT, USE, World,
)

Command = tuple[int, int, int]


def bfs(world: World, checker: GoalChecker, expand: Callable[[World], list[Command]],
        max_states: int = 2_000_000) -> list[Command] | None:
    """Shortest command sequence from the world's current state to the goal (None if unreachable).

    The world is left in its starting state.
    """
    start = world.snapshot()
    if checker.check()[0]:
        return []
    parents: dict[tuple, tuple[tuple, Command] | None] = {start: None}
    frontier = [start]
    try:
        while frontier:
            next_frontier = []
            for state in frontier:
                world.restore(state)
                for cmd in expand(world):
                    world.restore(state)
                    world.apply(cmd)
                    child = world.snapshot()
                    if child in parents:
                        continue
                    parents[child] = (state, cmd)
                    if checker.check()[0]:
                        return _path(parents, child)
                    next_frontier.append(child)
                if len(parents) > max_states:
                    raise RuntimeError(f"planner gave up after {len(parents)} states")
            frontier = next_frontier
        return None
    finally:
        world.restore(start)


def _path(parents: dict, state: tuple) -> list[Command]:
    cmds: list[Command] = []
    while parents[state] is not None:
        state, cmd = parents[state]
        cmds.append(cmd)
    return cmds[::-1]


def relevant_expander(checker: GoalChecker) -> Callable[[World], list[Command]]:
    """The goal-relevant commands of a state (see the module docstring for why this is enough)."""
    w = checker.world
    goal_objs = set(checker.objs)
    lamps = set(checker.lamps)
    target, required = checker.target, checker.required
    treat_op = {TREAT_BIT[op]: op for op in (HEAT, COOL, CLEAN_OP)}.get(required, -1)
    places = {w.o_loc[o] for o in goal_objs} | {w.o_loc[l] for l in lamps}
    if target >= 0:
        places.add(target)
    if treat_op >= 0:
        places |= {r for r, op in enumerate(w.r_appliance) if op == treat_op}
    places.discard(-1)
    places_sorted = sorted(places)

    def expand(world: World) -> list[Command]:
        loc = world.loc
        cmds: list[Command] = [(GOTO, r, -1) for r in places_sorted if r != loc]
        for _, cmd in world.local_commands():
            op, a, b = cmd
            if op == OPEN:
                ok = a in places
            elif op == TAKE:
                ok = a in goal_objs and not (b == target and world.o_state[a] & required == required)
            elif op == PUT:
                ok = b == target
            elif op == USE:
                ok = a in lamps
            elif op == treat_op:
                ok = a in goal_objs
            else:
                ok = False
            if ok:
                cmds.append(cmd)
        return cmds

    return expand


def all_commands(world: World) -> list[Command]:
    """Every admissible command (for the unrestricted reference search)."""
    return list(world.admissible().values())


def plan(world: World, checker: GoalChecker) -> list[str]:
    """The shortest walkthrough as command texts, replayable through the env."""
    cmds = bfs(world, checker, relevant_expander(checker))
    if cmds is None:
        raise RuntimeError(f"no plan reaches {checker.goal}")
    return render(world, cmds)


def render(world: World, cmds: list[Command]) -> list[str]:
    """Texts of a command sequence, found by replaying it (leaves the world where it started)."""
    start = world.snapshot()
    texts = []
    try:
        for cmd in cmds:
            text = next(t for t, c in world.admissible().items() if c == cmd)
            texts.append(text)
            world.apply(cmd)
    finally:
        world.restore(start)
    return texts
