"""Sokoban as text, with our own generator: every level is solvable by construction.

Generation (per task seed, `random.Random(seed)`): carve a connected floor by a random walk,
put boxes on random targets and the player on a free cell, then play `reverse_steps` random
reverse moves (the player walks; a box right behind the player is pulled along with
probability 0.8). The reverse state with the largest box-to-target distance becomes the
start, so the forward solution exists by construction; a walk that leaves every box on a
target is redone with the next draws of the same generator.

Symbols (RAGEN): # wall, _ floor, O target, X box, √ box on target, P player, S player on
a target. Moving into a wall or into a box that cannot move is a no-op.
Score = fraction of boxes on targets (dense reward: +1/num_boxes per box pushed onto a
target, -1/num_boxes per box pushed off one). Expert: breadth-first search over
(player, boxes) with dead-cell pruning, i.e. a shortest solution in moves.

Deadlocks (option `deadlock`, off by default; docs/algorithms.md#deadlock): a box off its
targets on a dead cell (no push sequence takes a lone box from it to a target, walls only) can
never be solved. "report" puts `deadlock` in every step's info (the `deadlock_rate` metric) and
changes nothing else; "end" also ends the episode there, with a message and, when
`deadlock_penalty` > 0, that reward subtracted on the step that made the deadlock. Only these
simple (dead-cell) deadlocks are detected: never a false alarm, but two boxes frozen against each
other are missed, so with two or more boxes the rate is a lower bound.
"""

from __future__ import annotations

import random
from collections import deque
from functools import lru_cache
from typing import Literal

from pydantic import Field, model_validator

from envs.base import (
    EnvOptions,
    ParsedAction,
    StepResult,
    TurnEnv,
    chat_example,
    format_action,
    one_of,
    parse_choice,
    prompt_field,
)
from envs.registry import ENVS

ACTIONS = ("up", "down", "left", "right")
FLOOR_FRACTION = 0.7  # carved share of the room's interior
PULL_PROB = 0.8
MAX_SEARCH_STATES = 500_000


class SokobanOptions(EnvOptions):
    size: int = Field(6, ge=4, le=10, description="side of the square room, outer walls included (interior is size-2)")
    num_boxes: int = Field(1, ge=1, le=4, description="boxes (= targets)")
    reverse_steps: int = Field(
        30, ge=1, le=1000, description="reverse-play moves used to scatter the boxes; more = harder"
    )
    action_format: Literal["text", "answer"] = Field(
        "text", description="how the expert writes actions: 'up' or '<answer>up</answer>' (both are always accepted)"
    )
    deadlock: Literal["off", "report", "end"] = Field(
        "off",
        description="box on a dead cell (unsolvable): 'off' ignores it, 'report' logs it (deadlock_rate), "
        "'end' also ends the episode there",
    )
    deadlock_penalty: float = Field(
        0.0, ge=0.0, description="reward subtracted on the step that makes a deadlock (needs deadlock: end)"
    )
    prompt: Literal["terse", "chat"] = prompt_field()

    @model_validator(mode="after")
    def _room_fits(self):
        if self.num_boxes + 1 > FLOOR_FRACTION * (self.size - 2) ** 2 - 2:
            raise ValueError(f"num_boxes={self.num_boxes} does not fit a size={self.size} room")
        if self.deadlock_penalty > 0 and self.deadlock != "end":
            raise ValueError(
                f"deadlock_penalty={self.deadlock_penalty} needs deadlock: end (got {self.deadlock!r}); "
                "a penalty on an episode that goes on would be paid for a state the agent cannot leave"
            )
        return self


class Level:
    """Static part of a level: size, walls, targets; cells are indices r * size + c."""

    def __init__(self, size: int, floor: frozenset[int], targets: frozenset[int]):
        self.size, self.floor, self.targets = size, floor, targets
        self.moves = {"up": -size, "down": size, "left": -1, "right": 1}
        self.live = self._live_cells()

    def _live_cells(self) -> frozenset[int]:
        """Cells from which a lone box can still be pushed onto some target."""
        live, queue = set(self.targets), deque(self.targets)
        while queue:
            c = queue.popleft()
            for d in self.moves.values():
                if c - d in self.floor and c - 2 * d in self.floor and c - d not in live:
                    live.add(c - d)
                    queue.append(c - d)
        return frozenset(live)


