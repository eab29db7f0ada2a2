"""ShopDB: serve a customer of a mock online shop through its tools; graded on the final state.

* **Task** -- a customer request in plain words: order a product, cancel an order, refund a
  broken item and order a replacement, clean up the cart, or (hard) cancel a pending order and
  re-order it with one item swapped for the cheapest alternative, or refund a faulty product
  from every delivered order and buy a substitute. Products are named, never given by id, so
  the model has to look them up.
* **Observation** -- one user message with the request (text only) and the shop's tools, bound
  to this episode's database: `search_products(query, category, max_price)`,
  `list_orders()`, `get_order(order_id)`, `view_cart()`, `update_cart(product_id, quantity)`,
  `place_order()`, `cancel_order(order_id)`, `refund_item(order_id, product_id, quantity)`,
  and `finish(answer)`. Tool results are JSON; refused operations (out of stock, cancelling a
  delivered order...) come back as `Error:` messages and change nothing.
* **Action** -- tool calls in the model's format (Qwen3/Hermes `<tool_call>` blocks by default;
  the env takes `parser="qwen3_coder"` or `"openai"` too); the episode ends with `finish` (or a
  reply without a tool call).
* **Reward** -- 1.0 when the database ends in the required state -- stock, cart, every
  existing order's status and refunds, and the items of the orders placed in the episode
  (orders it placed and cancelled again do not count) -- else 0; `success` is the same.
  `info["mismatched"]` names the parts of the state that differ.
* **Difficulty** -- `easy`: 12 products, one order or one cancellation. `medium`: 20
  products, refund + replacement, the cheapest product of a category, or a cart clean-up.
  `hard`: 30 products and 5 past orders, the two multi-step requests above. Tool budget: 14
  calls.

The required state is computed at reset by running the request's operations on a copy of the
database; the oracle instead discovers everything through the tools (searching, reading
orders, comparing prices in the JSON results) and then performs the operations.
"""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Annotated, Any

import numpy as np
from pydantic import Field
from relax_gym.tools import Tool, ToolContext, ToolError, finish, tool

from relax_gym.types import Action

from ._base import Task
from ._tool_task import ToolTask, ToolTaskEnv, pick

CATALOG: dict[str, tuple[str, ...]] = {
    "kitchen": ("kettle", "toaster", "blender", "mug set", "frying pan", "cutting board", "teapot"),
    "office": ("stapler", "desk lamp", "notebook pack", "pen set", "monitor stand", "desk organizer"),
    "garden": ("watering can", "pruning shears", "garden hose", "plant pots", "garden gloves", "bird feeder"),
    "electronics": ("AA batteries", "USB cable", "phone charger", "headphones", "power bank", "webcam"),
    "toys": ("jigsaw puzzle", "kite", "yo-yo", "building blocks", "toy robot", "board game"),
}
BRANDS = ("Acme", "Bolt", "Cedar", "Delta", "Ember", "Fjord", "Gala", "Harbor", "Iris", "Juno", "Koa", "Lumen")
STATUSES = ("pending", "shipped", "delivered")


class ShopError(Exception):
    """A refused shop operation; the message goes to the model."""


@dataclass
class Product:
    id: str
    name: str
    category: str
    price_cents: int
    stock: int

    def view(self) -> dict[str, Any]:
        return {"id": self.id, "name": self.name, "category": self.category, "price": self.price_cents / 100, "stock": self.stock}


@dataclass
class Order:
    id: str
    status: str
    items: dict[str, int]
    refunded: dict[str, int] = field(default_factory=dict)
    new: bool = False  # placed during this episode


