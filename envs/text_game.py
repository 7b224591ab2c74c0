"""What the interpreter-backed text games (TextWorld, ALFWorld) share.

* Action formats. "text": the model writes a command; it is matched against the game's
  admissible commands after normalisation (lowercase, collapsed whitespace, no trailing
  period, optional `<answer>...</answer>` wrapper). "choice": the observation numbers the
  admissible commands and the model writes a number. Either way, text that does not map onto
  an admissible command is answered here ("Invalid action: ...") and never reaches the
  interpreter, whose C code (jericho's libfrotz) can crash the process on arbitrary input.
* Observations. The goal once, at reset; then the game's feedback with its banners and
  prompts stripped, the inventory when it changed, and the list of available actions.
* Scores. `score()` is the game's points over its maximum, in [0, 1] (`TurnEnv` turns its
  increments into dense rewards); `won()` / `over()` come from the game.
* Disk cache. Generated games are written once, atomically (temporary folder + rename) and
  under a per-game lock, so parallel workers never see or make a half-written game.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from pydantic import Field

from envs.base import EnvOptions, ParsedAction, TurnEnv, chat_example, prompt_field, unwrap_answer

ACTIONS_HEADER = "Available actions:"
GOAL_HEADER = "Goal:"
INVENTORY_HEADER = "Inventory:"


class TextGameOptions(EnvOptions):
    action_format: Literal["text", "choice"] = Field(
        "text",
        description="'text': write a command, matched against the admissible commands "
        "(lowercase, whitespace-normalised); 'choice': the commands are "
        "numbered in the observation and the action is a number",
    )
    prompt: Literal["terse", "chat"] = prompt_field()


@dataclass
class GameView:
    """The game as the agent sees it after reset or one command."""

    feedback: str  # cleaned narrative of the last command (or the room at reset)
    commands: list[str]  # admissible commands, in display order
    points: float = 0.0
    max_points: float = 1.0
    won: bool = False
    lost: bool = False
    state_key: str = ""  # equal for identical game states (GiGPO anchor)
    inventory: str | None = None  # compact inventory text, None when the game does not track it
    extra: dict = field(default_factory=dict)


def normalize_command(text: str) -> str:
    """Lowercase, collapse whitespace, drop a leading '>' and a trailing period or '!'."""
    text = " ".join(text.strip().lower().split())
    text = text.lstrip("> ").rstrip(".! ")
    return text.strip("'\"` ")


def clip(text: str, n: int = 40) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[:n] + "..."


def compact_lines(text: str) -> str:
    """Strip every line and drop blank ones (TextWorld pads its output with newlines)."""
    return "\n".join(line.strip() for line in text.splitlines() if line.strip())


def state_digest(*parts: object) -> str:
    h = hashlib.blake2b(digest_size=12)
    for part in parts:
        h.update(repr(part).encode())
        h.update(b"\x00")
    return h.hexdigest()


class TextGameEnv(TurnEnv):
    """`TurnEnv` for games with admissible commands; subclasses fill `self.view`.

    Subclasses implement `_load(seed) -> (goal, view)`, `_send(command) -> view` (only ever
    called with an admissible command) and `_expert_command() -> command`.
    """

    observation_markers = ("Invalid action", ACTIONS_HEADER, GOAL_HEADER, INVENTORY_HEADER)
    game_name = "a text game"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.view: GameView | None = None
        self.goal = ""

    # -- what subclasses provide
    def _load(self, seed: int) -> tuple[str, GameView]:
        raise NotImplementedError

    def _send(self, command: str) -> GameView:
        raise NotImplementedError

    def _expert_command(self) -> str:
        raise NotImplementedError

    # -- TurnEnv hooks
    @property
    def instructions(self) -> str:
        if self.chat:
            return self._chat_instructions()
        text = f"You are playing {self.game_name}. Reach the goal. Each turn, reply with one of the available actions"
        if self.options.action_format == "choice":
            return text + ": write only its number."
        return text + ", written exactly as listed."

    def _chat_instructions(self) -> str:
        """docs/algorithms.md#chat-prompts: the task, one available action per reply, a worked example."""
        commands = ["go north", "take apple", "look"]
        if self.options.action_format == "choice":
            shown = "\n".join([ACTIONS_HEADER] + [f"{i}. {c}" for i, c in enumerate(commands, 1)])
            reply = "2"
        else:
            shown, reply = f"{ACTIONS_HEADER} {' | '.join(commands)}", "take apple"
        example = chat_example((f"{GOAL_HEADER} eat the apple\nThere is an apple here.\n{shown}", reply))
        return (
            f"You are playing {self.game_name}. Reach the goal. Each turn you read what happened and the "
            f"available actions.\n{self.reply_cue()}\n{example}"
        )

    def reply_cue(self) -> str:
        if self.options.action_format == "choice":
            return "Reply with the number of one available action, and nothing else."
        return "Reply with one available action, copied exactly, and nothing else."

    def _new_task(self, seed: int) -> None:
        self.goal, self.view = self._load(seed)

    def reset(self, seed: int):
        observation, info = super().reset(seed)
        inventory = self.view.inventory
        parts = [f"{GOAL_HEADER} {self.goal}", self.view.feedback]
        if inventory and inventory != "nothing":
            parts.append(f"{INVENTORY_HEADER} {inventory}")
        return "\n".join(parts + [observation]), info

    def _apply(self, command: str) -> str:
        before = self.view.inventory
        self.view = self._send(command)
        feedback = self.view.feedback
        if self.view.inventory is not None and self.view.inventory != before:
            feedback += f"\n{INVENTORY_HEADER} {self.view.inventory}"
        return feedback

    def render(self) -> str:
        commands = self.view.commands
        if self.over():
            return "You won." if self.view.won else "Game over."
        if self.options.action_format == "choice":
            return "\n".join([ACTIONS_HEADER] + [f"{i}. {c}" for i, c in enumerate(commands, 1)])
        return f"{ACTIONS_HEADER} {' | '.join(commands)}"

    def score(self) -> float:
        v = self.view
        return 1.0 if v.won else max(0.0, min(1.0, v.points / max(v.max_points, 1e-9)))

    def won(self) -> bool:
        return self.view.won

    def over(self) -> bool:
        return self.view.won or self.view.lost

    def state_key(self) -> str:
        return self.view.state_key

    def admissible(self) -> list[str]:
        """What the model may write now: the commands ("text") or their numbers ("choice")."""
        if self.options.action_format == "choice":
            return [str(i) for i in range(1, len(self.view.commands) + 1)]
        return list(self.view.commands)

    def info(self, format_error: bool = False) -> dict:
        info = super().info(format_error)
        info["commands"] = list(self.view.commands)
        return info

    def parse_action(self, text: str) -> ParsedAction:
        if self.view is None:
            raise RuntimeError("parse_action() before reset()")
        answer = unwrap_answer(text if isinstance(text, str) else "")
        commands = self.view.commands
        if self.options.action_format == "choice":
            digits = answer.strip().rstrip(".)")
            if digits.isdigit() and 1 <= int(digits) <= len(commands):
                return ParsedAction(commands[int(digits) - 1], False)
            return ParsedAction(None, True, f"{clip(answer)!r} is not a number from 1 to {len(commands)}.")
        wanted = normalize_command(answer)
        for command in commands:
            if normalize_command(command) == wanted:
                return ParsedAction(command, False)
        if not wanted:
            return ParsedAction(None, True, "empty action.")
        return ParsedAction(None, True, f"{clip(answer)!r} is not an available action.")

    def expert_action(self) -> str:
        command = self._expert_command()
        if self.options.action_format == "choice":
            return str(self.view.commands.index(command) + 1)
        return command


