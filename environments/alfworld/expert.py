"""An observable expert for ALFWorld: solves a game from what the agent sees, the demonstrations SFT learns from.

ALFWorld's walkthrough (`privileged["walkthrough"]`) is its planner's plan: it walks straight to where a hidden
object lies, which no agent can observe, so a model cloned on it learns to guess rooms, not to search. This
expert acts as a careful person would, reading only the observations (as `environments.household.expert` does
for the household world):

1. Read the goal sentence (`parse_goal`: the object, the receptacle type, a treatment, one or two objects, or
   a look-in-the-lamplight goal) and the receptacles the first observation lists.
2. Search: go to the receptacles one by one (opening closed ones) until a wanted object is in view, then take
   it. The order is a prior over where objects of that kind usually lie (`LocationPrior`: counts over the
   train split's start states, i.e. experience of other games, like a person's knowledge that apples are
   kept in fridges), never where this game's object is: the search itself stays observation-driven.
3. Treat it where the goal asks (heat with the microwave, cool with the fridge, clean at the sink basin),
   bring it to a receptacle of the target type (opening it if closed) and put it there; for two objects,
   search on (a second one already seen is fetched first). For a look-in-light goal: holding the object, go
   to where a desk lamp was seen (or search on for one) and use it.

The expert is a pure function of the history it has observed (`ObservableExpert.observe` for each turn,
`next_action` for the next command), so it can take over from any state an agent reached, replaying the
agent's own history first: the label an imitation learner asks about a student's states (DAgger).
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable

# the appliance each treatment needs (ALFWorld's PDDL: heat with a microwave, cool with a fridge, clean in a
# sink basin) and the lamp a look-in-light goal names
APPLIANCE = {"heat": "microwave", "cool": "fridge", "clean": "sinkbasin"}
_ADJECTIVE = {"hot": "heat", "cool": "cool", "clean": "clean"}
_ART = r"(?:a|an|some|the)"
_GOAL_FORMS: tuple[tuple[re.Pattern, str], ...] = (
    (re.compile(rf"^(?:look at|examine) (?:{_ART} )?(?P<obj>\w+) (?:under|with) (?:{_ART} )?(?P<lamp>\w+)$"),
     "look_at_obj_in_light"),
    (re.compile(rf"^put {_ART} (?P<adj>hot|cool|clean) (?P<obj>\w+) (?:in|on) (?P<target>\w+)$"), "treat"),
    (re.compile(rf"^(?P<verb>heat|cool|clean) {_ART} (?P<obj>\w+) and put it (?:in|on) (?P<target>\w+)$"), "treat"),
    (re.compile(r"^(?:put two (?P<obj>\w+)|find two (?P<obj2>\w+) and put them) (?:in|on) (?P<target>\w+)$"),
     "pick_two_obj_and_place"),
    (re.compile(rf"^put {_ART} (?P<obj>\w+) (?:in|on) (?P<target>\w+)$"), "pick_and_place_simple"),
)
_TREAT_TYPE = {"heat": "pick_heat_then_place_in_recep", "cool": "pick_cool_then_place_in_recep",
               "clean": "pick_clean_then_place_in_recep"}
_NAME = re.compile(r"\b(?:a|an) ([a-z]+ \d+)")
_SEEN = re.compile(r"you see (.*?)\.(?:\s|$)", re.IGNORECASE)


class GoalParseError(ValueError):
    """The goal sentence is none of ALFWorld's task templates."""


@dataclass(frozen=True)
class Goal:
    """What a goal sentence asks: ``count`` objects of kind ``obj`` (treated by ``treatment`` if set) in a
    receptacle of kind ``target``, or, for ``look_at_obj_in_light``, ``obj`` held under a ``lamp``."""

    task_type: str
    obj: str
    target: str | None = None
    treatment: str | None = None
    count: int = 1
    lamp: str | None = None