class ShopDB:
    """The shop's data and its operations; every tool and the expected-state computation go
    through these methods, so both follow the same rules."""

    def __init__(self, products: list[Product], orders: list[Order], cart: dict[str, int], next_order: int) -> None:
        self.products = {p.id: p for p in products}
        self.orders = {o.id: o for o in orders}
        self.cart = dict(cart)
        self.next_order = next_order

    def copy(self) -> ShopDB:
        return copy.deepcopy(self)

    # -- reads ----------------------------------------------------------------------------------
    def product(self, product_id: str) -> Product:
        p = self.products.get(product_id.strip().upper())
        if p is None:
            raise ShopError(f"no product with id {product_id!r}; use search_products to find ids")
        return p

    def order(self, order_id: str) -> Order:
        o = self.orders.get(order_id.strip().upper().lstrip("#"))
        if o is None:
            raise ShopError(f"no order with id {order_id!r}; use list_orders to see the customer's orders")
        return o

    def search(self, query: str = "", category: str | None = None, max_price: float | None = None) -> list[dict[str, Any]]:
        if max_price is not None and not math.isfinite(max_price):  # round(inf) would raise
            raise ShopError(f"max_price must be a finite number of dollars, got {max_price}")
        words = [w for w in query.lower().replace("-", " ").split() if w]
        out = []
        for p in sorted(self.products.values(), key=lambda p: p.name):
            tokens = f"{p.name} {p.category}".lower().replace("-", " ").split()
            if not all(any(t.startswith(w) or (len(t) >= 3 and w.startswith(t)) for t in tokens) for w in words):
                continue
            if category and p.category != category.strip().lower():
                continue
            if max_price is not None and p.price_cents > round(max_price * 100):
                continue
            out.append(p.view())
        return out

    def order_view(self, order_id: str) -> dict[str, Any]:
        o = self.order(order_id)
        items = [
            {
                "product_id": pid,
                "name": self.products[pid].name,
                "quantity": qty,
                "refunded": o.refunded.get(pid, 0),
                "unit_price": self.products[pid].price_cents / 100,
            }
            for pid, qty in sorted(o.items.items())
        ]
        return {"id": o.id, "status": o.status, "items": items, "total": self._total(o.items) / 100}

    def orders_view(self) -> list[dict[str, Any]]:
        return [
            {"id": o.id, "status": o.status, "items": sum(o.items.values()), "total": self._total(o.items) / 100}
            for o in sorted(self.orders.values(), key=lambda o: o.id)
        ]

    def cart_view(self) -> dict[str, Any]:
        items = [
            {"product_id": pid, "name": self.products[pid].name, "quantity": qty, "unit_price": self.products[pid].price_cents / 100}
            for pid, qty in sorted(self.cart.items())
        ]
        return {"items": items, "total": self._total(self.cart) / 100}

    def _total(self, items: dict[str, int]) -> int:
        return sum(self.products[pid].price_cents * qty for pid, qty in items.items())

    # -- writes ---------------------------------------------------------------------------------
    def set_cart(self, product_id: str, quantity: int) -> dict[str, Any]:
        p = self.product(product_id)
        if quantity < 0:
            raise ShopError("quantity must be 0 or more (0 removes the product from the cart)")
        if quantity > p.stock:
            raise ShopError(f"only {p.stock} of {p.name!r} ({p.id}) in stock; cannot put {quantity} in the cart")
        if quantity == 0:
            self.cart.pop(p.id, None)
        else:
            self.cart[p.id] = quantity
        return self.cart_view()

    def place_order(self) -> dict[str, Any]:
        if not self.cart:
            raise ShopError("the cart is empty; add products with update_cart first")
        for pid, qty in self.cart.items():
            if qty > self.products[pid].stock:
                raise ShopError(f"only {self.products[pid].stock} of {pid} in stock")
        order = Order(f"O{self.next_order}", "pending", dict(self.cart), new=True)
        self.next_order += 1
        for pid, qty in order.items.items():
            self.products[pid].stock -= qty
        self.orders[order.id] = order
        self.cart = {}
        return {"order_id": order.id, "status": order.status, "total": self._total(order.items) / 100}

    def cancel_order(self, order_id: str) -> dict[str, Any]:
        o = self.order(order_id)
        if o.status != "pending":
            raise ShopError(f"order {o.id} is {o.status}; only pending orders can be cancelled")
        o.status = "cancelled"
        for pid, qty in o.items.items():
            self.products[pid].stock += qty
        return {"order_id": o.id, "status": o.status}

    def refund(self, order_id: str, product_id: str, quantity: int = 1) -> dict[str, Any]:
        o = self.order(order_id)
        p = self.product(product_id)
        if o.status != "delivered":
            raise ShopError(f"order {o.id} is {o.status}; only delivered orders can be refunded")
        left = o.items.get(p.id, 0) - o.refunded.get(p.id, 0)
        if p.id not in o.items:
            raise ShopError(f"order {o.id} has no {p.name!r} ({p.id})")
        if not 1 <= quantity <= left:
            raise ShopError(f"can refund 1 to {left} of {p.name!r} in order {o.id}, not {quantity}")
        o.refunded[p.id] = o.refunded.get(p.id, 0) + quantity
        return {"order_id": o.id, "product_id": p.id, "refunded": o.refunded[p.id], "amount": quantity * p.price_cents / 100}

    # -- grading --------------------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        """What the grader compares: stock, cart, old orders, and the items of live new orders
        (their ids and the cancelled ones are left out: a corrected mistake is no mistake)."""
        return {
            "stock": {pid: p.stock for pid, p in sorted(self.products.items())},
            "cart": sorted(self.cart.items()),
            "orders": {
                o.id: [o.status, sorted(o.items.items()), sorted(o.refunded.items())]
                for o in sorted(self.orders.values(), key=lambda o: o.id)
                if not o.new
            },
            "new_orders": sorted(sorted(o.items.items()) for o in self.orders.values() if o.new and o.status != "cancelled"),
        }


# ------------------------------------------------------------------------------------------------
# task generation
# ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Level:
    products: int
    orders: int
    requests: tuple[str, ...]


LEVELS = {
    "easy": Level(12, 2, ("buy", "cancel")),
    "medium": Level(20, 3, ("refund_replace", "cheapest", "cart_cleanup")),
    "hard": Level(30, 5, ("cancel_reorder", "refund_all")),
}


@dataclass
class Request:
    """A request: its text, the operations that fulfil it, and what the oracle needs to know
    from the text alone (names, categories, quantities -- never ids or the answer)."""

    text: str
    apply: Callable[[ShopDB], None]
    kind: str
    facts: dict[str, Any]


class _Builder:
    """Draws a catalog and order history from ``rng`` and shapes them to fit one request."""

    def __init__(self, rng: np.random.Generator, level: Level) -> None:
        self.rng = rng
        self.level = level
        names = [(cat, f"{brand} {noun}") for cat, nouns in CATALOG.items() for noun in nouns for brand in BRANDS]
        chosen = rng.choice(len(names), size=level.products, replace=False)
        ids = rng.choice(900, size=level.products, replace=False) + 100
        prices = rng.choice(np.arange(199, 9999, 25), size=level.products, replace=False)  # distinct prices
        self.products = [
            Product(f"P{int(i)}", names[int(k)][1], names[int(k)][0], int(c), int(rng.integers(0, 9)))
            for k, i, c in zip(chosen, ids, prices)
        ]
        self.orders: list[Order] = []
        self.cart: dict[str, int] = {}
        self.next_order = int(rng.integers(5000, 9000))
        self._order_ids = iter(rng.choice(self.next_order - 1000, size=16, replace=False) + 1000)

    def order(self, status: str, items: dict[str, int]) -> Order:
        o = Order(f"O{int(next(self._order_ids))}", status, dict(items))
        self.orders.append(o)
        return o

    def fill_orders(self, avoid: set[str]) -> None:
        """Random past orders up to the level's count, never containing a product in ``avoid``."""
        pool = [p.id for p in self.products if p.id not in avoid]
        while len(self.orders) < self.level.orders:
            k = int(self.rng.integers(1, 4))
            items = {str(pid): int(self.rng.integers(1, 4)) for pid in self.rng.choice(pool, size=k, replace=False)}
            self.order(str(pick(self.rng, STATUSES)), items)

    def in_category(self, category: str) -> list[Product]:
        return [p for p in self.products if p.category == category]

    def some_category(self, minimum: int) -> str:
        options = [c for c in CATALOG if len(self.in_category(c)) >= minimum]
        return str(pick(self.rng, sorted(options)))

    def db(self) -> ShopDB:
        return ShopDB(self.products, self.orders, self.cart, self.next_order)


