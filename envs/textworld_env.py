"""TextWorld: generated text adventures (Côté et al. 2018), one game per task seed.

Games are made through TextWorld's Python API from (world_size, nb_objects, quest_length) —
"w2-o3-q4" is the Practitioner's Guide setting — and cached on disk by (parameters, seed):
`<cache_dir>/w2-o3-q4-tw<version>/seed<N>.z8` with its `.json`. An existing game is never
regenerated. With `game_dir`, the tasks are the `.z8` games of that folder instead (each next
to its `.json`), split into train / held-out by a hash of the file name.

Train tasks are the even seeds, held-out tasks the odd ones (`Env.task_seeds`).
Expert: TextWorld's winning policy from the current state (the walkthrough while on track,
re-derived by its quest tracker after a detour), checked against the admissible commands;
a breadth-first search over the game's logic state takes over if that policy is ever stale.
Score: points / max points (a generated game has one quest worth 1 point, so dense == sparse
there) or, with `score: progress`, 1 - (steps of the winning policy left) / (its length at
reset), which rewards every step toward the goal and penalises detours.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import re
import warnings
from collections import deque
from pathlib import Path
from typing import Literal

from pydantic import Field

from envs.registry import ENVS
from envs.stage import count
from envs.text_game import (
    GameView,
    TextGameEnv,
    TextGameOptions,
    cached_game,
    compact_lines,
    home_dir,
    pick_file,
    split_files,
    state_digest,
)

if importlib.util.find_spec("textworld") is None:  # textworld itself is imported on first use
    raise ImportError("the textworld package is not installed (pip install textworld)")
TEXTWORLD_VERSION = importlib.metadata.version("textworld")
GENERATION_ATTEMPTS = 20  # quest generation can fail for a seed; retry with derived seeds
SEARCH_NODES = 50_000  # budget of the breadth-first fallback expert


class TextWorldOptions(TextGameOptions):
    world_size: int = Field(2, ge=1, le=64, description="number of rooms (tw-make --world-size)")
    nb_objects: int = Field(
        3, ge=0, le=200, description="number of objects, including those the quest needs (tw-make --nb-objects)"
    )
    quest_length: int = Field(4, ge=1, le=32, description="actions in the winning walkthrough (tw-make --quest-length)")
    cache_dir: str = Field(
        "results/.cache/textworld", description="where generated games are cached (made once, atomically)"
    )
    game_dir: str | None = Field(
        None, description="play the .z8 games (with their .json) of this folder instead of generating games"
    )
    heldout_fraction: float = Field(
        0.2, gt=0, lt=1, description="share of game_dir games held out (by a hash of the file name)"
    )
    score: Literal["points", "progress"] = Field(
        "points",
        description="what dense rewards are increments of: the game's points / max "
        "points, or progress = 1 - winning-policy steps left / at reset",
    )


def game_path(options: TextWorldOptions, seed: int) -> Path:
    """The cached game of task `seed` (generated on first use)."""
    tag = f"w{options.world_size}-o{options.nb_objects}-q{options.quest_length}-tw{TEXTWORLD_VERSION}"
    target = Path(options.cache_dir) / tag / f"seed{seed}.z8"
    target.parent.mkdir(parents=True, exist_ok=True)

    def build(tmp: Path) -> Path:
        with home_dir(Path(options.cache_dir) / ".home"):  # Inform 7 writes $HOME/Inform
            return _generate(options, seed, tmp / "game.z8")

    return cached_game(target, build, companions=(".json",))


def _generate(options: TextWorldOptions, seed: int, path: Path) -> Path:
    import textworld
    from textworld.generator import compile_game, make_game
    from textworld.generator.chaining import QuestGenerationError

    last_error: Exception | None = None
    for attempt in range(GENERATION_ATTEMPTS):
        game_options = textworld.GameOptions()
        game_options.seeds = seed + attempt * 1_000_003
        game_options.nb_rooms = options.world_size
        game_options.nb_objects = options.nb_objects
        game_options.quest_length = options.quest_length
        game_options.path = str(path)
        game_options.file_ext = ".z8"
        try:
            game = make_game(game_options)
        except QuestGenerationError as e:
            last_error = e
            continue
        if not game.metadata.get("walkthrough"):
            last_error = RuntimeError("the generated game has no walkthrough")
            continue
        out = Path(compile_game(game, game_options))
        count("TextWorld games generated in this process (then cached on disk)")
        return out
    raise RuntimeError(
        f"TextWorld could not generate a game for seed {seed} with world_size="
        f"{options.world_size}, nb_objects={options.nb_objects}, quest_length="
        f"{options.quest_length} in {GENERATION_ATTEMPTS} attempts; make the quest "
        f"shorter or the world bigger. Last error: {last_error}"
    )


_BANNER_END = re.compile(r"\n-= .+ =-\n")  # the first room header ends the intro banner
_PROMPT = re.compile(r"\n>[^\n]*$")  # trailing prompt and status line
_THE_END = re.compile(r"\*\*\* The End \*\*\*.*", re.S)
_BOILERPLATE = re.compile(r"TextWorld|Here is how to play|Here is your task|^You do!$")
_SENTENCE = re.compile(r"(?<=[.!?])\s+")


def clean_feedback(text: str) -> str:
    text = _THE_END.sub("", _PROMPT.sub("", text or ""))
    return compact_lines(text)


def clean_objective(text: str) -> str:
    """Drop the greeting sentences TextWorld puts before the task ("Welcome to TextWorld!")."""
    sentences = _SENTENCE.split(" ".join(text.split()))
    while len(sentences) > 1 and _BOILERPLATE.search(sentences[0]):
        sentences.pop(0)
    return " ".join(sentences)


def clean_inventory(text: str) -> str:
    """ "You are carrying:\n  a key\n  a cane" -> "a key, a cane"; nothing -> "nothing"."""
    text = " ".join((text or "").split())
    text = re.sub(r"^You are carrying:?\s*", "", text).rstrip(".")
    return text or "nothing"


@ENVS.register(
    "textworld",
    doc="TextWorld generated text adventures (w2-o3-q4 by default); "
    "walkthrough expert; text or numbered-choice actions",
    source="Côté et al. 2018 (TextWorld); settings of the Practitioner's Guide to "
    "multi-turn agentic RL (w2-o3-q4, w4-o6-q8, w8-o12-q4)",
)
class TextWorld(TextGameEnv):
    name = "textworld"
    Options = TextWorldOptions
    game_name = "a text adventure game"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._env = None
        self._path: Path | None = None
        self._state = None
        self._policy_length = 1
        self._splits = None
        if self.options.game_dir is not None:
            folder = Path(self.options.game_dir)
            files = sorted(p for p in folder.glob("*.z8") if p.with_suffix(".json").is_file())
            if not files:
                raise ValueError(
                    f"env option game_dir={str(folder)!r}: no .z8 game with its .json "
                    "found (TextWorld >= 1.7 plays .z8 games; regenerate .ulx games "
                    "with `tw-make ... --format z8`)"
                )
            self._splits = split_files(files, self.options.heldout_fraction)

    def close(self) -> None:
        if self._env is not None:
            self._env.close()
        self._env, self._path, self._state = None, None, None

    def game_dir_seeds(self) -> list[int]:
        """One task seed per game of `game_dir` (both splits: even seeds train, odd held out)."""
        if self._splits is None:
            raise ValueError("game_dir_seeds needs the env option game_dir")
        return [2 * k for k in range(len(self._splits["train"]))] + [
            2 * k + 1 for k in range(len(self._splits["heldout"]))
        ]

    def game_file(self, seed: int) -> Path:
        if self._splits is not None:
            return pick_file(self._splits, seed, f"game_dir {self.options.game_dir!r}")
        return game_path(self.options, seed)

    # -- interpreter
    def _load(self, seed: int) -> tuple[str, GameView]:
        path = self.game_file(seed)
        with warnings.catch_warnings():  # jericho: "not fully supported" (TextWorld games are)
            warnings.filterwarnings("ignore", message=".*is not fully supported")
            if self._env is None:
                import textworld

                infos = textworld.EnvInfos(
                    admissible_commands=True,
                    policy_commands=True,
                    score=True,
                    max_score=True,
                    won=True,
                    lost=True,
                    inventory=True,
                    objective=True,
                )
                self._env = textworld.start(str(path), request_infos=infos)
            elif path != self._path:
                self._env.load(str(path))
        self._path = path
        self._state = self._env.reset()
        self._policy_length = max(1, len(self._state["policy_commands"] or ()))
        feedback = self._state["feedback"]
        match = _BANNER_END.search(feedback)
        feedback = feedback[match.start() :] if match else feedback
        return clean_objective(self._state["objective"] or ""), self._view(feedback)

    def _send(self, command: str) -> GameView:
        self._state, _, _ = self._env.step(command)
        return self._view(self._state["feedback"])

    def _view(self, feedback: str) -> GameView:
        s = self._state
        points, max_points = float(s["score"] or 0), float(s["max_score"] or 1)
        if self.options.score == "progress":  # no known way to win (lost): no progress
            left = 0 if s["won"] else len(s["policy_commands"] or ()) or self._policy_length
            points, max_points = self._policy_length - left, self._policy_length
        facts = sorted(map(str, s["_facts"]))
        return GameView(
            feedback=clean_feedback(feedback),
            commands=list(s["admissible_commands"]),
            points=points,
            max_points=max_points,
            won=bool(s["won"]),
            lost=bool(s["lost"]),
            inventory=clean_inventory(s["inventory"]),
            state_key=state_digest(self._path.name, facts),
        )

    # -- expert
    def _expert_command(self) -> str:
        policy = self._state["policy_commands"] or []
        if policy and policy[0] in self.view.commands and self._policy_is_valid():
            return policy[0]
        plan = self._search()
        if plan:
            return plan[0]
        return "look" if "look" in self.view.commands else self.view.commands[0]

    def _policy_is_valid(self) -> bool:
        progression = self._state["_game_progression"]
        policy = self._state["_winning_policy"]
        if progression is None or not policy:
            return False
        state = progression.state.copy()
        if not state.is_sequence_applicable(policy):
            return False
        for action in policy:
            state.apply(action)
        return self._quests_done(state)

    def _quests_done(self, state) -> bool:
        quests = [q for q in self._state["_game_progression"].game.quests if not q.optional]
        return all(any(e.is_triggering(state) for e in q.win_events) for q in quests)

    def _search(self) -> list[str] | None:
        """Shortest command sequence to a won state (breadth-first over logic states)."""
        progression = self._state["_game_progression"]
        if progression is None:
            return None
        game = progression.game
        rules, constants = game.kb.rules.values(), game.kb.types.constants_mapping
        start = progression.state.copy()
        seen, queue = {frozenset(start.facts)}, deque([(start, [])])
        while queue and len(seen) < SEARCH_NODES:
            state, plan = queue.popleft()
            for action in state.all_applicable_actions(rules, constants):
                nxt = state.copy()
                nxt.apply(action)
                key = frozenset(nxt.facts)
                if key in seen:
                    continue
                seen.add(key)
                if self._quests_done(nxt):
                    return self._find_tracker()._inform7.gen_commands_from_actions(plan + [action])
                queue.append((nxt, plan + [action]))
        return None

    def _find_tracker(self):
        env = self._env
        while env is not None:
            if hasattr(env, "_inform7") and env._inform7 is not None:
                return env
            env = getattr(env, "_wrapped_env", None)
        raise RuntimeError("TextWorld state tracker not found")