def parse_goal(sentence: str) -> Goal:
    """The structured goal of an ALFWorld task sentence ("heat some egg and put it in garbagecan.")."""
    text = " ".join(sentence.lower().strip().rstrip(".").split())
    for pattern, kind in _GOAL_FORMS:
        m = pattern.match(text)
        if m is None:
            continue
        parts = m.groupdict()
        if kind == "look_at_obj_in_light":
            return Goal(kind, parts["obj"], lamp=parts["lamp"])
        if kind == "treat":
            treatment = parts.get("verb") or _ADJECTIVE[parts["adj"]]
            return Goal(_TREAT_TYPE[treatment], parts["obj"], parts["target"], treatment)
        if kind == "pick_two_obj_and_place":
            return Goal(kind, parts["obj"] or parts["obj2"], parts["target"], count=2)
        return Goal(kind, parts["obj"], parts["target"])
    raise GoalParseError(f"not an ALFWorld goal sentence: {sentence[:200]!r} (expected e.g. 'put a clean mug in "
                         "coffeemachine.', 'find two book and put them in desk.', 'look at cd under the desklamp.')")


def kind_of(name: str) -> str:
    """'cabinet 12' -> 'cabinet'."""
    return name.rsplit(" ", 1)[0]


def listed_names(text: str) -> list[str]:
    """The '<kind> <n>' names of a listing ("a bed 2, a desk 1, and a shelf 1")."""
    return _NAME.findall(text)


# ---------------------------------------------------------------------------------------------- search prior
@dataclass(frozen=True)
class LocationPrior:
    """Where objects of a kind lie at the start of a game, from a split's PDDL start states.

    ``hits[obj][rec]`` counts receptacles of kind ``rec`` that held an ``obj`` at the start of a game that had
    one; ``seen[obj][rec]`` counts all receptacles of kind ``rec`` in those games. Their smoothed ratio is the
    chance that one receptacle of that kind holds the object; ``openable`` kinds cost a second step to look
    in. Searching in decreasing chance per step is the greedy order for boxes searched one at a time."""

    hits: dict[str, dict[str, int]]
    seen: dict[str, dict[str, int]]
    openable: frozenset[str]

    def score(self, obj: str, receptacle_kind: str) -> float:
        hits, seen = self.hits.get(obj), self.seen.get(obj)
        if not seen:  # an object kind the split never had: what any object's odds are
            hits, seen = self.hits.get("*", {}), self.seen.get("*", {})
        chance = (hits.get(receptacle_kind, 0) + 0.1) / (seen.get(receptacle_kind, 0) + 1.0)
        return chance / (2.0 if receptacle_kind in self.openable else 1.0)

    def order(self, receptacles: Iterable[str], obj: str) -> list[str]:
        """The receptacles by decreasing chance per step of holding an ``obj``; ties keep the listed order."""
        listed = list(receptacles)
        return sorted(listed, key=lambda r: (-self.score(obj, kind_of(r)), listed.index(r)))


UNIFORM_PRIOR = LocationPrior({}, {}, frozenset())  # every receptacle alike: the listed order


_PDDL_FACT = re.compile(r"\((objectType|receptacleType|inReceptacle) ([^\s()]+) ([^\s()]+)\)")
_PDDL_OPENABLE = re.compile(r"\(openable ([^\s()]+)\)")


def _start_state(pddl_problem: str) -> tuple[dict[str, str], dict[str, str], list[tuple[str, str]], set[str]]:
    """(object -> kind, receptacle -> kind, (object, receptacle) containment, openable) of a PDDL problem."""
    objects, receptacles, contained = {}, {}, []
    for fact, a, b in _PDDL_FACT.findall(pddl_problem):
        if fact == "objectType":
            objects[a] = b.removesuffix("Type").lower()
        elif fact == "receptacleType":
            receptacles[a] = b.removesuffix("Type").lower()
        else:
            contained.append((a, b))
    return objects, receptacles, contained, set(_PDDL_OPENABLE.findall(pddl_problem))