def cheapest(db: ShopDB, category: str, quantity: int, exclude: str | None = None) -> Product:
    eligible = [p for p in db.products.values() if p.category == category and p.stock >= quantity and p.id != exclude]
    return min(eligible, key=lambda p: p.price_cents)


def _buy(b: _Builder) -> Request:
    p = pick(b.rng, b.products)
    p.stock = max(p.stock, 3)
    q = int(b.rng.integers(1, p.stock + 1))
    b.fill_orders(set())

    def apply(db: ShopDB) -> None:
        db.set_cart(p.id, q)
        db.place_order()

    return Request(f"Please order {q} x \"{p.name}\" for me.", apply, "buy", {"product": p.name, "quantity": q})


def _cancel(b: _Builder) -> Request:
    o = b.order("pending", {pick(b.rng, b.products).id: int(b.rng.integers(1, 4))})
    b.fill_orders(set())

    def apply(db: ShopDB) -> None:
        db.cancel_order(o.id)

    return Request(f"Please cancel my order {o.id}, I don't need it any more.", apply, "cancel", {"order_id": o.id})


def _refund_replace(b: _Builder) -> Request:
    p = pick(b.rng, b.products)
    p.stock = max(p.stock, 1)
    others = [x for x in b.products if x.id != p.id]
    items = {p.id: int(b.rng.integers(1, 4))} | {pick(b.rng, others).id: int(b.rng.integers(1, 3))}
    o = b.order("delivered", items)
    b.fill_orders({p.id})

    def apply(db: ShopDB) -> None:
        db.refund(o.id, p.id, 1)
        db.set_cart(p.id, 1)
        db.place_order()

    text = (
        f"The \"{p.name}\" in my order {o.id} arrived broken. Please refund one of them, and order one new "
        f"\"{p.name}\" as a replacement."
    )
    return Request(text, apply, "refund_replace", {"product": p.name, "order_id": o.id})


