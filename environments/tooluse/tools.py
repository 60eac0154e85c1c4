"""The shop world and the typed Python functions the agent calls on it.

WHY a real world: every call is executed for real on a per-task `ShopWorld` (prices, stock, weights,
exchange rates, orders), so the results an agent sees are the ones its own earlier calls produced and
state changes (placing, cancelling orders) matter. The world is generated from a seed, so a task's
gold answer is reproducible by replaying its gold calls on a fresh copy.

Each tool is a plain function `tool(world, **arguments)`; its annotations are the argument types the
call validator enforces (see `calls`) and its docstring is what the agent reads. Errors a model must
learn from (unknown item, out of stock, bad currency) are raised as `ToolFailure` with a message that
says how to fix the call. Money and weights are rounded to 2 decimals so that a result copied into the
next call as a JSON literal reproduces the same number exactly.
"""

from __future__ import annotations

import difflib
import functools
import random
from dataclasses import dataclass, field
from typing import Callable

# name -> (category, base price in USD, weight in kg)
ITEM_POOL: dict[str, tuple[str, float, float]] = {
    "apple": ("fruit", 0.5, 0.18), "banana": ("fruit", 0.3, 0.12), "strawberry": ("fruit", 0.2, 0.02),
    "blueberry": ("fruit", 0.05, 0.002), "mango": ("fruit", 1.2, 0.35), "pear": ("fruit", 0.6, 0.17),
    "carrot": ("vegetable", 0.25, 0.07), "potato": ("vegetable", 0.4, 0.2), "onion": ("vegetable", 0.35, 0.15),
    "tomato": ("vegetable", 0.45, 0.12), "cucumber": ("vegetable", 0.8, 0.3), "broccoli": ("vegetable", 1.5, 0.5),
    "notebook": ("stationery", 3.0, 0.3), "pencil": ("stationery", 0.8, 0.01), "stapler": ("stationery", 7.5, 0.25),
    "backpack": ("bags", 35.0, 0.9), "suitcase": ("bags", 89.0, 3.5), "tote bag": ("bags", 12.0, 0.2),
    "water bottle": ("kitchen", 9.0, 0.25), "frying pan": ("kitchen", 24.0, 1.4), "teapot": ("kitchen", 18.0, 0.8),
    "kettle": ("kitchen", 29.0, 1.1), "headphones": ("electronics", 59.0, 0.25), "charger": ("electronics", 15.0, 0.1),
    "keyboard": ("electronics", 45.0, 0.7), "desk lamp": ("electronics", 27.0, 1.2),
}
CURRENCIES = ("USD", "EUR", "GBP", "JPY", "CHF")
BASE_RATES = {"USD": 1.0, "EUR": 0.92, "GBP": 0.79, "JPY": 150.0, "CHF": 0.88}  # units per USD
UNITS_TO_KG = {"kg": 1.0, "g": 0.001, "lb": 0.45359237, "oz": 0.028349523125}
ITEMS_PER_WORLD = 12


def close_matches(word: str, candidates: tuple[str, ...], cutoff: float) -> tuple[str, ...]:
    """difflib's close matches, memoised: models repeat the same wrong names, and difflib is the slow path.

    A word too long to be close to any candidate is answered without difflib and without entering the
    cache: difflib's ratio is 2*M / (len(word) + len(candidate)) with M <= len(candidate), so it stays below
    `cutoff` once len(word) > len(candidate) * (2 / cutoff - 1). WHY: agent text picks the word, and a cache
    of 4096 entries of 4,000-character names would hold 16 M characters for nothing."""
    longest = max(map(len, candidates), default=0)
    if cutoff <= 0 or len(word) <= longest * (2 / cutoff - 1):
        return _close_matches(word, candidates, cutoff)
    return ()


@functools.lru_cache(maxsize=4096)
def _close_matches(word: str, candidates: tuple[str, ...], cutoff: float) -> tuple[str, ...]:
    return tuple(difflib.get_close_matches(word, candidates, n=3, cutoff=cutoff))


def quote(text: str, limit: int = 80) -> str:
    """Agent-sent text as an error message shows it: `ascii()` of at most `limit` characters. WHY: the
    messages become observations, which must stay inside the env's text space however odd the agent's
    strings (JSON escapes can carry any code point), and a quoted 4,000-character name teaches nothing."""
    return ascii(text if len(text) <= limit else text[:limit] + "...")


class ToolFailure(Exception):
    """A tool refused the call (unknown item, out of stock, ...); the message is shown to the agent."""


@dataclass
class Item:
    name: str
    category: str
    price_usd: float
    weight_kg: float
    stock: int