def prior_from_games(game_files: Iterable[Path]) -> LocationPrior:
    """Count the start states of ``game_files`` (``game.tw-pddl``) into a `LocationPrior`."""
    hits: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    seen: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    openable_kinds: set[str] = set()
    for path in game_files:
        objects, receptacles, contained, openable = _start_state(json.loads(Path(path).read_text())["pddl_problem"])
        openable_kinds |= {receptacles[r] for r in openable if r in receptacles}
        kinds_here = defaultdict(int)
        for kind in receptacles.values():
            kinds_here[kind] += 1
        for obj in set(objects.values()) | {"*"}:
            for kind, n in kinds_here.items():
                seen[obj][kind] += n
        # a receptacle counts once per object kind it holds (and once for '*' if it holds anything)
        per_receptacle = {(objects[o], r) for o, r in contained if o in objects and r in receptacles}
        for obj, r in per_receptacle:
            hits[obj][receptacles[r]] += 1
        for r in {r for _, r in per_receptacle}:
            hits["*"][receptacles[r]] += 1
    return LocationPrior({k: dict(v) for k, v in hits.items()}, {k: dict(v) for k, v in seen.items()},
                         frozenset(openable_kinds))


@lru_cache(maxsize=4)
def train_prior(split_dir: str) -> LocationPrior:
    """The `LocationPrior` of a split's games (the train split: the expert may know other games, not this one)."""
    files = sorted(Path(split_dir).glob("*/*/game.tw-pddl"))
    if not files:
        raise FileNotFoundError(f"no ALFWorld games (*/*/game.tw-pddl) under {split_dir}: the search prior is "
                                "counted over the train split's games")
    return prior_from_games(files)