def _cheapest(b: _Builder) -> Request:
    category = b.some_category(3)
    q = int(b.rng.integers(2, 5))
    members = sorted(b.in_category(category), key=lambda p: p.price_cents)
    members[0].stock = int(b.rng.integers(0, q))  # the cheapest has too few: a trap for a careless model
    for p in members[1:]:
        if b.rng.random() < 0.7:
            p.stock = max(p.stock, q)
    members[-1].stock = max(members[-1].stock, q)
    b.fill_orders(set())
    text = f"Please order {q} of the cheapest {category} product that has at least {q} in stock."

    def apply(db: ShopDB) -> None:
        db.set_cart(cheapest(db, category, q).id, q)
        db.place_order()

    return Request(text, apply, "cheapest", {"category": category, "quantity": q})


def _cart_cleanup(b: _Builder) -> Request:
    drop, change, add = (b.products[int(i)] for i in b.rng.choice(len(b.products), size=3, replace=False))
    for p in (drop, change, add):
        p.stock = max(p.stock, 4)
    b.cart = {drop.id: int(b.rng.integers(1, 3)), change.id: 1}
    q_change, q_add = int(b.rng.integers(2, change.stock + 1)), int(b.rng.integers(1, 3))
    b.fill_orders(set())
    text = (
        f"My cart has a few things in it. Remove the \"{drop.name}\", make it {q_change} x \"{change.name}\", "
        f"add {q_add} x \"{add.name}\", and then place the order."
    )

    def apply(db: ShopDB) -> None:
        db.set_cart(drop.id, 0)
        db.set_cart(change.id, q_change)
        db.set_cart(add.id, q_add)
        db.place_order()

    facts = {"drop": drop.name, "change": change.name, "change_to": q_change, "add": add.name, "add_quantity": q_add}
    return Request(text, apply, "cart_cleanup", facts)


def _cancel_reorder(b: _Builder) -> Request:
    category = b.some_category(3)
    members = b.in_category(category)
    swap = pick(b.rng, members)
    others = [p for p in b.products if p.category != category]
    extra = [others[int(i)] for i in b.rng.choice(len(others), size=int(b.rng.integers(1, 3)), replace=False)]
    items = {swap.id: int(b.rng.integers(1, 3))} | {p.id: int(b.rng.integers(1, 3)) for p in extra}
    target = b.order("pending", items)
    b.order("pending", {pick(b.rng, others).id: 1})  # a second pending order, without the product
    for p in members:
        if p.id != swap.id and b.rng.random() < 0.7:
            p.stock = max(p.stock, items[swap.id])
    next(p for p in members if p.id != swap.id).stock = max(items[swap.id], 1)
    b.fill_orders({p.id for p in members})
    text = (
        f"One of my pending orders contains the \"{swap.name}\". Please cancel that order, then order the same "
        f"items again, but instead of the \"{swap.name}\" take the cheapest other {category} product that has "
        "enough stock (same quantity)."
    )

    def apply(db: ShopDB) -> None:
        db.cancel_order(target.id)
        for pid, qty in sorted(items.items()):
            if pid != swap.id:
                db.set_cart(pid, qty)
        db.set_cart(cheapest(db, category, items[swap.id], exclude=swap.id).id, items[swap.id])
        db.place_order()

    return Request(text, apply, "cancel_reorder", {"product": swap.name, "category": category})


