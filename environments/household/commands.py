"""Reading agent commands: spelling variants that mean an admissible command, and why others fail.

Only the slow path lands here: the env first looks the exact text up in the admissible table. Variants
accepted as the same command (and not listed separately in `admissible_actions`, which stays ALFWorld's
canonical list): any letter case and spacing, a trailing full stop, "put X in Y" / "put X on Y" for
ALFWorld's "put X in/on Y", "take X" when X is visible at the current receptacle, "goto X", "i"/"inv".
Anything else is an `invalid_action` whose message says what is wrong in this state.
"""

from __future__ import annotations

import re

from environments.household.world import HELD, World

_SPACES = re.compile(r"\s+")
COMMAND_HELP = (
    "Commands: go to X, open X, close X, take O from X, put O in/on X, heat O with X, cool O with X, "
    "clean O with X, use O, examine X, look, inventory."
)


def as_sentence(text: str) -> str:
    """``text`` capitalised and ending in exactly one full stop: a reason that already ends a sentence (the
    unknown-verb one ends with COMMAND_HELP's own period) gets none added, which read "inventory.. The"."""
    text = text.strip()
    if not text:
        return text
    text = text[0].upper() + text[1:]
    return text if text.endswith((".", "!", "?")) else text + "."


def normalise(text: str) -> str:
    text = _SPACES.sub(" ", text.strip().lower()).rstrip(".!")
    return text.strip().strip("'\"`").strip()


def resolve(world: World, text: str) -> tuple[int, int, int] | None:
    """The admissible command a variant spelling means, or None."""
    adm = world.admissible()
    norm = normalise(text)
    cmd = adm.get(norm)
    if cmd is not None:
        return cmd
    m = re.fullmatch(r"put (.+?) (?:in|on|into|onto|in/on) (.+)", norm)
    if m:
        return adm.get(f"put {m.group(1)} in/on {m.group(2)}")
    if norm.startswith("goto "):
        return adm.get("go to " + norm[5:])
    if norm in ("i", "inv"):
        return adm.get("inventory")
    m = re.fullmatch(r"take (.+)", norm)
    if m and " from " not in norm and world.loc >= 0:
        return adm.get(f"take {m.group(1)} from {world.r_names[world.loc]}")
    return None


def explain(world: World, text: str) -> str:
    """Why `text` is not a valid command right now (one sentence a model can act on)."""
    norm = normalise(text)
    here = world.r_names[world.loc] if world.loc >= 0 else None
    where = f"you are at {here}" if here else "you are in the middle of the room"

    def receptacle(name: str) -> int | None:
        return world.r_index.get(name)

    def obj(name: str) -> int | None:
        return world.o_index.get(name)

    def unknown_receptacle(name: str) -> str:
        return f"there is no receptacle called '{name}' here (the first observation lists them)"

    m = re.fullmatch(r"go to (.+)", norm)
    if m:
        r = receptacle(m.group(1))
        if r is None:
            return unknown_receptacle(m.group(1))
        return f"you are already at {m.group(1)}"
    m = re.fullmatch(r"(open|close) (.+)", norm)
    if m:
        verb, name = m.groups()
        r = receptacle(name)
        if r is None:
            return unknown_receptacle(name)
        if not world.r_openable[r]:
            return f"the {name} cannot be opened or closed"
        if world.loc != r:
            return f"you must go to {name} first ({where})"
        return f"the {name} is already {'open' if verb == 'open' else 'closed'}"
    m = re.fullmatch(r"take (.+?) from (.+)", norm)
    if m:
        oname, rname = m.groups()
        o, r = obj(oname), receptacle(rname)
        if r is None:
            return unknown_receptacle(rname)
        if world.loc != r:
            return f"you must go to {rname} first ({where})"
        if not world.r_open[r]:
            return f"the {rname} is closed; open it first"
        if o is None or world.o_loc[o] != r:
            return f"you see no {oname} in the {rname}"
        if world.o_fixed[o]:
            return f"the {oname} cannot be picked up (try 'use {oname}')"
        return f"you are already holding {world.o_names[world.held]}; put it down first (one object at a time)"
    m = re.fullmatch(r"put (.+?) (?:in/on|in|on|into|onto) (.+)", norm)
    if m:
        oname, rname = m.groups()
        o, r = obj(oname), receptacle(rname)
        if o is None or world.o_loc[o] != HELD:
            held = world.o_names[world.held] if world.held >= 0 else "nothing"
            return f"you are not holding {oname} (you are holding {held})"
        if r is None:
            return unknown_receptacle(rname)
        if world.loc != r:
            return f"you must go to {rname} first ({where})"
        return f"the {rname} is closed; open it first"
    m = re.fullmatch(r"(heat|cool|clean) (.+?) with (.+)", norm)
    if m:
        verb, oname, rname = m.groups()
        needs = {"heat": "microwave", "cool": "fridge", "clean": "sinkbasin"}[verb]
        o, r = obj(oname), receptacle(rname)
        if r is None:
            return unknown_receptacle(rname)
        if world.r_types[r] != needs:
            return f"you can {verb} things only with a {needs}"
        if o is None or world.o_loc[o] != HELD:
            return f"you must be holding {oname} to {verb} it"
        if world.loc != r:
            return f"you must go to {rname} first ({where})"
        return f"the {oname} cannot be {'heated' if verb == 'heat' else verb + 'ed'}"
    m = re.fullmatch(r"use (.+)", norm)
    if m:
        o = obj(m.group(1))
        if o is None or not world.o_fixed[o]:
            return f"'{m.group(1)}' is not something you can use here; lamps can be used"
        if world.o_on[o]:
            return f"the {m.group(1)} is already on"
        return f"you must be at the {m.group(1)} to use it ({where})"
    m = re.fullmatch(r"examine (.+)", norm)
    if m:
        return f"you can examine only the receptacle you are at or the object you hold ({where})"
    verb = norm.split(" ", 1)[0] if norm else ""
    return f"'{verb[:40]}' is not a command here. {COMMAND_HELP}"
