"""A generator of ALFWorld text games that needs no downloaded data.

ALFWorld's official games are PDDL problems written from AI2-THOR scenes (ALFRED). This module
writes problems of the same form from what the `alfworld` package ships: the room layouts
(`alfworld/gen/layouts/FloorPlan*-{objects,openable}.json`: the object types and receptacle
instances of each of ALFRED's 120 scenes), the object/receptacle tables of
`alfworld.gen.constants` (what fits where, what can be cleaned, heated, cooled, toggled) and
the goal PDDL and task templates of `alfworld.gen.goal_library`. The game file is ALFWorld's
own format (`game.tw-pddl`: the `alfred.pddl` domain, the `alfred.twl2` grammar with the task
text, the problem), played by TextWorld's PDDL backend exactly like the official files; the
walkthrough is fast-downward's plan, replayed to a win before the file is kept.

What differs from the official set: the scene content is sampled (receptacle instances of a
real floor plan, objects drawn from the types that scene contains, placed in receptacles that
can hold them) instead of read from a simulator; the agent starts away from every receptacle;
at most `max_receptacles` receptacles are kept (the real scenes have 3 to 47) so the first
observation stays short; no sliced objects and no movable-receptacle tasks (ALFWorld skips
those too).
"""

from __future__ import annotations

import importlib.util
import json
import random
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from types import ModuleType


def _alfworld_dir() -> Path:
    spec = importlib.util.find_spec("alfworld")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("the alfworld package is not installed (pip install alfworld)")
    return Path(list(spec.submodule_search_locations)[0])


def _load(relpath: str, name: str) -> ModuleType:
    """Load one data module of alfworld by path: `import alfworld` would create
    $ALFWORLD_DATA (default ~/.cache/alfworld) as a side effect of importing this module."""
    spec = importlib.util.spec_from_file_location(name, _alfworld_dir() / relpath)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


C = _load("gen/constants.py", "_alfworld_constants")
gdict = _load("gen/goal_library.py", "_alfworld_goal_library").gdict

TASK_TYPES = (
    "pick_and_place_simple",
    "look_at_obj_in_light",
    "pick_clean_then_place_in_recep",
    "pick_heat_then_place_in_recep",
    "pick_cool_then_place_in_recep",
    "pick_two_obj_and_place",
)
APPLIANCE = {
    "pick_clean_then_place_in_recep": "SinkBasin",
    "pick_heat_then_place_in_recep": "Microwave",
    "pick_cool_then_place_in_recep": "Fridge",
}
PROPERTY = {
    "pick_clean_then_place_in_recep": "Cleanable",
    "pick_heat_then_place_in_recep": "Heatable",
    "pick_cool_then_place_in_recep": "Coolable",
}
LAMPS = ("DeskLamp", "FloorLamp")
LAMP_HOLDERS = ("Desk", "SideTable", "Dresser", "Shelf", "CoffeeTable", "DiningTable", "TVStand")
MOVABLE = set(C.MOVABLE_RECEPTACLES)
STATIC = set(C.RECEPTACLES) - MOVABLE
PLACEABLE = {o for objs in C.VAL_RECEPTACLE_OBJECTS.values() for o in objs if "Sliced" not in o and o not in STATIC}
DATA_DIR = _alfworld_dir() / "data"
LAYOUT_DIR = _alfworld_dir() / "gen" / "layouts"


@dataclass(frozen=True)
class Scene:
    number: int
    room: str
    receptacles: tuple[str, ...]  # receptacle type of each instance
    objects: tuple[str, ...]  # placeable object types present
    lamps: tuple[str, ...]


def _room(number: int) -> str:
    return next(room for room, numbers in C.SCENE_TYPE.items() if number in numbers)


@lru_cache(maxsize=1)
def scenes() -> tuple[Scene, ...]:
    """ALFRED's floor plans as shipped with the alfworld package."""
    out = []
    for path in sorted(LAYOUT_DIR.glob("FloorPlan*-objects.json")):
        number = int(path.name[len("FloorPlan") :].split("-")[0])
        types = json.loads(path.read_text())
        instances = json.loads((LAYOUT_DIR / f"FloorPlan{number}-openable.json").read_text())
        receptacles = []
        for key in instances:
            parts = key.split("|")
            kind = parts[4] if len(parts) > 4 else parts[0]  # Sink|...|SinkBasin -> SinkBasin
            if kind in STATIC:
                receptacles.append(kind)
        for kind in types:  # receptacles the layout lists without an interaction point
            if kind in STATIC and kind not in receptacles and kind not in ("Sink", "Bathtub"):
                receptacles.extend([kind] * (2 if kind == "StoveBurner" else 1))
        objects = tuple(sorted(t for t in set(types) if t in PLACEABLE))
        lamps = tuple(t for t in LAMPS if t in types)
        out.append(Scene(number, _room(number), tuple(sorted(receptacles)), objects, lamps))
    return tuple(out)


