"""ALFWorld text games (Shridhar et al. 2021): household tasks in ALFRED's rooms, as text.

Two sources of games (option `source`):
* "official": ALFWorld's `game.tw-pddl` files under `data_dir` (default `$ALFWORLD_DATA`, as
  written by `alfworld-download`): split folders `train`, `valid_seen`, `valid_unseen`
  (directly or under `json_2.1.1/`); unsolvable, "movable" and "Sliced" games are skipped,
  as ALFWorld's own loader does. Train tasks play `train`, held-out tasks `heldout_split`;
  each split is ordered so that task types alternate (any first n seeds cover them evenly).
* "generated": games written by `envs.alfworld_gen` from the ALFRED layouts and tables the
  alfworld package ships (no download), cached under `cache_dir`, one per task seed.
* "auto" (default): official when its `train` games are found, else generated. The choice is
  in `env.source`; set it explicitly for results that must not depend on the machine.

Both play through TextWorld's PDDL backend with alfworld's domain, grammar and entity naming.
Task types cycle with the seed (seed 2k and 2k+1 play `task_types[k % len(task_types)]` when
generated). Train tasks are the even seeds, held-out tasks the odd ones.
Expert (option `expert`):
* "planner" (default): fast-downward's plan from the current state (kept while followed,
  replanned after a detour). It knows where every object is, unlike an agent, so its
  demonstrations go straight to hidden objects, which a policy that sees only the
  observations cannot imitate.
* "search" (generated games): looks for the task's object the way an observation-only agent
  must. It remembers what each observation showed; takes a target object it can see (never
  from a receptacle of the goal's type); otherwise goes to a remembered receptacle that holds
  one, opens the closed receptacle it stands at, or goes to the next unsearched receptacle:
  first those that can hold the object's type (ALFRED's object/receptacle table, the common
  sense a person brings), in the order of the admissible commands, then the others. Once it
  holds a target object the planner finishes the task (carrying it to the goal receptacle and
  heating, cooling or cleaning on the way); for look_at_obj_in_light that part still walks
  straight to the lamp, whose place the agent has not necessarily seen.
Observations: the goal once, at reset, as in every text game; with option `goal_every_turn` the
goal line is repeated above every later observation too (verl-agent restates the task each step).
Reward: 1.0 on success (the game has no intermediate points).
"""

from __future__ import annotations

import copy
import importlib.util
import json
import os
import random
import re
import sys
from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator

from envs import alfworld_gen
from envs.registry import ENVS
from envs.stage import count
from envs.text_game import (
    GOAL_HEADER,
    GameView,
    TextGameEnv,
    TextGameOptions,
    cached_game,
    compact_lines,
    pick_file,
    scoped_env,
    state_digest,
)

for _package in ("textworld", "fast_downward"):  # both are imported on first use
    if importlib.util.find_spec(_package) is None:
        raise ImportError(f"ALFWorld games need the {_package} package (pip install 'textworld[pddl]' alfworld)")
GEN_VERSION = 1  # bump when the generator changes what a seed produces
GENERATION_ATTEMPTS = 10
HIDDEN_COMMANDS = ("help",)  # its feedback is a long command reference
_USER_DATA = os.environ.get("ALFWORLD_DATA")  # before `import alfworld` overwrites it
DOWNLOAD_HELP = (
    "Get the official games with `alfworld-download` (pip package alfworld; writes "
    "to $ALFWORLD_DATA, default ~/.cache/alfworld) and point ALFWORLD_DATA or the env "
    "option data_dir at that folder, or use source: generated."
)