def _refund_all(b: _Builder) -> Request:
    category = b.some_category(3)
    members = b.in_category(category)
    faulty = pick(b.rng, members)
    others = [p for p in b.products if p.category != category]
    holders = []
    for status in ("delivered", "delivered", "shipped"):
        items = {faulty.id: int(b.rng.integers(1, 4)), pick(b.rng, others).id: 1}
        holders.append(b.order(status, items))
    holders[1].refunded = {faulty.id: 1} if holders[1].items[faulty.id] > 1 else {}
    total = sum(o.items[faulty.id] - o.refunded.get(faulty.id, 0) for o in holders if o.status == "delivered")
    for p in members:
        if p.id != faulty.id and b.rng.random() < 0.7:
            p.stock = max(p.stock, total)
    next(p for p in members if p.id != faulty.id).stock = max(total, 1)
    b.fill_orders({p.id for p in members})
    text = (
        f"The \"{faulty.name}\" turned out to be faulty. Refund every one of them in my delivered orders that is "
        f"not refunded yet (shipped orders stay as they are), then order the same number of the cheapest other "
        f"{category} product that has enough stock."
    )

    def apply(db: ShopDB) -> None:
        for o in holders:
            if o.status == "delivered":
                db.refund(o.id, faulty.id, o.items[faulty.id] - o.refunded.get(faulty.id, 0))
        db.set_cart(cheapest(db, category, total, exclude=faulty.id).id, total)
        db.place_order()

    return Request(text, apply, "refund_all", {"product": faulty.name, "category": category})


REQUESTS: dict[str, Callable[[_Builder], Request]] = {
    "buy": _buy,
    "cancel": _cancel,
    "refund_replace": _refund_replace,
    "cheapest": _cheapest,
    "cart_cleanup": _cart_cleanup,
    "cancel_reorder": _cancel_reorder,
    "refund_all": _refund_all,
}


# ------------------------------------------------------------------------------------------------
# the env
# ------------------------------------------------------------------------------------------------
def _shop_call(fn: Callable[[], Any]) -> str:
    try:
        return json.dumps(fn(), ensure_ascii=False)
    except ShopError as exc:
        raise ToolError(str(exc)) from None


Quantity = Annotated[int, Field(ge=0, le=99)]


class ShopDBTask(ToolTask[Level]):
    """The shop database of one episode, its tools, and the final-state grader."""

    levels = LEVELS
    modalities = ("text",)

    def __init__(self, difficulty: str = "easy") -> None:
        super().__init__(difficulty)
        self.db = ShopDB([], [], {}, 1000)
        self.request: Request | None = None
        self.expected: dict[str, Any] = {}

    def make_task(self, level: Level) -> Task:
        builder = _Builder(self.np_random, level)
        request = REQUESTS[str(pick(self.np_random, level.requests))](builder)
        self.db = builder.db()
        expected = self.db.copy()
        request.apply(expected)
        self.request, self.expected = request, expected.state()
        if self.expected == self.db.state():
            raise AssertionError("a request must change the shop's state")  # pragma: no cover
        prompt = (
            "You are the assistant of an online shop, acting for the customer in this chat. Use the shop's tools "
            "to do what the customer asks; product and order details are only available through the tools. "
            "When everything is done, call finish.\n\n"
            f"Customer: {request.text}"
        )
        return Task(prompt, "", "done", (), {"request": request.kind})

    def grade(self, reply: str) -> tuple[float, dict[str, Any]]:
        state = self.db.state()
        mismatched = [k for k in state if state[k] != self.expected[k]]
        ok = not mismatched
        return float(ok), {"success": ok, "reward_components": {"correct": float(ok)}, "mismatched": mismatched}

    def random_answer(self, rng: np.random.Generator) -> str:
        return str(pick(rng, ("done", "All done.", "I have completed your request.")))

    def tools(self) -> list[Tool]:
        """The shop's tools; they act on the database of the episode they are called in."""
        return list(SHOP_TOOLS)


# The shop's tools, declared once: each reads the episode's database from ``ctx.env`` (the
# ShopDBTask ToolEnv wraps). ``async`` because they are quick and need no worker thread.
def _db(ctx: ToolContext) -> ShopDB:
    env = ctx.env
    if not isinstance(env, ShopDBTask):
        raise ToolError("this tool only works inside a ShopDB episode")
    return env.db


