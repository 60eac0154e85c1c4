"""Static scene data: which receptacles and objects each room type has, and what can be done to them.

Kept as plain tables (no logic) so that the generator, the world and the tests read the same facts.
The four scene types follow ALFWorld's: kitchens (where heating and cooling happen, so the heat/cool task
types live only here), bathrooms (a sink, so cleaning happens here and in kitchens), bedrooms and living
rooms (a desk lamp, so `look_at_obj_in_light` lives here).
"""

from __future__ import annotations

from dataclasses import dataclass

# Object property bits (also used as the "state" bits of an object in the world).
CLEAN, HOT, COOL = 1, 2, 4


@dataclass(frozen=True)
class ReceptacleKind:
    """A receptacle type: how many a scene may have, whether it opens, and its natural preposition."""

    name: str
    min_count: int
    max_count: int
    openable: bool = False
    prep: str = "on"  # "in" for containers, "on" for surfaces (used in instructions and observations)
    target: bool = True  # may be the destination of a placement goal


@dataclass(frozen=True)
class ObjectKind:
    """A portable object type and what the appliances can do to it (bits of CLEAN/HOT/COOL)."""

    name: str
    can: int = 0


def _objs(spec: str) -> tuple[ObjectKind, ...]:
    """Parse 'apple:hcl mug:hcl book' (h=heat, c=cool, l=clean) into ObjectKinds."""
    kinds = []
    for token in spec.split():
        name, _, flags = token.partition(":")
        can = (HOT if "h" in flags else 0) | (COOL if "c" in flags else 0) | (CLEAN if "l" in flags else 0)
        kinds.append(ObjectKind(name, can))
    return tuple(kinds)


@dataclass(frozen=True)
class Scene:
    name: str
    receptacles: tuple[ReceptacleKind, ...]
    objects: tuple[ObjectKind, ...]
    has_lamp: bool = False  # a desk lamp stands on one of `lamp_on` receptacles
    lamp_on: tuple[str, ...] = ()

    def receptacle(self, name: str) -> ReceptacleKind:
        return next(r for r in self.receptacles if r.name == name)

    def object(self, name: str) -> ObjectKind:
        return next(o for o in self.objects if o.name == name)


R = ReceptacleKind

KITCHEN = Scene(
    "kitchen",
    (
        R("cabinet", 2, 6, openable=True, prep="in"),
        R("coffeemachine", 1, 1, target=False),
        R("countertop", 1, 3),
        R("diningtable", 0, 1),
        R("drawer", 1, 4, openable=True, prep="in"),
        R("fridge", 1, 1, openable=True, prep="in"),
        R("garbagecan", 1, 1, prep="in"),
        R("microwave", 1, 1, openable=True, prep="in"),
        R("shelf", 0, 2),
        R("sinkbasin", 1, 1, prep="in"),
        R("stoveburner", 2, 4),
        R("toaster", 0, 1, target=False),
    ),
    _objs(
        "apple:hcl bowl:hcl bread:hc butterknife:l cup:hcl dishsponge:l egg:hcl fork:l kettle:l knife:l "
        "ladle:l lettuce:cl mug:hcl pan:cl peppershaker plate:hcl pot:cl potato:hcl saltshaker soapbottle "
        "spatula:l spoon:l tomato:hcl winebottle:c"
    ),
)

LIVINGROOM = Scene(
    "livingroom",
    (
        R("armchair", 0, 2),
        R("cabinet", 0, 3, openable=True, prep="in"),
        R("coffeetable", 1, 2),
        R("diningtable", 0, 1),
        R("drawer", 1, 4, openable=True, prep="in"),
        R("dresser", 0, 1),
        R("garbagecan", 1, 1, prep="in"),
        R("shelf", 1, 3),
        R("sidetable", 1, 2),
        R("sofa", 1, 1),
        R("tvstand", 0, 1),
    ),
    _objs("box creditcard keychain laptop newspaper pillow remotecontrol statue tissuebox vase watch book"),
    has_lamp=True,
    lamp_on=("sidetable", "dresser"),
)

BEDROOM = Scene(
    "bedroom",
    (
        R("armchair", 0, 1),
        R("bed", 1, 1),
        R("desk", 1, 2),
        R("drawer", 2, 6, openable=True, prep="in"),
        R("dresser", 1, 1),
        R("garbagecan", 1, 1, prep="in"),
        R("laundryhamper", 0, 1, prep="in"),
        R("safe", 0, 1, openable=True, prep="in"),
        R("shelf", 1, 4),
        R("sidetable", 1, 2),
    ),
    _objs(
        "alarmclock baseballbat book bowl cd cellphone creditcard keychain laptop mug pen pencil pillow "
        "teddybear tennisracket watch"
    ),
    has_lamp=True,
    lamp_on=("desk", "sidetable", "dresser"),
)

BATHROOM = Scene(
    "bathroom",
    (
        R("bathtubbasin", 0, 1, prep="in"),
        R("cabinet", 1, 4, openable=True, prep="in"),
        R("countertop", 1, 1),
        R("drawer", 0, 3, openable=True, prep="in"),
        R("garbagecan", 1, 1, prep="in"),
        R("handtowelholder", 0, 1),
        R("shelf", 0, 2),
        R("sinkbasin", 1, 2, prep="in"),
        R("toilet", 1, 1),
        R("toiletpaperhanger", 1, 1),
        R("towelholder", 0, 1),
    ),
    _objs(
        "candle cloth:l dishsponge:l handtowel plunger scrubbrush soapbar:l soapbottle spraybottle "
        "tissuebox toiletpaper towel"
    ),
)

SCENES: dict[str, Scene] = {s.name: s for s in (KITCHEN, LIVINGROOM, BEDROOM, BATHROOM)}

LAMP = "desklamp"

# Which appliance does what: the command verb, the state bit it sets, the receptacle type it needs.
APPLIANCE_FOR = {"heat": (HOT, "microwave"), "cool": (COOL, "fridge"), "clean": (CLEAN, "sinkbasin")}
STATE_WORD = {CLEAN: "clean", HOT: "hot", COOL: "cool"}