class AlfWorldOptions(TextGameOptions):
    source: Literal["auto", "official", "generated"] = Field(
        "auto",
        description="'official' ALFWorld games from data_dir, 'generated' games made "
        "here from the alfworld package (no download), or 'auto': official "
        "when found, else generated",
    )
    data_dir: str | None = Field(None, description="ALFWorld data folder (default: $ALFWORLD_DATA)")
    heldout_split: Literal["valid_unseen", "valid_seen"] = Field(
        "valid_unseen", description="official split played by held-out seeds"
    )
    task_types: list[str] = Field(list(alfworld_gen.TASK_TYPES), description="ALFWorld task types to play")
    cache_dir: str = Field("results/.cache/alfworld", description="where generated games are cached")
    max_receptacles: int = Field(
        12, ge=4, le=60, description="receptacles per generated game (ALFRED scenes have 3-47)"
    )
    nb_distractors: int = Field(8, ge=0, le=60, description="objects per generated game besides the task's")
    expert: Literal["planner", "search"] = Field(
        "planner",
        description="'planner': fast-downward's plan (knows where hidden objects are); 'search': "
        "looks for the object from what it has seen, then plans (generated games only)",
    )
    goal_every_turn: bool = Field(
        False,
        description="repeat the goal line above every observation, not only the first (verl-agent's "
        "ALFWorld prompt restates the task each step); off: the goal appears once, at reset",
    )

    @field_validator("task_types")
    @classmethod
    def _known_types(cls, value: list[str]) -> list[str]:
        unknown = [t for t in value if t not in alfworld_gen.TASK_TYPES]
        if unknown or not value:
            raise ValueError(f"unknown task types {unknown}; choose from {', '.join(alfworld_gen.TASK_TYPES)}")
        return value


def data_root(options: AlfWorldOptions) -> Path | None:
    root = options.data_dir or _USER_DATA or os.environ.get("ALFWORLD_DATA")
    return Path(os.path.expandvars(os.path.expanduser(root))) if root else None


def split_dir(root: Path, split: str) -> Path | None:
    for folder in (root / "json_2.1.1" / split, root / split):
        if folder.is_dir():
            return folder
    return None


@lru_cache(maxsize=16)
def official_games(folder: str, task_types: tuple[str, ...]) -> tuple[Path, ...]:
    """Solvable games of one official split folder, in a fixed order that interleaves the
    task types (so any first n seeds cover them evenly), shuffled within a type."""
    by_type: dict[str, list[Path]] = {t: [] for t in task_types}
    for path in sorted(Path(folder).rglob("game.tw-pddl")):
        name = str(path.relative_to(folder))
        if "movable" in name or "Sliced" in name:
            continue
        task_type = next((t for t in task_types if name.startswith(t + "-") or f"/{t}-" in f"/{name}"), None)
        if task_type is not None and _solvable(path):
            by_type[task_type].append(path)
    for games in by_type.values():
        random.Random(0).shuffle(games)
    longest = max(map(len, by_type.values()), default=0)
    return tuple(games[i] for i in range(longest) for games in by_type.values() if i < len(games))


def _solvable(path: Path) -> bool:
    """alfworld-generate writes "solvable" after the long domain/grammar/problem strings, so
    the file's tail settles it without reading thousands of large files whole."""
    with open(path, "rb") as handle:
        handle.seek(max(0, path.stat().st_size - 16384))
        tail = handle.read().decode("utf-8", "replace")
    if '"solvable"' not in tail:
        tail = path.read_text()
    return '"solvable": true' in tail


def _memoized(parse, size: int = 8192):
    """`parse` with its results cached by argument and handed out as deep copies."""
    cache: dict = {}

    def wrapper(*args, **kwargs):
        key = (args, tuple(sorted(kwargs.items())))
        if key not in cache:
            if len(cache) >= size:
                cache.clear()
            cache[key] = parse(*args, **kwargs)
        return copy.deepcopy(cache[key])

    wrapper.memoized = True
    return wrapper


def _translation_cache(pddl2sas, size: int = 16):
    """fast-downward's PDDL -> SAS translation (twice per game reset, ~0.3 s) cached per
    problem; it also overwrites sys.argv, which is restored here."""
    cache: dict = {}

    def wrapper(domain, problem, verbose=False, optimize=False):
        key = (domain, problem, bool(optimize))
        if key not in cache:
            if len(cache) >= size:
                cache.pop(next(iter(cache)))
            argv = sys.argv
            try:
                cache[key] = pddl2sas(domain, problem, verbose=verbose, optimize=optimize)
            finally:
                sys.argv = argv
        return cache[key]

    wrapper.memoized = True
    return wrapper


