"""Tasks generated deterministically from (split, index): a seeded shop world plus a dependent call chain.

Each template draws its parameters with `random.Random(f"tooluse:{split}:{index}")`, builds the task's
world from the same seed, and *executes* its gold chain on a copy of that world: every call's result is
fed as a literal into the next call, so the walkthrough is exactly what a perfect agent would type and
the gold answer is whatever the real functions return. Chains are 1-4 calls before `submit_answer`.

Splits (WHY): `train` and `valid_seen` share the SEEN templates (different indices, hence different
worlds, items and quantities); `valid_unseen` uses only the HELD-OUT templates, whose function
combinations never occur in a seen template (search feeding a currency conversion, order→cancel→stock,
a price difference converted to another currency), so it measures composition, not memorisation.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Callable

from environments.tooluse.calls import format_call
from environments.tooluse.tools import CURRENCIES, SUBMIT, TOOLS, ShopWorld

SPLITS = ("train", "valid_seen", "valid_unseen")
DEFAULT_NUM_TASKS = {"train": 1000, "valid_seen": 200, "valid_unseen": 200}


@dataclass(frozen=True)
class GoldStep:
    name: str
    arguments: dict[str, Any]
    result: Any


class _Chain:
    """Runs gold calls on a scratch world and records them."""

    def __init__(self, world: ShopWorld):
        self.world = world.copy()
        self.steps: list[GoldStep] = []

    def __call__(self, name: str, **arguments: Any) -> Any:
        result = TOOLS[name](self.world, **arguments)
        self.steps.append(GoldStep(name, arguments, result))
        return result


def _foreign(rng: random.Random) -> str:
    return rng.choice([c for c in CURRENCIES if c != "USD"])


# --------------------------------------------------------------------- seen templates
def price_lookup(rng, world, run):
    item = rng.choice(sorted(world.items))
    return f"What is the unit price of one {item} in USD?", run("get_price", item=item)


def stock_lookup(rng, world, run):
    item = rng.choice(sorted(world.items))
    return f"How many units of {item} does the shop have in stock?", run("get_stock", item=item)


def total_in_currency(rng, world, run):
    item, qty, cur = rng.choice(sorted(world.items)), rng.randint(2, 9), _foreign(rng)
    total = run("get_total", item=item, quantity=qty)
    return (f"How much do {qty} units of {item} cost in {cur}?",
            run("convert_currency", amount=total, from_currency="USD", to_currency=cur))


def order_id(rng, world, run):
    item = rng.choice(sorted(world.items))
    qty = rng.randint(1, min(5, world.items[item].stock))
    return f"Place an order for {qty} {item} and report the order id.", run("place_order", item=item, quantity=qty)


def weight_in_pounds(rng, world, run):
    item, qty = rng.choice(sorted(world.items)), rng.randint(2, 12)
    unit = run("get_weight", item=item)
    kg = run("multiply", a=unit, b=qty)
    return (f"What do {qty} units of {item} weigh in total, in pounds (lb)?",
            run("convert_units", value=kg, from_unit="kg", to_unit="lb"))


def search_then_price(rng, world, run):
    item = rng.choice(sorted(world.items))
    # a fragment that matches this item only, so the search has one answer
    fragments = [item[i:i + n] for n in (4, 5, 6) for i in range(len(item) - n + 1) if " " not in item[i:i + n]]
    unique = [f for f in fragments if [n for n in world.items if f in n] == [item]] or [item]
    fragment = rng.choice(unique)
    names = run("search_catalogue", query=fragment)
    return (f"Find the item whose name contains '{fragment}' and tell me its unit price in USD.",
            run("get_price", item=names[0]))


# --------------------------------------------------------------------- held-out templates
def search_total_in_currency(rng, world, run):
    category = rng.choice(sorted({i.category for i in world.items.values()}))
    names = run("search_catalogue", query=category)
    first, qty, cur = names[0], rng.randint(2, 6), _foreign(rng)
    total = run("get_total", item=first, quantity=qty)
    return (f"Search the catalogue for the category '{category}'. Take the alphabetically first item it "
            f"returns: what do {qty} units of it cost in {cur}?",
            run("convert_currency", amount=total, from_currency="USD", to_currency=cur))


def order_cancel_stock(rng, world, run):
    item = rng.choice(sorted(world.items))
    qty = rng.randint(1, min(5, world.items[item].stock))
    oid = run("place_order", item=item, quantity=qty)
    run("cancel_order", order_id=oid)
    return (f"Order {qty} {item}, then cancel that order. How many {item} are in stock afterwards?",
            run("get_stock", item=item))


def price_difference_in_currency(rng, world, run):
    a, b = rng.sample(sorted(world.items), 2)
    if world.items[a].price_usd < world.items[b].price_usd:
        a, b = b, a
    cur = _foreign(rng)
    pa, pb = run("get_price", item=a), run("get_price", item=b)
    diff = run("subtract", a=pa, b=pb)
    return (f"How much more does one {a} cost than one {b}, expressed in {cur}?",
            run("convert_currency", amount=diff, from_currency="USD", to_currency=cur))


SEEN_TEMPLATES: tuple[Callable, ...] = (price_lookup, stock_lookup, total_in_currency, order_id,
                                        weight_in_pounds, search_then_price)
UNSEEN_TEMPLATES: tuple[Callable, ...] = (search_total_in_currency, order_cancel_stock,
                                          price_difference_in_currency)


@dataclass(frozen=True)
class GeneratedTask:
    task_id: str
    template: str
    instruction: str
    world: ShopWorld
    gold: tuple[GoldStep, ...]
    answer: Any

    @property
    def walkthrough(self) -> list[str]:
        return [format_call(s.name, s.arguments) for s in self.gold] + [format_call(SUBMIT, {"answer": self.answer})]


def templates_for(split: str) -> tuple[Callable, ...]:
    if split not in SPLITS:
        raise ValueError(f"unknown tooluse split {split!r}; expected one of {', '.join(SPLITS)}")
    return UNSEEN_TEMPLATES if split == "valid_unseen" else SEEN_TEMPLATES


def generate(split: str, index: int) -> GeneratedTask:
    """The task (split, index); the same arguments always give the same task."""
    templates = templates_for(split)
    seed = f"tooluse:{split}:{index}"
    rng = random.Random(seed)
    template = templates[index % len(templates)]  # round-robin keeps every template equally represented
    world = ShopWorld.generate(seed)
    chain = _Chain(world)
    instruction, answer = template(rng, world, chain)
    return GeneratedTask(f"{split}-{index:05d}", template.__name__, instruction, world, tuple(chain.steps), answer)
