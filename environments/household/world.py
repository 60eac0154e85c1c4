"""The household world: state, the admissible commands of a state, and the transition function.

One `World` is one generated room. Everything is integer-indexed (receptacle ids, object ids, state bits)
and every string the hot path needs is built once, because an RL rollout steps this millions of times:
`admissible()` is cached until the state changes, `go to` commands are precomputed per location, and a
command is a small tuple `(op, a, b)` that the env finds by a dict lookup from the admissible text.

The receptacles stand in a ring around the room in the order the first observation lists them, and
arriving at (or opening) a receptacle names its neighbour ("Next to it, you see the countertop 1."): the
one fact an agent needs to search the room without remembering the whole listing, so an observable
search policy is learnable by a small model.

Semantics follow ALFWorld's TextWorld PDDL: the agent is at one receptacle (or in the middle of the room
at the start); an openable receptacle's contents are visible, and can be taken from or put into, only
while it is open; the agent holds at most one object; `heat`/`cool`/`clean` need the agent at a
microwave/fridge/sink basin holding an object that can be treated so (heating removes cold and cooling
removes heat); `use` turns on a desk lamp at the agent's location. Nothing else changes the world:
`examine`, `look` and `inventory` only describe it.
"""

from __future__ import annotations

from environments.household.scenes import APPLIANCE_FOR, STATE_WORD

# Command opcodes. A command is (op, a, b): a/b are receptacle or object ids (-1 where unused).
GOTO, OPEN, CLOSE, TAKE, PUT, HEAT, COOL, CLEAN_OP, USE, EXAMINE_R, EXAMINE_O, LOOK, INVENTORY = range(13)
TREAT_OPS = {"heat": HEAT, "cool": COOL, "clean": CLEAN_OP}
TREAT_BIT = {HEAT: APPLIANCE_FOR["heat"][0], COOL: APPLIANCE_FOR["cool"][0], CLEAN_OP: APPLIANCE_FOR["clean"][0]}
TREAT_VERB = {HEAT: "heat", COOL: "cool", CLEAN_OP: "clean"}
HELD = -1  # object location meaning "in the agent's hand"
MIDDLE = -1  # agent location at the start: the middle of the room

WELCOME = "-= Welcome to TextWorld, ALFRED! =-"


def list_items(items: list[str]) -> str:
    """ALFWorld's enumeration: 'nothing', 'a apple 1', 'a apple 1, and a mug 2', 'a x, a y, and a z'."""
    if not items:
        return "nothing"
    if len(items) == 1:
        return items[0]
    return ", ".join(items[:-1]) + ", and " + items[-1]