def fits(obj: str, recep: str) -> bool:
    return obj in C.VAL_RECEPTACLE_OBJECTS.get(recep, ())


# ----------------------------------------------------------------------------- sampling
@dataclass
class Task:
    task_type: str
    scene: Scene
    obj: str  # target object type
    recep: str  # goal receptacle type ("" for look_at_obj_in_light)
    toggle: str = ""  # lamp type for look_at_obj_in_light
    text: str = ""  # task description shown to the agent


def sample_task(task_type: str, rng: random.Random) -> Task:
    """A feasible (scene, object, receptacle) for `task_type`."""
    candidates = [s for s in scenes() if s.room in C.GOALS_VALID[task_type]]
    rng.shuffle(candidates)
    for scene in candidates:
        kinds = set(scene.receptacles)
        if task_type in APPLIANCE and APPLIANCE[task_type] not in kinds:
            continue
        if task_type == "look_at_obj_in_light" and not (scene.lamps and kinds & set(LAMP_HOLDERS)):
            continue
        objs = [o for o in scene.objects if task_type not in PROPERTY or o in C.VAL_ACTION_OBJECTS[PROPERTY[task_type]]]
        pairs = []
        for obj in objs:
            sources = [k for k in kinds if fits(obj, k)]
            if task_type == "look_at_obj_in_light":
                if sources:
                    pairs.append((obj, ""))
                continue
            for recep in sorted(kinds):
                if recep != APPLIANCE.get(task_type) and fits(obj, recep) and any(k != recep for k in sources):
                    pairs.append((obj, recep))
        if not pairs:
            continue
        obj, recep = rng.choice(sorted(pairs))
        toggle = rng.choice(scene.lamps) if task_type == "look_at_obj_in_light" else ""
        template = rng.choice(gdict[task_type]["templates"])
        text = template.format(obj=obj.lower(), recep=recep.lower(), toggle=toggle.lower(), mrecep="")
        return Task(task_type, scene, obj, recep, toggle, text)
    raise ValueError(f"no ALFRED scene supports task type {task_type!r}")


def _ident(kind: str, k: int) -> str:
    """ALFRED-style id that alfworld's Demangler turns into '<kind lowercased> <n>'."""
    if kind == "SinkBasin":
        return f"Sink_bar_{k:02d}_bar_SinkBasin"
    if kind == "BathtubBasin":
        return f"Bathtub_bar_{k:02d}_bar_BathtubBasin"
    return f"{kind}_bar_{k:02d}"


def layout(
    task: Task, rng: random.Random, max_receptacles: int, nb_distractors: int
) -> tuple[list[tuple[str, str]], list[tuple[str, str, str]]]:
    """Receptacles [(id, type)] and objects [(id, type, receptacle id)] of one game."""
    pool = list(task.scene.receptacles)
    rng.shuffle(pool)
    holder = rng.choice(sorted(set(pool) & set(LAMP_HOLDERS))) if task.toggle else ""
    source = rng.choice(sorted({k for k in pool if fits(task.obj, k) and k != task.recep}))
    required = [k for k in dict.fromkeys([task.recep, APPLIANCE.get(task.task_type, ""), holder, source]) if k]
    chosen = list(required)
    for kind in required:
        pool.remove(kind)
    chosen += pool[: max(0, max_receptacles - len(chosen))]
    counts: dict[str, int] = {}
    receptacles = []
    for kind in sorted(chosen):
        counts[kind] = counts.get(kind, 0) + 1
        receptacles.append((_ident(kind, counts[kind]), kind))

    objects: list[tuple[str, str, str]] = []
    counts = {}

    def place(kind: str, where: list[tuple[str, str]]) -> None:
        counts[kind] = counts.get(kind, 0) + 1
        rid, _ = rng.choice(where)
        objects.append((_ident(kind, counts[kind]), kind, rid))

    start = [(r, k) for r, k in receptacles if fits(task.obj, k) and k != task.recep]
    n_target = rng.randint(2, 3) if task.task_type == "pick_two_obj_and_place" else rng.randint(1, 2)
    for _ in range(n_target):
        place(task.obj, start)
    if task.toggle:
        place(task.toggle, [(r, k) for r, k in receptacles if k == holder])
    others = [o for o in task.scene.objects if o != task.obj]
    for _ in range(nb_distractors if others else 0):
        kind = rng.choice(others)
        where = [
            (r, k)
            for r, k in receptacles
            if fits(kind, k) and not (task.recep and k == task.recep and kind == task.obj)
        ]
        if where:
            place(kind, where)
    return receptacles, objects