# ---------------------------------------------------------------------------------------------- the expert
@dataclass
class ObservableExpert:
    """The expert's memory of one game, built only from what the agent was shown, and its next command."""

    goal: Goal
    receptacles: list[str]
    prior: LocationPrior = UNIFORM_PRIOR
    location: str | None = None
    holding: str | None = None
    contents: dict[str, list[str]] = field(default_factory=dict)  # as last seen
    closed: set[str] = field(default_factory=set)
    looked_in: set[str] = field(default_factory=set)  # receptacles whose contents were seen
    placed: list[str] = field(default_factory=list)  # wanted objects put in a target receptacle, in order
    placed_in: str | None = None
    treated: set[str] = field(default_factory=set)
    beside: dict[str, set[str]] = field(default_factory=dict)  # receptacles found to share a spot

    @classmethod
    def start(cls, first_observation: str, goal_sentence: str | None = None, prior: LocationPrior = UNIFORM_PRIOR
              ) -> "ObservableExpert":
        """The expert at a game's start: the receptacles the first observation lists and the goal it states."""
        sentence = goal_sentence
        if sentence is None:
            m = re.search(r"Your task is to:\s*(.+)", first_observation)
            if m is None:
                raise GoalParseError("the first observation states no task ('Your task is to: ...')")
            sentence = m.group(1)
        room = first_observation.split("Your task is to:")[0]
        return cls(parse_goal(sentence), listed_names(room), prior)

    # ------------------------------------------------------------------ memory
    def observe(self, action: str, observation: str) -> None:
        """Update the memory with one turn: the command sent and the observation it got."""
        obs = observation.strip()
        if obs.startswith("Nothing happens"):
            # ALFWorld keeps some receptacles at one spot (shelf 1 beside shelf 2): "go to" the other one is
            # refused where the agent stands, and it is looked at with "examine" instead
            if (m := re.fullmatch(r"go to ([a-z]+ \d+)", action.strip())) and self.location is not None:
                self.beside.setdefault(self.location, set()).add(m.group(1))
                self.beside.setdefault(m.group(1), set()).add(self.location)
            return
        if m := re.match(r"You arrive at ([a-z]+ \d+)\.", obs):
            self.location = m.group(1)
            self._look(obs, self.location)
        elif m := re.match(r"You open the ([a-z]+ \d+)\.", obs):
            self.closed.discard(m.group(1))
            self._look(obs, m.group(1))
        elif (m := re.match(r"(?:On|In) the ([a-z]+ \d+), you see", obs)) or (
                m := re.match(r"The ([a-z]+ \d+) is closed\.", obs)):  # "examine <receptacle>"
            self._look(obs, m.group(1))
        elif m := re.match(r"You close the ([a-z]+ \d+)\.", obs):
            self.closed.add(m.group(1))
        elif m := re.match(r"You pick up the ([a-z]+ \d+) from the ([a-z]+ \d+)\.", obs):
            obj, rec = m.groups()
            self.holding = obj
            if obj in self.contents.get(rec, []):
                self.contents[rec].remove(obj)
            if obj in self.placed:  # taken back out: no longer counts
                self.placed.remove(obj)
        elif m := re.match(r"You move the ([a-z]+ \d+) to the ([a-z]+ \d+)\.", obs):
            obj, rec = m.groups()
            self.holding = None
            self.contents.setdefault(rec, []).append(obj)
            if self.wanted(obj) and kind_of(rec) == self.goal.target:
                self.placed.append(obj)
                self.placed_in = rec
        elif m := re.match(r"You (?:heat|cool|clean) the ([a-z]+ \d+) using the", obs):
            self.treated.add(m.group(1))

    def _look(self, obs: str, where: str) -> None:
        if re.search(rf"The {re.escape(where)} is closed\.", obs):
            self.closed.add(where)
            return
        m = _SEEN.search(obs)
        if m is not None:
            self.contents[where] = [] if m.group(1).strip() == "nothing" else listed_names(m.group(1))
            self.looked_in.add(where)

    def wanted(self, obj: str) -> bool:
        return kind_of(obj) == self.goal.obj

    # ------------------------------------------------------------------ policy
    def next_action(self) -> str | None:
        """The next command, or None when nothing is left to try (every receptacle searched in vain)."""
        if self.goal.task_type == "look_at_obj_in_light":
            return self._look_in_light()
        if self.holding is not None and not (self.wanted(self.holding) and self.holding not in self.placed):
            return self._put_down()
        if self.holding is not None:
            obj, treatment = self.holding, self.goal.treatment
            if treatment and obj not in self.treated:
                appliance = self._first_of(APPLIANCE[treatment])
                if appliance is None:
                    return None
                return self._go(appliance) or f"{treatment} {obj} with {appliance}"
            target = self._target()
            if target is None:
                return None
            return self._go(target) or self._open(target) or f"move {obj} to {target}"
        return self._fetch(self.wanted) or self._search(self.goal.obj)

    def _look_in_light(self) -> str | None:
        goal = self.goal
        if self.holding is not None and not self.wanted(self.holding):
            return self._put_down()
        if self.holding is None:
            return self._fetch(self.wanted) or self._search(goal.obj)
        lamp_at = next((r for r in self._known_order()
                        if any(kind_of(o) == goal.lamp for o in self.contents.get(r, []))), None)
        if lamp_at is None:
            return self._search(goal.lamp)
        lamp = next(o for o in self.contents[lamp_at] if kind_of(o) == goal.lamp)
        return self._go(lamp_at) or f"use {lamp}"

    def _fetch(self, wanted) -> str | None:
        """Go to (or take from where it stands) a wanted object already seen, the nearest in search order."""
        for rec in self._known_order():
            if rec == self.placed_in:
                continue
            obj = next((o for o in self.contents.get(rec, []) if wanted(o) and o not in self.placed), None)
            if obj is not None:
                return self._go(rec) or self._open(rec) or f"take {obj} from {rec}"
        return None

    def _search(self, obj_kind: str) -> str | None:
        """Look in the next receptacle not yet looked in, by the prior's order for ``obj_kind`` (one that shares the
        agent's spot is examined, or opened, where the agent stands)."""
        here = self.location
        if here is not None and here not in self.looked_in and here in self.closed:
            return f"open {here}"
        for rec in self.prior.order(self.receptacles, obj_kind):
            if rec in self.looked_in or rec == here:
                continue
            if self._here(rec):
                return f"open {rec}" if rec in self.closed else f"examine {rec}"
            return f"go to {rec}"
        return None

    def _put_down(self) -> str | None:
        """The hands hold what the goal does not need (a state an agent left): put it where the expert stands."""
        if self.location is None:
            return f"go to {self.receptacles[0]}" if self.receptacles else None
        return self._open(self.location) or f"move {self.holding} to {self.location}"

    def _target(self) -> str | None:
        """Where to put a wanted object: where one was already put, else the open (or first listed) receptacle of
        the target kind, preferring the one the expert stands at."""
        if self.placed_in is not None:
            return self.placed_in
        kind = self.goal.target
        candidates = [r for r in self.receptacles if kind_of(r) == kind]
        if not candidates:
            return None
        if self.location in candidates:
            return self.location
        known_open = [r for r in candidates if r in self.looked_in and r not in self.closed]
        return (known_open or candidates)[0]

    def _first_of(self, kind: str) -> str | None:
        return next((r for r in self.receptacles if kind_of(r) == kind), None)

    def _known_order(self) -> list[str]:
        """Receptacles whose contents were seen: where the expert stands first, then in the listed order."""
        seen = [r for r in self.receptacles if r in self.contents]
        return sorted(seen, key=lambda r: r != self.location)

    def _here(self, rec: str) -> bool:
        return self.location == rec or rec in self.beside.get(self.location or "", set())

    def _go(self, rec: str) -> str | None:
        return None if self._here(rec) else f"go to {rec}"

    def _open(self, rec: str) -> str | None:
        return f"open {rec}" if rec in self.closed else None