def _carve(rng: random.Random, size: int) -> set[int]:
    inner = size - 2
    want = max(4, round(FLOOR_FRACTION * inner * inner))
    r, c = rng.randrange(1, size - 1), rng.randrange(1, size - 1)
    floor = {r * size + c}
    while len(floor) < want:
        dr, dc = rng.choice(((-1, 0), (1, 0), (0, -1), (0, 1)))
        if 1 <= r + dr < size - 1 and 1 <= c + dc < size - 1:
            r, c = r + dr, c + dc
            floor.add(r * size + c)
    return floor


def _reverse_play(rng, level: Level, player: int, steps: int) -> tuple[int, tuple[int, ...]]:
    """Random reverse moves from the solved state; the start state farthest from solved."""
    targets = sorted(level.targets)
    boxes = list(targets)  # box i starts on target i
    best, best_spread = (player, tuple(boxes)), 0
    dirs = list(level.moves.values())
    for _ in range(steps):
        d = rng.choice(dirs)
        nxt = player + d
        if nxt not in level.floor or nxt in boxes:
            continue
        behind = player - d
        if behind in boxes and rng.random() < PULL_PROB:
            boxes[boxes.index(behind)] = player
        player = nxt
        spread = sum(_manhattan(b, t, level.size) for b, t in zip(boxes, targets))
        if spread > best_spread:
            best, best_spread = (player, tuple(boxes)), spread
    player, boxes = best
    for _ in range(2 * level.size):  # walk away from the box without pulling
        nxt = player + rng.choice(dirs)
        if nxt in level.floor and nxt not in boxes:
            player = nxt
    return player, tuple(sorted(boxes))