@tool
async def search_products(ctx: ToolContext, query: str = "", category: str | None = None, max_price: float | None = None) -> str:
    """Search the product catalog; every word of the query must match the product's name or category.

    Args:
        query: Words to look for, e.g. "kettle" (empty: every product).
        category: Only this category: kitchen, office, garden, electronics or toys.
        max_price: Only products costing at most this much (dollars).
    """
    return _shop_call(lambda: _db(ctx).search(query, category, max_price))


@tool
async def list_orders(ctx: ToolContext) -> str:
    """List the customer's orders: id, status (pending, shipped, delivered, cancelled), item count, total."""
    return _shop_call(lambda: _db(ctx).orders_view())


@tool
async def get_order(order_id: str, ctx: ToolContext) -> str:
    """Show one order of the customer: status and items (product ids, quantities, refunded counts).

    Args:
        order_id: The order's id, e.g. "O4821".
    """
    return _shop_call(lambda: _db(ctx).order_view(order_id))


@tool
async def view_cart(ctx: ToolContext) -> str:
    """Show the customer's cart."""
    return _shop_call(lambda: _db(ctx).cart_view())


@tool
async def update_cart(product_id: str, quantity: Quantity, ctx: ToolContext) -> str:
    """Set how many of a product are in the cart (0 removes it); it cannot exceed the stock.

    Args:
        product_id: The product's id, e.g. "P123".
        quantity: The new quantity in the cart.
    """
    return _shop_call(lambda: _db(ctx).set_cart(product_id, quantity))


@tool
async def place_order(ctx: ToolContext) -> str:
    """Order everything in the cart: it becomes a new pending order and the cart is emptied."""
    return _shop_call(lambda: _db(ctx).place_order())


@tool
async def cancel_order(order_id: str, ctx: ToolContext) -> str:
    """Cancel a pending order; its items go back into stock.

    Args:
        order_id: The order's id.
    """
    return _shop_call(lambda: _db(ctx).cancel_order(order_id))


@tool
async def refund_item(order_id: str, product_id: str, ctx: ToolContext, quantity: Annotated[int, Field(ge=1, le=99)] = 1) -> str:
    """Refund items of a delivered order.

    Args:
        order_id: The order's id.
        product_id: The product to refund.
        quantity: How many to refund (at most the number bought and not refunded yet).
    """
    return _shop_call(lambda: _db(ctx).refund(order_id, product_id, quantity))


SHOP_TOOLS: tuple[Tool, ...] = (
    search_products, list_orders, get_order, view_cart, update_cart, place_order, cancel_order, refund_item,
)
SHOP_TOOL_NAMES = tuple(t.name for t in SHOP_TOOLS)


