"""The six ALFWorld task types: their goal conditions, instructions, and what-went-wrong feedback.

A goal is (task type, object type, target), with target a receptacle name ("cabinet 1") for the five
placement types and the lamp type ("desklamp") for `look_at_obj_in_light`. Goal conditions (the units of
`score`) follow ALFWorld's PDDL goals:

* pick_and_place: an <obj> is in/on <target>;
* pick_{clean,heat,cool}_then_place: some <obj> is clean/hot/cool; a clean/hot/cool <obj> is in <target>;
* pick_two_obj_and_place: one <obj> is in <target>; two <obj>s are in <target>;
* look_at_obj_in_light: the agent holds an <obj>; a <lamp> at the agent's location is on.
"""

from __future__ import annotations

from dataclasses import dataclass

from environments.household.scenes import CLEAN, COOL, HOT, STATE_WORD
from environments.household.world import HELD, World

TASK_TYPES = (
    "pick_and_place",
    "look_at_obj_in_light",
    "pick_clean_then_place",
    "pick_heat_then_place",
    "pick_cool_then_place",
    "pick_two_obj_and_place",
)
REQUIRED_STATE = {"pick_clean_then_place": CLEAN, "pick_heat_then_place": HOT, "pick_cool_then_place": COOL}
TREATMENT_VERB = {CLEAN: "clean", HOT: "heat", COOL: "cool"}

_TEMPLATES = {
    "pick_and_place": ("put a {o} {p} {t}.", "put some {o} {p} {t}."),
    "look_at_obj_in_light": ("look at {o} under the {t}.", "examine the {o} with the {t}."),
    "pick_clean_then_place": ("put a clean {o} {p} {t}.", "clean some {o} and put it {p} {t}."),
    "pick_heat_then_place": ("put a hot {o} {p} {t}.", "heat some {o} and put it {p} {t}."),
    "pick_cool_then_place": ("put a cool {o} {p} {t}.", "cool some {o} and put it {p} {t}."),
    "pick_two_obj_and_place": ("put two {o} {p} {t}.", "find two {o} and put them {p} {t}."),
}
NUM_TEMPLATES = 2


@dataclass(frozen=True)
class Goal:
    task_type: str
    obj_type: str
    target: str  # receptacle name, or the lamp type for look_at_obj_in_light

    def instruction(self, prep: str, variant: int = 0) -> str:
        template = _TEMPLATES[self.task_type][variant % NUM_TEMPLATES]
        return template.format(o=self.obj_type, p=prep, t=self.target)