def _manhattan(a: int, b: int, size: int) -> int:
    return abs(a // size - b // size) + abs(a % size - b % size)


@lru_cache(maxsize=2048)
def generate(seed: int, size: int, num_boxes: int, reverse_steps: int):
    """(Level, player, boxes) of task `seed`; deterministic, never already solved."""
    rng = random.Random(seed)
    for _ in range(1000):
        floor = _carve(rng, size)
        cells = rng.sample(sorted(floor), num_boxes + 1)
        level = Level(size, frozenset(floor), frozenset(cells[:num_boxes]))
        player, boxes = _reverse_play(rng, level, cells[-1], reverse_steps)
        if not set(boxes) <= level.targets:
            return level, player, boxes
    raise ValueError(
        f"sokoban: no unsolved level for seed {seed} in 1000 tries; "
        f"raise reverse_steps ({reverse_steps}) or size ({size})"
    )


def solve(level: Level, player: int, boxes: tuple[int, ...]) -> list[str] | None:
    """A shortest move sequence solving the state, or None (deadlock / search limit)."""
    start = (player, boxes)
    parent: dict = {start: None}
    queue = deque([start])
    while queue and len(parent) < MAX_SEARCH_STATES:
        state = queue.popleft()
        if set(state[1]) <= level.targets:
            return _path(parent, state)
        for action in ACTIONS:
            nxt = _move(level, state, action)
            if nxt is not None and nxt not in parent:
                parent[nxt] = (state, action)
                queue.append(nxt)
    return None


def _path(parent: dict, state) -> list[str]:
    actions = []
    while parent[state] is not None:
        state, action = parent[state]
        actions.append(action)
    return actions[::-1]


def _move(level: Level, state, action: str):
    """The state after `action`, or None when it is a no-op or pushes a box onto a dead cell."""
    player, boxes = state
    d = level.moves[action]
    nxt = player + d
    if nxt not in level.floor:
        return None
    if nxt in boxes:
        beyond = nxt + d
        if beyond not in level.floor or beyond in boxes or beyond not in level.live:
            return None
        boxes = tuple(sorted(beyond if b == nxt else b for b in boxes))
    return nxt, boxes


@ENVS.register(
    "sokoban",
    doc="Sokoban as text: push boxes onto targets; levels generated by reverse play (always solvable); BFS expert",
    source="Sokoban symbols and setting of RAGEN (Wang et al. 2025); "
    "reverse-play generation as in gym-sokoban (Schrader 2018)",
)
class Sokoban(TurnEnv):
    name = "sokoban"
    Options = SokobanOptions
    observation_markers = ("Invalid action", "All boxes are on targets")
    # options that change how an episode ends and pays, not which levels a split holds: held-out
    # results of points that differ only in these pair level by level (harness sweep's manifest)
    task_neutral_options = ("deadlock", "deadlock_penalty")

    @property
    def instructions(self) -> str:
        if self.chat:
            return self._chat_instructions()
        text = (
            "Sokoban. You are P. Push each box X onto a target O; √ is a box on a target. "
            "# is wall. Actions: up, down, left, right."
        )
        if self.options.action_format == "answer":
            text += " Answer as <answer>up</answer>."
        return text

    def _chat_instructions(self) -> str:
        """docs/algorithms.md#chat-prompts: the symbols, the rules, one move per reply, a worked example."""
        text = (
            "You play Sokoban on a grid. P is you, X is a box, O is a target, √ is a box on a target, "
            "S is you on a target, # is a wall, _ is floor. Push every box onto a target: walking into a box "
            "pushes it one cell; boxes cannot be pulled."
        )
        example = chat_example(("######\n#PX_O#\n######", format_action("right", self.options.action_format)))
        return f"{text}\n{self.reply_cue()}\n{example}"

    def reply_cue(self) -> str:
        if self.options.action_format == "answer":
            return f"Answer as <answer>move</answer>, the move one of: {one_of(ACTIONS)}."
        return f"Answer with one word: {one_of(ACTIONS)}."

    @classmethod
    def task_fingerprint(cls, seed: int, options: SokobanOptions) -> str:
        level, player, boxes = generate(seed, options.size, options.num_boxes, options.reverse_steps)
        return _render(level, player, boxes)

    def _new_task(self, seed: int) -> None:
        o = self.options
        self.level, self.player, self.boxes = generate(seed, o.size, o.num_boxes, o.reverse_steps)
        self._plan: dict = {}  # state -> expert action along the last solution found

    def _apply(self, action: str) -> str:
        level, d = self.level, self.level.moves[action]
        nxt = self.player + d
        if nxt not in level.floor:
            return ""
        if nxt in self.boxes:
            beyond = nxt + d
            if beyond not in level.floor or beyond in self.boxes:
                return ""
            self.boxes = tuple(sorted(beyond if b == nxt else b for b in self.boxes))
        self.player = nxt
        if self.won():
            return "All boxes are on targets."
        if self.options.deadlock == "end" and self.deadlocked():
            return "Deadlock: a box can no longer reach a target."
        return ""

    def deadlocked(self) -> bool:
        """A box off the targets on a dead cell: no push sequence can solve the level any more."""
        return any(b not in self.level.live for b in self.boxes)

    def step(self, text: str) -> StepResult:
        result = super().step(text)
        # a penalty needs deadlock: end, so a dead-locked state is the step that made it (and the last)
        if self.options.deadlock_penalty and self.deadlocked():
            result.reward = round(result.reward - self.options.deadlock_penalty, 12)
        return result

    def info(self, format_error: bool = False) -> dict:
        out = super().info(format_error)
        if self.options.deadlock != "off":
            out["deadlock"] = self.deadlocked()
        return out

    def render(self) -> str:
        return _render(self.level, self.player, self.boxes)

    def score(self) -> float:
        return sum(b in self.level.targets for b in self.boxes) / len(self.boxes)

    def won(self) -> bool:
        return set(self.boxes) <= self.level.targets

    def over(self) -> bool:
        return self.won() or (self.options.deadlock == "end" and self.deadlocked())

    def state_key(self) -> str:
        return self.render().replace("\n", "/")

    def admissible(self) -> list[str]:
        return list(ACTIONS)

    def parse_action(self, text: str) -> ParsedAction:
        return parse_choice(text, ACTIONS)

    def expert_action(self) -> str:
        """Next move of a shortest solution; 'up' when the state is dead-locked."""
        state = (self.player, self.boxes)
        if state not in self._plan:
            self._plan = {}
            actions = solve(self.level, *state) or []
            for action in actions:
                self._plan[state] = action
                state = _move(self.level, state, action)
        return format_action(self._plan.get((self.player, self.boxes), "up"), self.options.action_format)


def _render(level: Level, player: int, boxes: tuple[int, ...]) -> str:
    rows = []
    for r in range(level.size):
        row = []
        for c in range(r * level.size, (r + 1) * level.size):
            target = c in level.targets
            if c == player:
                row.append("S" if target else "P")
            elif c in boxes:
                row.append("√" if target else "X")
            elif c in level.floor:
                row.append("O" if target else "_")
            else:
                row.append("#")
        rows.append("".join(row))
    return "\n".join(rows)