# ---------------------------------------------------------------------------------------------- playing
@dataclass
class ExpertRun:
    """One game played by the expert: its commands, whether it won, and why it stopped."""

    task_id: str
    task_type: str
    actions: list[str]
    success: bool
    # "won", "turn limit", "gave up" (nothing left to search) or "invalid command" (it would repeat a refused one)
    stopped: str


def play(env: Any, task_id: str, *, prior: LocationPrior = UNIFORM_PRIOR, max_turns: int | None = None) -> ExpertRun:
    """Play ``task_id`` on an ALFWorld env with the observable expert (at most ``max_turns``, default the env's)."""
    obs, info = env.reset(options={"task_id": task_id})
    task = info["task"]
    expert = ObservableExpert.start(obs, task.instruction or None, prior)
    limit = max_turns or env.max_turns
    actions: list[str] = []
    stopped = "turn limit"
    rejected: str | None = None
    while len(actions) < limit:
        action = expert.next_action()
        if action is None:
            stopped = "gave up"
            break
        if action == rejected:  # the same refused command again: the expert would loop
            stopped = "invalid command"
            break
        obs, _, terminated, truncated, step = env.step(action)
        actions.append(action)
        rejected = action if step["error"] is not None else None
        expert.observe(action, obs)
        if step["success"]:
            stopped = "won"
            break
        if terminated or truncated:
            break
    return ExpertRun(task_id, task.metadata.get("task_type", ""), actions, stopped == "won", stopped)


def expert_from_history(first_observation: str, turns: Iterable[tuple[str, str]], goal_sentence: str | None = None,
                        prior: LocationPrior = UNIFORM_PRIOR) -> ObservableExpert:
    """The expert after an agent's turns (command, observation): what it would do next from that state."""
    expert = ObservableExpert.start(first_observation, goal_sentence, prior)
    for action, observation in turns:
        expert.observe(action, observation)
    return expert