# ----------------------------------------------------------------------------- PDDL
def problem_pddl(task: Task, receptacles, objects, name: str) -> str:
    """The PDDL problem in the form of ALFWorld's `initial_state.pddl`."""
    rtypes = sorted({k for _, k in receptacles} | set(APPLIANCE.values()))
    otypes = sorted({k for _, k, _ in objects} | {task.obj, "Knife", "ButterKnife"})
    location = {rid: f"loc_bar_{i + 1:02d}" for i, (rid, _) in enumerate(receptacles)}
    decl = (
        ["agent1 - agent", "loc_bar_00 - location"]
        + [f"{loc} - location" for loc in location.values()]
        + [f"{t}Type - otype" for t in otypes]
        + [f"{t}Type - rtype" for t in rtypes]
        + [f"{rid} - receptacle" for rid, _ in receptacles]
        + [f"{oid} - object" for oid, _, _ in objects]
    )
    init = ["(atLocation agent1 loc_bar_00)"]
    for rid, kind in receptacles:
        init.append(f"(receptacleType {rid} {kind}Type)")
        init.append(f"(receptacleAtLocation {rid} {location[rid]})")
        if kind in C.OPENABLE_CLASS_SET:
            init.append(f"(openable {rid})")
    present = {k for _, k in receptacles}
    for kind in sorted(present):
        init += [f"(canContain {kind}Type {o}Type)" for o in otypes if fits(o, kind)]
    for oid, kind, rid in objects:
        init += [
            f"(objectType {oid} {kind}Type)",
            f"(inReceptacle {oid} {rid})",
            f"(objectAtLocation {oid} {location[rid]})",
        ]
        if kind in LAMPS:
            init.append(f"(toggleable {oid})")
            continue
        init.append(f"(pickupable {oid})")
        for prop, pred in (("Cleanable", "cleanable"), ("Heatable", "heatable"), ("Coolable", "coolable")):
            if kind in C.VAL_ACTION_OBJECTS[prop]:
                init.append(f"({pred} {oid})")
        if kind in MOVABLE:
            init.append(f"(isReceptacleObject {oid})")
    goal = gdict[task.task_type]["pddl"].format(obj=task.obj, recep=task.recep, toggle=task.toggle, mrecep="")
    goal = goal.replace("#", "-")
    return (
        f"(define (problem {name})\n (:domain alfred)\n (:objects\n  "
        + "\n  ".join(decl)
        + "\n )\n (:init\n  "
        + "\n  ".join(init)
        + "\n )\n"
        + goal
    )


def grammar(task_text: str) -> str:
    return (DATA_DIR / "alfred.twl2").read_text().replace("UNKNOWN GOAL", task_text)


def domain() -> str:
    return (DATA_DIR / "alfred.pddl").read_text()


def make_game_data(
    seed: int, task_type: str, max_receptacles: int = 12, nb_distractors: int = 8, attempt: int = 0
) -> dict:
    """The `game.tw-pddl` content of one generated game (walkthrough not yet added)."""
    rng = random.Random(f"alfworld-gen/{seed}/{task_type}/{attempt}")
    task = sample_task(task_type, rng)
    receptacles, objects = layout(task, rng, max_receptacles, nb_distractors)
    return {
        "pddl_domain": domain(),
        "grammar": grammar(task.text),
        "pddl_problem": problem_pddl(task, receptacles, objects, f"gen_{seed}"),
        "solvable": None,
        "walkthrough": None,
        "task": {
            "seed": seed,
            "task_type": task_type,
            "scene": f"FloorPlan{task.scene.number}",
            "object_target": task.obj,
            "parent_target": task.recep,
            "toggle_target": task.toggle,
            "text": task.text,
        },
    }