@lru_cache(maxsize=1)
def _alfworld_wrappers():
    """TextWorld's PDDL env and alfworld's name demangler, imported on first use.

    TextWorld's PDDL text generator re-parses the same few grammar and logic snippets with
    tatsu for every admissible command at every step (~75% of a step); their parses are
    memoized here (results are deep-copied, so behaviour is unchanged): ~3x faster steps.
    The parse of a game's grammar (on load) and fast-downward's translation of its problem
    (on load and reset) are cached too, for the instances of a group playing one game."""
    try:
        from textworld.envs.pddl.pddl import PddlEnv, fast_downward_missing
    except ImportError as e:  # pragma: no cover - depends on the install
        raise ImportError(f"ALFWorld games need TextWorld's PDDL backend: {e}") from None
    if fast_downward_missing:
        raise ImportError("ALFWorld games need fast-downward: pip install 'textworld[pddl]'")
    import fast_downward
    import textworld.envs.pddl.logic as game_logic
    import textworld.envs.pddl.textgen as textgen
    import textworld.logic as logic

    for module, size in ((textgen, 8192), (logic, 8192), (game_logic, 32)):  # 32 grammars
        if not getattr(module._parse_and_convert, "memoized", False):
            module._parse_and_convert = _memoized(module._parse_and_convert, size)
    if not getattr(fast_downward.pddl2sas, "memoized", False):
        fast_downward.pddl2sas = _translation_cache(fast_downward.pddl2sas)
    from alfworld.agents.environment.alfred_tw_env import AlfredDemangler

    return PddlEnv, AlfredDemangler