class ShopDBEnv(ToolTaskEnv[ShopDBTask]):
    """Serve a shop customer through database tools; graded on the final database state."""

    task_cls = ShopDBTask
    tool_budget = 14
    answer_tool = "finish"
    parallel_tools = False  # calls of one turn change one database: run them in order
    random_tool_p = 0.8
    modalities = ("text",)
    tags = ("tools", "multi-turn", "stateful", "agent")

    @classmethod
    def shared_tools(cls) -> list[Tool]:
        return [finish]

    def random_tool_call(self, rng: np.random.Generator) -> tuple[str, dict[str, Any]]:
        name = str(pick(rng, SHOP_TOOL_NAMES))
        pid, oid, q = f"P{int(rng.integers(100, 1000))}", f"O{int(rng.integers(1000, 10000))}", int(rng.integers(0, 4))
        noun = str(pick(rng, [n for nouns in CATALOG.values() for n in nouns]))
        args: dict[str, dict[str, Any]] = {
            "search_products": {"query": noun},
            "get_order": {"order_id": oid},
            "update_cart": {"product_id": pid, "quantity": q},
            "cancel_order": {"order_id": oid},
            "refund_item": {"order_id": oid, "product_id": pid, "quantity": max(q, 1)},
        }
        return name, args.get(name, {})

    # -- the oracle: a scripted shop assistant ----------------------------------------------------
    def oracle(self) -> Iterator[Action | str]:
        request = self.task_env.request
        if request is None:
            raise RuntimeError("call reset() first")
        facts = request.facts
        yield from getattr(self, f"_do_{request.kind}")(facts)
        yield self.submit("done")

    def _find(self, name: str) -> Iterator[Action | str]:
        """Search for a product by its exact name; leaves the product's view in ``self._found``."""
        yield self.call("search_products", query=name)
        self._found = next(p for p in self.tool_json("search_products") if p["name"] == name)

    def _cheapest(self, category: str, quantity: int, exclude: str | None = None) -> Iterator[Action | str]:
        yield self.call("search_products", category=category)
        eligible = [p for p in self.tool_json("search_products") if p["stock"] >= quantity and p["id"] != exclude]
        self._found = min(eligible, key=lambda p: p["price"])

    def _do_buy(self, facts: dict[str, Any]) -> Iterator[Action | str]:
        yield from self._find(facts["product"])
        yield self.call("update_cart", product_id=self._found["id"], quantity=facts["quantity"])
        yield self.call("place_order")

    def _do_cancel(self, facts: dict[str, Any]) -> Iterator[Action | str]:
        yield self.call("cancel_order", order_id=facts["order_id"])
        self.tool_text("cancel_order")

    def _do_refund_replace(self, facts: dict[str, Any]) -> Iterator[Action | str]:
        yield self.call("get_order", order_id=facts["order_id"])
        item = next(i for i in self.tool_json("get_order")["items"] if i["name"] == facts["product"])
        yield self.call("refund_item", order_id=facts["order_id"], product_id=item["product_id"], quantity=1)
        yield self.call("update_cart", product_id=item["product_id"], quantity=1)
        self.tool_text("update_cart")
        yield self.call("place_order")

    def _do_cheapest(self, facts: dict[str, Any]) -> Iterator[Action | str]:
        yield from self._cheapest(facts["category"], facts["quantity"])
        yield self.call("update_cart", product_id=self._found["id"], quantity=facts["quantity"])
        yield self.call("place_order")

    def _do_cart_cleanup(self, facts: dict[str, Any]) -> Iterator[Action | str]:
        yield self.call("view_cart")
        ids = {i["name"]: i["product_id"] for i in self.tool_json("view_cart")["items"]}
        yield from self._find(facts["add"])
        yield self.calls([
            ("update_cart", {"product_id": ids[facts["drop"]], "quantity": 0}),
            ("update_cart", {"product_id": ids[facts["change"]], "quantity": facts["change_to"]}),
            ("update_cart", {"product_id": self._found["id"], "quantity": facts["add_quantity"]}),
        ])
        self.tool_texts("update_cart")
        yield self.call("place_order")

    def _orders_with(self, status: str, product: str) -> Iterator[Action | str]:
        """Read every order of ``status``; leaves those holding ``product`` in ``self._orders``."""
        yield self.call("list_orders")
        ids = [o["id"] for o in self.tool_json("list_orders") if o["status"] == status]
        yield self.calls([("get_order", {"order_id": i}) for i in ids])
        orders = [json.loads(t) for t in self.tool_texts("get_order")]
        self._orders = [o for o in orders if any(i["name"] == product for i in o["items"])]

    def _do_cancel_reorder(self, facts: dict[str, Any]) -> Iterator[Action | str]:
        yield from self._orders_with("pending", facts["product"])
        (order,) = self._orders
        swap = next(i for i in order["items"] if i["name"] == facts["product"])
        yield self.call("cancel_order", order_id=order["id"])
        self.tool_text("cancel_order")
        yield from self._cheapest(facts["category"], swap["quantity"], exclude=swap["product_id"])
        keep = [(i["product_id"], i["quantity"]) for i in order["items"] if i is not swap]
        yield self.calls(
            [("update_cart", {"product_id": pid, "quantity": q}) for pid, q in keep]
            + [("update_cart", {"product_id": self._found["id"], "quantity": swap["quantity"]})]
        )
        self.tool_texts("update_cart")
        yield self.call("place_order")

    def _do_refund_all(self, facts: dict[str, Any]) -> Iterator[Action | str]:
        yield from self._orders_with("delivered", facts["product"])
        refunds = []
        for order in self._orders:
            item = next(i for i in order["items"] if i["name"] == facts["product"])
            if item["quantity"] > item["refunded"]:
                refunds.append((order["id"], item["product_id"], item["quantity"] - item["refunded"]))
        yield self.calls([("refund_item", {"order_id": o, "product_id": p, "quantity": q}) for o, p, q in refunds])
        self.tool_texts("refund_item")
        total = sum(q for *_, q in refunds)
        yield from self._cheapest(facts["category"], total, exclude=refunds[0][1])
        yield self.call("update_cart", product_id=self._found["id"], quantity=total)
        yield self.call("place_order")