class World:
    """Mutable state of one room plus the precomputed strings and lookups of its fixed layout."""

    __slots__ = (
        "scene", "r_names", "r_types", "r_openable", "r_prep", "r_appliance", "r_index",
        "o_names", "o_types", "o_can", "o_fixed", "o_article", "o_index",
        "r_open", "contents", "o_loc", "o_state", "o_on", "loc", "held", "version",
        "_adm", "_goto", "_look_middle",
    )

    def __init__(self, scene: str, receptacles: list[tuple[str, str, bool, str]],
                 objects: list[tuple[str, str, int, bool, int]], open_at_start: set[int] | None = None):
        """`receptacles`: (name, type, openable, prep); `objects`: (name, type, can_bits, fixed, receptacle id)."""
        self.scene = scene
        self.r_names = [r[0] for r in receptacles]
        self.r_types = [r[1] for r in receptacles]
        self.r_openable = [r[2] for r in receptacles]
        self.r_prep = [r[3] for r in receptacles]
        verb_of = {kind: verb for verb, (_, kind) in APPLIANCE_FOR.items()}
        self.r_appliance = [TREAT_OPS[verb_of[t]] if t in verb_of else -1 for t in self.r_types]
        self.r_index = {n: i for i, n in enumerate(self.r_names)}
        self.o_names = [o[0] for o in objects]
        self.o_types = [o[1] for o in objects]
        self.o_can = [o[2] for o in objects]
        self.o_fixed = [o[3] for o in objects]
        self.o_article = ["a " + n for n in self.o_names]
        self.o_index = {n: i for i, n in enumerate(self.o_names)}
        opened = open_at_start or set()
        self.r_open = [(not op) or (i in opened) for i, op in enumerate(self.r_openable)]
        self.o_loc = [o[4] for o in objects]
        self.o_state = [0] * len(objects)
        self.o_on = [False] * len(objects)
        self.contents: list[list[int]] = [[] for _ in receptacles]
        for oid, rid in enumerate(self.o_loc):
            self.contents[rid].append(oid)
        self.loc = MIDDLE
        self.held = -1
        self.version = 0
        self._adm: dict[str, tuple[int, int, int]] | None = None
        self._goto: dict[int, dict[str, tuple[int, int, int]]] = {}
        self._look_middle = (
            "You are in the middle of a room. Looking quickly around you, you see "
            + list_items(["a " + n for n in self.r_names]) + "."
        )

    # ------------------------------------------------------------------ snapshots (for the planner)
    def snapshot(self) -> tuple:
        """A hashable copy of the mutable state (contents order aside, which only affects wording)."""
        return (self.loc, self.held, tuple(self.r_open), tuple(self.o_loc), tuple(self.o_state), tuple(self.o_on))

    def restore(self, snap: tuple) -> None:
        self.loc, self.held = snap[0], snap[1]
        self.r_open = list(snap[2])
        self.o_loc = list(snap[3])
        self.o_state = list(snap[4])
        self.o_on = list(snap[5])
        contents: list[list[int]] = [[] for _ in self.r_names]
        for oid, rid in enumerate(self.o_loc):
            if rid >= 0:
                contents[rid].append(oid)
        self.contents = contents
        self._adm = None
        self.version += 1

    # ------------------------------------------------------------------ admissible commands
    def goto_commands(self, loc: int) -> dict[str, tuple[int, int, int]]:
        """'go to X' for every receptacle but the current one (built once per location)."""
        table = self._goto.get(loc)
        if table is None:
            table = {"go to " + n: (GOTO, i, -1) for i, n in enumerate(self.r_names) if i != loc}
            self._goto[loc] = table
        return table

    def local_commands(self) -> list[tuple[str, tuple[int, int, int]]]:
        """The commands that depend on where the agent is and what it holds (everything but 'go to')."""
        out: list[tuple[str, tuple[int, int, int]]] = []
        loc, held = self.loc, self.held
        if loc >= 0:
            name = self.r_names[loc]
            visible = self.r_open[loc]
            if self.r_openable[loc]:
                out.append((("close " if visible else "open ") + name, (CLOSE if visible else OPEN, loc, -1)))
            if visible:
                names, fixed = self.o_names, self.o_fixed
                for oid in self.contents[loc]:
                    if fixed[oid]:
                        if not self.o_on[oid]:
                            out.append(("use " + names[oid], (USE, oid, -1)))
                    elif held < 0:
                        out.append((f"take {names[oid]} from {name}", (TAKE, oid, loc)))
                if held >= 0:
                    out.append((f"put {self.o_names[held]} in/on {name}", (PUT, held, loc)))
            op = self.r_appliance[loc]
            if op >= 0 and held >= 0 and self.o_can[held] & TREAT_BIT[op]:
                out.append((f"{TREAT_VERB[op]} {self.o_names[held]} with {name}", (op, held, loc)))
            out.append(("examine " + name, (EXAMINE_R, loc, -1)))
        if held >= 0:
            out.append(("examine " + self.o_names[held], (EXAMINE_O, held, -1)))
        out.append(("inventory", (INVENTORY, -1, -1)))
        out.append(("look", (LOOK, -1, -1)))
        return out

    def admissible(self) -> dict[str, tuple[int, int, int]]:
        """Admissible command text -> command, cached until the next state change. Do not mutate."""
        adm = self._adm
        if adm is None:
            adm = dict(self.goto_commands(self.loc))
            adm.update(self.local_commands())
            self._adm = adm
        return adm

    # ------------------------------------------------------------------ transition
    def apply(self, cmd: tuple[int, int, int]) -> None:
        """Apply an admissible command (the caller checked it is admissible). No text is built."""
        op, a, b = cmd
        if op >= LOOK or op == EXAMINE_R or op == EXAMINE_O:
            return
        if op == GOTO:
            self.loc = a
        elif op == OPEN:
            self.r_open[a] = True
        elif op == CLOSE:
            self.r_open[a] = False
        elif op == TAKE:
            self.contents[b].remove(a)
            self.o_loc[a] = HELD
            self.held = a
        elif op == PUT:
            self.contents[b].append(a)
            self.o_loc[a] = b
            self.held = -1
        elif op == USE:
            self.o_on[a] = True
        else:  # HEAT / COOL / CLEAN
            state = self.o_state[a]
            if op == HEAT:
                state = (state | TREAT_BIT[HEAT]) & ~TREAT_BIT[COOL]
            elif op == COOL:
                state = (state | TREAT_BIT[COOL]) & ~TREAT_BIT[HEAT]
            else:
                state |= TREAT_BIT[CLEAN_OP]
            self.o_state[a] = state
        self._adm = None
        self.version += 1

    def execute(self, cmd: tuple[int, int, int]) -> str:
        """Apply an admissible command and return ALFWorld's observation for it."""
        self.apply(cmd)
        op, a, b = cmd
        if op == GOTO:
            return f"You arrive at {self.r_names[a]}. {self.view(a)} {self.next_to(a)}"
        if op == TAKE:
            return f"You pick up the {self.o_names[a]} from the {self.r_names[b]}."
        if op == PUT:
            return f"You put the {self.o_names[a]} {self.r_prep[b]} the {self.r_names[b]}."
        if op == OPEN:
            return f"You open the {self.r_names[a]}. {self.view(a)} {self.next_to(a)}"
        if op == CLOSE:
            return f"You close the {self.r_names[a]}."
        if op == HEAT or op == COOL or op == CLEAN_OP:
            return f"You {TREAT_VERB[op]} the {self.o_names[a]} using the {self.r_names[b]}."
        if op == USE:
            return f"You turn on the {self.o_names[a]}."
        if op == EXAMINE_R:
            return self.view(a)
        if op == EXAMINE_O:
            return self.describe_object(a)
        if op == INVENTORY:
            return self.inventory()
        return self.look()

    # ------------------------------------------------------------------ descriptions
    def view(self, rid: int) -> str:
        """What the agent sees of a receptacle it stands at (contents only if open or not openable)."""
        name = self.r_names[rid]
        if self.r_openable[rid]:
            if not self.r_open[rid]:
                return f"The {name} is closed."
            art = self.o_article
            return f"The {name} is open. In it, you see {list_items([art[o] for o in self.contents[rid]])}."
        art = self.o_article
        return f"On the {name}, you see {list_items([art[o] for o in self.contents[rid]])}."

    def describe_object(self, oid: int) -> str:
        words = [w for bit, w in STATE_WORD.items() if self.o_state[oid] & bit]
        if not words:
            return f"There's nothing special about {self.o_names[oid]}."
        return f"The {self.o_names[oid]} is {' and '.join(words)}."

    def inventory(self) -> str:
        held = self.held
        return "You are not carrying anything." if held < 0 else f"You are carrying: {self.o_article[held]}."

    def look(self) -> str:
        if self.loc < 0:
            return self._look_middle
        return f"You are facing the {self.r_names[self.loc]}. {self.next_to(self.loc)}"

    def neighbour(self, rid: int) -> int:
        """The next receptacle around the ring (listing order, wrapping round)."""
        return (rid + 1) % len(self.r_names)

    def next_to(self, rid: int) -> str:
        return f"Next to it, you see the {self.r_names[self.neighbour(rid)]}."

    def where_is(self, oid: int) -> str:
        """Plain-words location of an object, for feedback ('in your hand', 'in cabinet 2')."""
        rid = self.o_loc[oid]
        return "in your hand" if rid == HELD else f"{self.r_prep[rid]} {self.r_names[rid]}"