class GoalChecker:
    """A goal bound to one world: precomputed ids so that `check` is a few list lookups per step."""

    __slots__ = ("goal", "world", "objs", "target", "required", "count", "lamps", "_version", "_result")

    def __init__(self, goal: Goal, world: World):
        self.goal = goal
        self.world = world
        self.objs = [i for i, t in enumerate(world.o_types) if t == goal.obj_type and not world.o_fixed[i]]
        self.lamps = [i for i, t in enumerate(world.o_types) if t == goal.target and world.o_fixed[i]]
        self.target = world.r_index.get(goal.target, -1)
        self.required = REQUIRED_STATE.get(goal.task_type, 0)
        self.count = 2 if goal.task_type == "pick_two_obj_and_place" else 1
        self._version = -1
        self._result = (False, 0.0)
        if goal.task_type == "look_at_obj_in_light":
            if not self.lamps:
                raise ValueError(f"goal {goal} needs a {goal.target} in the world")
        elif self.target < 0:
            raise ValueError(f"goal {goal} names a receptacle the world lacks")
        if not self.objs:
            raise ValueError(f"goal {goal} needs a {goal.obj_type} in the world")

    def conditions(self) -> list[bool]:
        w = self.world
        if self.goal.task_type == "look_at_obj_in_light":
            holding = w.held in self.objs
            lit = any(w.o_on[l] and w.o_loc[l] == w.loc for l in self.lamps)
            return [holding, lit]
        req, types, state = self.required, w.o_types, w.o_state
        placed = sum(1 for o in w.contents[self.target] if types[o] == self.goal.obj_type and state[o] & req == req)
        if self.count == 2:
            return [placed >= 1, placed >= 2]
        if req:
            return [any(state[o] & req for o in self.objs), placed >= 1]
        return [placed >= 1]

    def wanted_in_view(self) -> str | None:
        """The name of the first thing in view that the task still needs, or None: with empty hands, a goal object
        in the open receptacle the agent stands at (not one already at the target); holding the object to look
        at, the lamp. The observable expert takes exactly this one."""
        w = self.world
        if w.loc < 0 or not w.r_open[w.loc]:
            return None
        if self.goal.task_type == "look_at_obj_in_light":
            if w.held in self.objs:
                wanted = self.lamps
            elif w.held < 0:
                wanted = self.objs
            else:
                return None
        elif w.held < 0 and w.loc != self.target:
            wanted = self.objs
        else:
            return None
        hit = next((o for o in w.contents[w.loc] if o in wanted), None)
        return None if hit is None else w.o_names[hit]

    def check(self) -> tuple[bool, float]:
        """(success, fraction of goal conditions met), cached per world version."""
        w = self.world
        if w.version != self._version:
            conds = self.conditions()
            self._result = (all(conds), sum(conds) / len(conds))
            self._version = w.version
        return self._result

    def explain(self) -> list[str]:
        """What is still unmet, in words a model can act on."""
        w, g = self.world, self.goal
        if self.check()[0]:
            return []
        if g.task_type == "look_at_obj_in_light":
            notes = []
            if w.held not in self.objs:
                held = f"you were holding {w.o_names[w.held]}" if w.held >= 0 else "you were holding nothing"
                notes.append(f"you had to hold a {g.obj_type} but {held}")
            if not any(w.o_on[l] and w.o_loc[l] == w.loc for l in self.lamps):
                if any(w.o_on[l] for l in self.lamps):
                    notes.append(f"the {g.target} was on, but you were not at it at the end")
                else:
                    notes.append(f"the {g.target} was never turned on (use it while holding the {g.obj_type})")
            return notes
        target = w.r_names[self.target]
        prep = w.r_prep[self.target]
        req = self.required
        in_target = [o for o in w.contents[self.target] if w.o_types[o] == g.obj_type]
        good = [o for o in in_target if w.o_state[o] & req == req]
        notes = []
        if req:
            word = STATE_WORD[req]
            for o in in_target:
                if o not in good:
                    notes.append(f"the {w.o_names[o]} was put {prep} {target} but it was not {word} "
                                 f"({TREATMENT_VERB[req]} it first)")
            treated = [o for o in self.objs if w.o_state[o] & req and o not in good]
            for o in treated:
                notes.append(f"the {w.o_names[o]} was {word} but ended {w.where_is(o)}, not {prep} {target}")
            if not in_target and not treated:
                touched = [o for o in self.objs if w.o_loc[o] == HELD]
                notes.append(f"no {g.obj_type} was made {word}" + (f" (you were holding {w.o_names[touched[0]]})"
                                                                  if touched else ""))
            return notes
        need = self.count - len(good)
        held_note = ""
        if w.held >= 0 and w.o_types[w.held] == g.obj_type:
            held_note = f"; you were still holding {w.o_names[w.held]}"
        if self.count == 2:
            notes.append(f"{len(good)} of 2 {g.obj_type}s were {prep} {target}{held_note}")
        else:
            notes.append(f"no {g.obj_type} was put {prep} {target}{held_note}")
        if need > 0 and w.held >= 0 and w.o_types[w.held] != g.obj_type:
            notes.append(f"you were holding {w.o_names[w.held]}, which is not a {g.obj_type}")
        return notes