@dataclass
class ShopWorld:
    """One task's shop: its catalogue, exchange rates and the orders placed so far."""

    items: dict[str, Item]
    rates: dict[str, float]
    orders: dict[str, tuple[str, int]] = field(default_factory=dict)
    next_order: int = 1001

    @classmethod
    def generate(cls, seed: str) -> "ShopWorld":
        rng = random.Random(seed)
        names = rng.sample(sorted(ITEM_POOL), ITEMS_PER_WORLD)
        items = {}
        for name in names:
            category, price, weight = ITEM_POOL[name]
            items[name] = Item(name, category, round(price * rng.uniform(0.8, 1.3), 2) or 0.01, weight,
                               rng.randint(3, 60))
        rates = {c: (1.0 if c == "USD" else round(r * rng.uniform(0.95, 1.05), 4)) for c, r in BASE_RATES.items()}
        # a per-world start for order ids, so an order id cannot be guessed without placing the order
        return cls(items, rates, next_order=rng.randint(1000, 8999))

    def copy(self) -> "ShopWorld":
        items = {n: Item(i.name, i.category, i.price_usd, i.weight_kg, i.stock) for n, i in self.items.items()}
        return ShopWorld(items, dict(self.rates), dict(self.orders), self.next_order)

    # -- lookups shared by the tools: failures say what exists, so the agent can recover
    def item(self, name: str) -> Item:
        found = self.items.get(name.strip().lower())
        if found is None:
            close = close_matches(name.lower(), tuple(self.items), 0.5)
            hint = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
            raise ToolFailure(f"unknown item {quote(name)}: this shop does not sell it.{hint} "
                              "Use search_catalogue to find the exact item names.")
        return found

    def rate(self, currency: str) -> float:
        code = currency.strip().upper()
        if code not in self.rates:
            raise ToolFailure(f"unknown currency {quote(currency)}; supported: {', '.join(self.rates)}.")
        return self.rates[code]


def _quantity(quantity: int) -> None:
    if quantity < 1:
        raise ToolFailure(f"quantity must be a positive whole number, got {quantity}.")


# ----------------------------------------------------------------------------- the tools
def search_catalogue(world: ShopWorld, query: str) -> list[str]:
    """Search the shop's catalogue; returns the names of items whose name or category contains `query`."""
    q = query.strip().lower()
    if not q:
        raise ToolFailure("query is empty; pass a word such as a category ('fruit') or part of a name ('berry').")
    return sorted(n for n, i in world.items.items() if q in n or q == i.category)


def get_price(world: ShopWorld, item: str) -> float:
    """Unit price of `item` in USD."""
    return world.item(item).price_usd


def get_stock(world: ShopWorld, item: str) -> int:
    """How many units of `item` are in stock right now."""
    return world.item(item).stock


def get_weight(world: ShopWorld, item: str) -> float:
    """Weight of one unit of `item` in kilograms."""
    return world.item(item).weight_kg


def get_total(world: ShopWorld, item: str, quantity: int) -> float:
    """Price in USD of `quantity` units of `item` (unit price times quantity, rounded to cents)."""
    _quantity(quantity)
    return round(world.item(item).price_usd * quantity, 2)


def convert_currency(world: ShopWorld, amount: float, from_currency: str, to_currency: str) -> float:
    """Convert `amount` between currency codes (USD, EUR, GBP, JPY, CHF) at today's rate, rounded to 2 decimals."""
    return round(amount / world.rate(from_currency) * world.rate(to_currency), 2)


def convert_units(world: ShopWorld, value: float, from_unit: str, to_unit: str) -> float:
    """Convert a weight between units kg, g, lb and oz, rounded to 2 decimals."""
    for unit in (from_unit, to_unit):
        if unit.strip().lower() not in UNITS_TO_KG:
            raise ToolFailure(f"unknown unit {quote(unit)}; supported: {', '.join(UNITS_TO_KG)}.")
    return round(value * UNITS_TO_KG[from_unit.strip().lower()] / UNITS_TO_KG[to_unit.strip().lower()], 2)


def add(world: ShopWorld, a: float, b: float) -> float:
    """a + b, rounded to 2 decimals."""
    return round(a + b, 2)


def subtract(world: ShopWorld, a: float, b: float) -> float:
    """a - b, rounded to 2 decimals."""
    return round(a - b, 2)


def multiply(world: ShopWorld, a: float, b: float) -> float:
    """a * b, rounded to 2 decimals."""
    return round(a * b, 2)


def place_order(world: ShopWorld, item: str, quantity: int) -> str:
    """Order `quantity` units of `item`: takes them out of stock and returns the new order id."""
    _quantity(quantity)
    found = world.item(item)
    if quantity > found.stock:
        raise ToolFailure(f"out of stock: only {found.stock} {found.name} left, cannot order {quantity}. "
                          "Check get_stock and order at most that many.")
    found.stock -= quantity
    order_id = f"ORD-{world.next_order}"
    world.next_order += 1
    world.orders[order_id] = (found.name, quantity)
    return order_id


def cancel_order(world: ShopWorld, order_id: str) -> str:
    """Cancel an order by its id: its units go back into stock. Returns a confirmation."""
    entry = world.orders.pop(order_id.strip().upper(), None)
    if entry is None:
        known = ", ".join(world.orders) or "none"
        raise ToolFailure(f"no open order {quote(order_id)} (open orders: {known}); use the id place_order returned.")
    name, quantity = entry
    world.items[name].stock += quantity
    return f"cancelled {order_id.strip().upper()}: {quantity} {name} returned to stock"


def submit_answer(world: ShopWorld, answer: str | float) -> str:
    """Submit the final answer to the task (a number or a short string); this ends the episode."""
    return str(answer)


TOOLS: dict[str, Callable[..., object]] = {f.__name__: f for f in (
    search_catalogue, get_price, get_stock, get_weight, get_total, convert_currency, convert_units,
    add, subtract, multiply, place_order, cancel_order, submit_answer,
)}
SUBMIT = "submit_answer"
