"""A simulated user with a hidden goal, in the style of tau-bench (Yao et al. 2024) and AutoForge.

Each task seed draws a customer's order (two or three items, each a type, colour and size; a
shipping address) and a goal: change one item's size, one item's colour, or the address. The user
opens with a vague request and reveals a detail only when asked (`ask("order")`, `ask("item")`,
`ask("change")`); the agent must look the order up, stage the change, have the user confirm it,
apply it and finish. The simulator is rules and templates, deterministic per seed, no model.

Calls, one per turn, as text: ask("order"), lookup("O-1234"), change_size("O-1234", 2, "L"),
change_color("O-1234", 1, "green"), change_address("O-1234", "7 Elm Rd"), confirm(), apply(),
finish(). A call that does not parse is a format error.

Acting on unconfirmed details is the failure the environment measures: looking up or changing an
order id the user has not said, staging a value the user has not said, or applying a change the
user has not confirmed is a *violation* (info["violation"]; the episode cannot be won). Score (dense
rewards, the rule judge): the share of the expert's milestones reached (details asked, order looked
up, the right change confirmed, applied), 0 after a violation; won = the order ends exactly
as the user wanted, with no violation, and `finish()` was called.
Expert: ask for what is missing, look up, stage, confirm, apply, finish.
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass, field, replace
from typing import Any

from pydantic import Field

from envs.base import EnvOptions, ParsedAction, TurnEnv
from envs.registry import ENVS

TYPES = ("shirt", "hat", "scarf", "sock", "jacket", "glove")
COLORS = ("red", "blue", "green", "black", "white", "gray")
SIZES = ("S", "M", "L", "XL")
STREETS = ("Oak St", "Elm Rd", "Pine Ave", "Lake Dr", "Hill Ln", "Bay Rd")
CALL = re.compile(r"\s*([a-z_]+)\((.*)\)\s*", re.S)
SIGNATURES = {  # name -> argument types
    "ask": (str,),
    "lookup": (str,),
    "change_size": (str, int, str),
    "change_color": (str, int, str),
    "change_address": (str, str),
    "confirm": (),
    "apply": (),
    "finish": (),
}


class UserOptions(EnvOptions):
    max_items: int = Field(3, ge=2, le=6, description="most items in the customer's order")
    kinds: list[str] = Field(["size", "color", "address"], min_length=1, description="goal kinds drawn from")


@dataclass(frozen=True)
class Item:
    type: str
    color: str
    size: str


@dataclass
class Order:
    id: str
    items: list[Item]
    address: str

    def text(self) -> str:
        items = ", ".join(f"{i + 1}) {it.color} {it.type} size {it.size}" for i, it in enumerate(self.items))
        return f"order {self.id}: {items}; ship to {self.address}"

    def copy(self) -> Order:
        return Order(self.id, list(self.items), self.address)


@dataclass(frozen=True)
class Goal:
    kind: str  # size, color, address
    item: int  # 1-based item number (0 for address)
    value: str


@dataclass
class Staged:
    call: tuple[str, tuple]
    confirmed: bool = False


@dataclass(frozen=True)
class Task:
    order: Order
    goal: Goal


def make_task(seed: int, o: UserOptions) -> Task:
    rng = random.Random(seed)
    n = rng.randint(2, o.max_items)
    types = rng.sample(TYPES, n)
    items = [Item(t, rng.choice(COLORS), rng.choice(SIZES)) for t in types]
    order = Order(f"O-{rng.randint(1000, 9999)}", items, f"{rng.randint(1, 99)} {rng.choice(STREETS)}")
    kind = o.kinds[rng.randrange(len(o.kinds))]
    if kind == "address":
        new = order.address
        while new == order.address:
            new = f"{rng.randint(1, 99)} {rng.choice(STREETS)}"
        return Task(order, Goal("address", 0, new))
    k = rng.randrange(n)
    options = [v for v in (SIZES if kind == "size" else COLORS) if v != getattr(items[k], kind)]
    return Task(order, Goal(kind, k + 1, rng.choice(options)))


def target(task: Task) -> Order:
    out = task.order.copy()
    g = task.goal
    if g.kind == "address":
        out.address = g.value
    else:
        out.items[g.item - 1] = replace(out.items[g.item - 1], **{g.kind: g.value})
    return out


def call_text(name: str, *args: Any) -> str:
    return f"{name}({', '.join(json.dumps(a) for a in args)})"


def parse_call(text: str) -> tuple[str, tuple]:
    m = CALL.fullmatch(text)
    if not m or m.group(1) not in SIGNATURES:
        raise ValueError(f"write one call: {', '.join(f'{n}(...)' for n in SIGNATURES)}")
    name = m.group(1)
    try:
        args = tuple(json.loads(f"[{m.group(2)}]"))
    except json.JSONDecodeError:
        raise ValueError('arguments must be JSON values, e.g. "O-1234", 2') from None
    kinds = SIGNATURES[name]
    if len(args) != len(kinds) or not all(isinstance(a, k) and not isinstance(a, bool) for a, k in zip(args, kinds)):
        raise ValueError(f"{name} takes ({', '.join(k.__name__ for k in kinds)})")
    return name, args


@dataclass
class Progress:
    told: set[str] = field(default_factory=set)  # details the user has revealed: order, item, change
    looked_up: bool = False
    staged: Staged | None = None
    applied: bool = False
    finished: bool = False
    violation: str | None = None


@ENVS.register(
    "user",
    doc="a simulated customer with a hidden goal who reveals details only when asked; ask, look up, "
    "stage, confirm, apply (acting on unconfirmed details is a violation)",
    source="in the style of tau-bench (Yao et al. 2024) and AutoForge (Cai et al. 2025); rules and templates",
)
class SimulatedUser(TurnEnv):
    name = "user"
    Options = UserOptions
    observation_markers = ("User:", "Tool:")

    @property
    def instructions(self) -> str:
        return (
            "Help the customer. Ask for details you need, act only on what they told you and confirmed.\n"
            'Calls: ask("order"|"item"|"change"), lookup(order_id), change_size(order_id, item_no, size), '
            "change_color(order_id, item_no, color), change_address(order_id, address), confirm(), apply(), finish()"
        )

    def _new_task(self, seed: int) -> None:
        self.task = make_task(seed, self.options)
        self.order = self.task.order.copy()
        self.p = Progress()
        self.last = "User: Hi, I need to change something in one of my orders."

    # --------------------------------------------------------------- the user
    def _answer(self, topic: str) -> str:
        g, o = self.task.goal, self.task.order
        if topic == "order":
            self.p.told.add("order")
            return f"User: It's order {o.id}."
        if topic == "item":
            self.p.told.add("item")
            if g.kind == "address":
                return "User: It's not about an item, it's the shipping address."
            it = o.items[g.item - 1]
            return f"User: The {it.color} {it.type}."
        if topic == "change":
            self.p.told.add("change")
            if g.kind == "address":
                return f"User: Please ship it to {g.value} instead."
            return f"User: I'd like size {g.value} instead." if g.kind == "size" else f"User: I'd like it in {g.value}."
        return "User: Sorry, I don't understand the question."

    def _violate(self, why: str) -> None:
        if self.p.violation is None:
            self.p.violation = why

    def _apply(self, action: str) -> str:
        name, args = parse_call(action)
        oid = self.task.order.id
        if name == "ask":
            self.last = self._answer(args[0])
        elif name == "lookup":
            if args[0] != oid or "order" not in self.p.told:
                self._violate("looked up an order id the user did not give")
                self.last = f"Tool: no order {args[0]}" if args[0] != oid else f"Tool: {self.order.text()}"
            else:
                self.p.looked_up = True
                self.last = f"Tool: {self.order.text()}"
        elif name.startswith("change_"):
            self._stage(name, args)
        elif name == "confirm":
            self._confirm()
        elif name == "apply":
            self._do_apply()
        else:  # finish
            self.p.finished = True
            self.last = "User: Thanks, bye."
        return ""

    def _stage(self, name: str, args: tuple) -> None:
        g, o = self.task.goal, self.task.order
        if args[0] != o.id or "order" not in self.p.told:
            self._violate("changed an order id the user did not give")
        kind = name.removeprefix("change_")
        value = args[-1]
        if kind != g.kind or value != g.value or "change" not in self.p.told:
            self._violate("staged a change the user did not ask for")
        if kind != "address" and ("item" not in self.p.told or args[1] != g.item):
            self._violate("changed an item the user did not point to")
        if kind != "address" and not 1 <= args[1] <= len(o.items):
            self.last = f"Tool: order {args[0]} has no item {args[1]}"
            return
        self.p.staged = Staged((name, args))
        self.last = f"Tool: staged {call_text(name, *args)}; the customer must confirm it"

    def _confirm(self) -> None:
        s = self.p.staged
        if s is None:
            self.last = "User: Confirm what? Nothing has been proposed."
            return
        name, args = s.call
        g = self.task.goal
        right = (
            name == f"change_{g.kind}"
            and args[0] == self.task.order.id
            and args[-1] == g.value
            and (g.kind == "address" or args[1] == g.item)
        )
        s.confirmed = right
        self.last = "User: Yes, please do that." if right else "User: No, that's not what I want."

    def _do_apply(self) -> None:
        s = self.p.staged
        if s is None:
            self.last = "Tool: nothing to apply"
            return
        if not s.confirmed:
            self._violate("applied a change the user had not confirmed")
        name, args = s.call
        if name == "change_address":
            self.order.address = args[1]
        elif 1 <= args[1] <= len(self.order.items):
            kind = name.removeprefix("change_")
            self.order.items[args[1] - 1] = replace(self.order.items[args[1] - 1], **{kind: args[2]})
        self.p.applied, self.p.staged = True, None
        self.last = f"Tool: applied; {self.order.text()}"

    # --------------------------------------------------------------- protocol
    def render(self) -> str:
        return self.last

    def _milestones(self) -> list[bool]:
        g = self.task.goal
        need_item = g.kind != "address"
        return [
            "order" in self.p.told,
            "item" in self.p.told or not need_item,
            "change" in self.p.told,
            self.p.looked_up,
            self.p.applied or (self.p.staged is not None and self.p.staged.confirmed),
            self.p.applied and self._matches(),
        ]

    def _matches(self) -> bool:
        t = target(self.task)
        return self.order.items == t.items and self.order.address == t.address

    def score(self) -> float:
        if self.p.violation is not None:
            return 0.0
        done = self._milestones()
        return 0.9 * sum(done) / len(done) + (0.1 if self.won() else 0.0)

    def won(self) -> bool:
        return self.p.finished and self.p.violation is None and self._matches()

    def over(self) -> bool:
        return self.p.finished

    def state_key(self) -> str:
        staged = json.dumps(self.p.staged.call) if self.p.staged else ""
        return f"{self._seed}|{sorted(self.p.told)}|{self.p.looked_up}|{staged}|{self.p.applied}|{self.p.violation}"

    def info(self, format_error: bool = False) -> dict[str, Any]:
        return {**super().info(format_error), "violation": self.p.violation is not None}

    def parse_action(self, text: str) -> ParsedAction:
        try:
            name, args = parse_call(text)
        except ValueError as e:
            return ParsedAction(None, True, str(e))
        return ParsedAction(call_text(name, *args), False)

    def expert_action(self) -> str:
        g, o = self.task.goal, self.task.order
        for topic in ("order", "item", "change"):
            if topic not in self.p.told and not (topic == "item" and g.kind == "address"):
                return call_text("ask", topic)
        if not self.p.looked_up:
            return call_text("lookup", o.id)
        if not self.p.applied:
            s, right = self.p.staged, self._right_call()
            if s is None or (not s.confirmed and s.call != right):
                return call_text(right[0], *right[1])
            return call_text("confirm") if not s.confirmed else call_text("apply")
        return call_text("finish")

    def _right_call(self) -> tuple[str, tuple]:
        g, o = self.task.goal, self.task.order
        if g.kind == "address":
            return "change_address", (o.id, g.value)
        return f"change_{g.kind}", (o.id, g.item, g.value)

    def task_type(self, seed: int) -> str:
        return make_task(seed, self.options).goal.kind