@ENVS.register(
    "alfworld",
    doc="ALFWorld household tasks as text (6 task types); official or generated games; planner or search expert",
    source="Shridhar et al. 2021 (ALFWorld); games via TextWorld's PDDL backend",
)
class AlfWorld(TextGameEnv):
    name = "alfworld"
    Options = AlfWorldOptions
    game_name = "a household task game"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._tw = None
        self._path: Path | None = None
        self._state = None
        self._plan: list[str] = []
        self._plan_key = ""
        self._walkthrough: list[str] = []
        self._search = _Search("")
        self.source, self._splits = self._resolve_source()

    def _resolve_source(self):
        o = self.options
        root = data_root(o)
        folders = {
            "train": split_dir(root, "train") if root else None,
            "heldout": split_dir(root, o.heldout_split) if root else None,
        }
        if o.source == "generated" or (o.source == "auto" and folders["train"] is None):
            return "generated", None
        if o.expert == "search":
            raise ValueError(
                f"env option expert='search' needs generated games (source: generated); the official "
                f"games under {str(root)!r} do not record the task's object. Allowed with official "
                "games: expert: planner"
            )
        missing = [s for s, f in folders.items() if f is None]
        if missing:
            raise ValueError(
                f"env option source={o.source!r}: ALFWorld split folders "
                f"{['train', o.heldout_split]} not found under data_dir="
                f"{str(root) if root else None!r}. {DOWNLOAD_HELP}"
            )
        splits = {s: list(official_games(str(f), tuple(o.task_types))) for s, f in folders.items()}
        if not splits["train"]:
            raise ValueError(
                f"no solvable ALFWorld games of types {o.task_types} under {folders['train']}. {DOWNLOAD_HELP}"
            )
        return "official", splits

    def close(self) -> None:
        self._tw, self._path, self._state, self._plan = None, None, None, []

    # -- games
    def task_type(self, seed: int) -> str:
        types = self.options.task_types
        return types[(seed // 2) % len(types)]

    def game_file(self, seed: int) -> Path:
        if self._splits is not None:
            return pick_file(self._splits, seed, f"ALFWorld data {data_root(self.options)}")
        o = self.options
        task_type = self.task_type(seed)
        folder = Path(o.cache_dir) / f"gen{GEN_VERSION}-r{o.max_receptacles}-d{o.nb_distractors}"
        folder.mkdir(parents=True, exist_ok=True)
        return cached_game(folder / f"seed{seed}-{task_type}.tw-pddl", lambda tmp: self._generate(seed, task_type, tmp))

    def _generate(self, seed: int, task_type: str, tmp: Path) -> Path:
        """Write one generated game, kept only if the planner's walkthrough wins it."""
        o = self.options
        self._path = None  # the interpreter is about to hold candidates, not a task
        for attempt in range(GENERATION_ATTEMPTS):
            data = alfworld_gen.make_game_data(seed, task_type, o.max_receptacles, o.nb_distractors, attempt)
            env = self._interpreter()
            env.load(data)
            env.reset()
            plan = env._pddl_state.replan(env._entity_infos)
            state = None
            for command in plan:
                state, _, _ = env.step(command)
            if plan and state is not None and state["won"]:
                data.update(solvable=True, walkthrough=plan)
                path = tmp / "game.tw-pddl"
                path.write_text(json.dumps(data))
                count("ALFWorld games generated and planned in this process (then cached on disk)")
                return path
        raise RuntimeError(
            f"could not generate a solvable ALFWorld {task_type} game for seed {seed} in {GENERATION_ATTEMPTS} attempts"
        )

    # -- interpreter
    def _interpreter(self):
        if self._tw is None:
            # `import alfworld` creates $ALFWORLD_DATA (default ~/.cache/alfworld) and sets the
            # variable for the whole process: both are kept to the import
            default = None if "ALFWORLD_DATA" in os.environ else str(Path(self.options.cache_dir) / "alfworld_data")
            with scoped_env("ALFWORLD_DATA", default):
                PddlEnv, AlfredDemangler = _alfworld_wrappers()
            import textworld

            infos = textworld.EnvInfos(admissible_commands=True, won=True)
            self._tw = AlfredDemangler(PddlEnv(infos), shuffle=False)
        return self._tw

    def _load(self, seed: int) -> tuple[str, GameView]:
        path = self.game_file(seed)
        env = self._interpreter()
        if path != self._path:
            env.load(str(path))
            self._path = path
            self._walkthrough = list(env._game_data.get("walkthrough") or [])
        self._state = env.reset()
        task = env._game_data.get("task") or {}
        self._search = _Search(str(task.get("object_target", "")), str(task.get("parent_target", "")))
        view = self._view(self._state["feedback"])
        self._plan, self._plan_key = list(self._walkthrough), view.state_key
        intro = compact_lines(self._state["feedback"].replace("-= Welcome to TextWorld, ALFRED! =-", ""))
        room, _, goal = intro.partition("Your task is to:")
        view.feedback = room.strip()
        return goal.strip() or "(no task text)", view

    def _apply(self, command: str) -> str:
        feedback = super()._apply(command)
        if self.options.goal_every_turn:
            feedback = f"{GOAL_HEADER} {self.goal}\n{feedback}"
        return feedback

    def _send(self, command: str) -> GameView:
        before = self.view.state_key
        self._state, _, _ = self._tw.step(command)
        view = self._view(self._state["feedback"])
        self._search.observe(self._state["feedback"])
        if self._plan and self._plan_key == before and self._plan[0] == command:
            self._plan, self._plan_key = self._plan[1:], view.state_key
        return view

    def _view(self, feedback: str) -> GameView:
        s = self._state
        commands = [c for c in s["admissible_commands"] if c not in HIDDEN_COMMANDS]
        facts = sorted(map(str, s["_facts"]))
        won = bool(s["won"])
        return GameView(
            feedback=compact_lines(feedback),
            commands=commands,
            points=float(won),
            max_points=1.0,
            won=won,
            lost=False,
            state_key=state_digest("/".join(self._path.parts[-3:]), facts),
        )

    def _holds(self) -> bool:
        return any(f.name == "holds" for f in self._state["_facts"])

    def _expert_command(self) -> str:
        if self.options.expert == "search" and not self._holds():
            command = self._search.next_command(self.view.commands)
            if command is not None:
                return command
        if not (self._plan and self._plan_key == self.view.state_key and self._plan[0] in self.view.commands):
            pddl = self._tw._pddl_state
            self._plan = list(pddl.replan(self._tw._entity_infos))
            self._plan_key = self.view.state_key
        if self._plan and self._plan[0] in self.view.commands:
            return self._plan[0]
        return "look"


# ----------------------------------------------------------------------------- search expert
_ARRIVE = re.compile(r"You arrive at (.+?)\.")
_OPEN = re.compile(r"You open the (.+?)\.")
_TAKEN = re.compile(r"You pick up the (.+?) from the (.+?)\.")
_PUT = re.compile(r"You (?:move|put) the (.+?) (?:to|in|on) the (.+?)\.")
_ITEM = re.compile(r"(?:a|an) ([a-z]+ \d+)")
_TAKE = re.compile(r"take ([a-z]+) \d+ from (.+)")
_RECEPTACLE_TYPE = {kind.lower(): kind for kind in alfworld_gen.C.RECEPTACLES}


def _kind(name: str) -> str:
    """'sinkbasin 1' -> 'SinkBasin' (ALFRED's type name, '' when unknown)."""
    return _RECEPTACLE_TYPE.get(name.rsplit(" ", 1)[0], "")


class _Search:
    """What an observation-only agent knows of one episode, and where it would look next.

    It reads only the feedback of the commands sent (arrivals, opened receptacles, objects
    picked up and put down) and the admissible commands; the target and goal receptacle are
    the ones the task text names."""

    def __init__(self, target: str, goal: str = ""):
        self.target_type, self.target, self.goal = target, target.lower(), goal
        self.here = ""
        self.contents: dict[str, set[str]] = {}  # receptacle -> objects last seen in it
        self.searched: set[str] = set()

    def observe(self, feedback: str) -> None:
        text = " ".join(feedback.split())
        if m := _ARRIVE.match(text):
            self.here = m[1]
            if "is closed" not in text:
                self._saw(m[1], text)
        elif m := _OPEN.match(text):
            self._saw(m[1], text)
        elif m := _TAKEN.match(text):
            self.contents.get(m[2], set()).discard(m[1])
        elif m := _PUT.match(text):
            self.contents.setdefault(m[2], set()).add(m[1])

    def _saw(self, receptacle: str, text: str) -> None:
        _, _, listed = text.partition("you see")
        self.contents[receptacle] = set(_ITEM.findall(listed))
        self.searched.add(receptacle)

    def _has_target(self, objects: set[str]) -> bool:
        return any(o.rsplit(" ", 1)[0] == self.target for o in objects)

    def _wanted(self, receptacle: str) -> bool:
        return _kind(receptacle) != self.goal

    def next_command(self, commands: list[str]) -> str | None:
        """The search step, or None when there is nothing left to search (the planner decides)."""
        if not self.target:
            return None
        for command in commands:
            m = _TAKE.fullmatch(command)
            if m and m[1] == self.target and self._wanted(m[2]):
                return command
        remembered = sorted(r for r, objs in self.contents.items() if self._wanted(r) and self._has_target(objs))
        places = [c[len("go to ") :] for c in commands if c.startswith("go to ")]
        for r in remembered:
            if r in places:
                return f"go to {r}"
        if self.here and self.here not in self.searched and f"open {self.here}" in commands:
            return f"open {self.here}"
        unsearched = [r for r in places if r not in self.searched and self._wanted(r)]
        likely = [r for r in unsearched if alfworld_gen.fits(self.target_type, _kind(r))]
        order = likely + [r for r in unsearched if r not in likely]
        return f"go to {order[0]}" if order else None