# ----------------------------------------------------------------------------- disk cache
@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """An exclusive advisory lock held while the block runs (one game generated once)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def cached_game(target: Path, build: Callable[[Path], Path], companions: tuple[str, ...] = ()) -> Path:
    """`target` if it exists; else `build(tmp_dir) -> built file` and move it into place.

    Companion files (same stem, other suffixes, e.g. TextWorld's `.json`) are moved before
    the target, so the target's existence means the whole game is there.
    """
    if target.is_file():
        return target
    with file_lock(target.with_name(target.name + ".lock")):
        if target.is_file():  # another process made it while we waited
            return target
        tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=target.parent))
        try:
            built = build(tmp)
            for suffix in companions:
                os.replace(built.with_suffix(suffix), target.with_suffix(suffix))
            os.replace(built, target)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return target


_ENV_LOCK = threading.RLock()


@contextlib.contextmanager
def scoped_env(name: str, value: str | None) -> Iterator[None]:
    """Set the environment variable `name` to `value` for the block only (None: leave it as it is,
    but still restore whatever the block sets), then put back what was there, even on an error.
    Held under a lock, so two threads never interleave their changes."""
    with _ENV_LOCK:
        old = os.environ.get(name)
        if value is not None:
            os.environ[name] = value
        try:
            yield
        finally:
            if old is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = old


@contextlib.contextmanager
def home_dir(path: Path) -> Iterator[None]:
    """Point $HOME at `path` for the block: TextWorld's Inform 7 compiler (a subprocess that
    inherits the environment) writes under $HOME, which may be missing or read-only on cluster nodes."""
    path.mkdir(parents=True, exist_ok=True)
    with scoped_env("HOME", str(path)):
        yield


def split_files(files: list[Path], heldout_fraction: float) -> dict[str, list[Path]]:
    """Deterministic train / held-out split of a game folder by a hash of each file name
    (adding files never moves an existing one); both splits non-empty when >= 2 files."""
    heldout = [f for f in files if int(hashlib.sha1(f.name.encode()).hexdigest()[:8], 16) / 16**8 < heldout_fraction]
    train = [f for f in files if f not in heldout]
    if len(files) >= 2 and not heldout:
        heldout, train = train[-1:], train[:-1]
    if len(files) >= 2 and not train:
        train, heldout = heldout[:1], heldout[1:]
    return {"train": train, "heldout": heldout}


def pick_file(splits: dict[str, list[Path]], seed: int, where: str) -> Path:
    """The game of task `seed`: even seeds play train games, odd seeds held-out games
    (the default `Env.task_seeds`); seed 2k (2k+1) plays game k of its split, cyclically."""
    split = "train" if seed % 2 == 0 else "heldout"
    files = splits[split]
    if not files:
        raise ValueError(
            f"no {split} games in {where}; seeds {'even' if split == 'train' else 'odd'} "
            f"need at least one (found {sum(map(len, splits.values()))} game files)"
        )
    return files[(seed // 2) % len(files)]


_WS = re.compile(r"[ \t]+")


def squeeze(text: str) -> str:
    return _WS.sub(" ", text).strip()
