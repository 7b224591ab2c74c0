"""The environment protocol every reference environment implements.

An environment instance plays one episode at a time. A *task* is identified by an integer
seed: `reset(seed)` always builds the same task for the same seed and options. Train and
held-out tasks come from disjoint seed sets (`task_seeds`). Rollouts give every episode of a
group its own instance, so instances never share mutable state.

`TurnEnv` holds the step mechanics the reference environments share (parse -> format error
or apply -> reward from the score); `parse_choice` / `render_turn` are the shared text helpers.
"""

from __future__ import annotations

import hashlib
import re
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field

SPLITS = ("train", "heldout")
REWARD_DENSITIES = ("sparse", "dense")
INFO_KEYS = ("won", "score", "admissible", "state_key", "format_error")
INVALID_PREFIX = "Invalid action"  # starts every format-error observation


_HELDOUT_FLAGS: dict[tuple, bytearray] = {}  # (Env class, options json) -> flag per seed


class EnvOptions(BaseModel):
    """Base class of every environment's options; unknown keys are errors, floats must be finite."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


def prompt_field():
    """The `prompt` option (docs/algorithms.md#chat-prompts): the environments that have chat prompts
    declare it as `prompt: Literal["terse", "chat"] = prompt_field()`."""
    return Field(
        "terse",
        description="'terse': the short instructions the tiny models learn from; 'chat': prompts a pretrained "
        "chat model can follow (the task, the reply format with a worked example, and a line after every "
        "observation restating what to reply and the choices; docs/algorithms.md#chat-prompts)",
    )


@dataclass
class StepResult:
    observation: str
    reward: float
    done: bool
    info: dict[str, Any] = field(default_factory=dict)


@dataclass
class ParsedAction:
    """What `parse_action` makes of the model's text: the action or a format error."""

    action: str | None
    format_error: bool
    message: str = ""  # why the text could not be parsed (shown to the agent)


class Env(ABC):
    """One episode at a time.

    `info` returned by reset/step always carries:
      won (bool), score (float), admissible (list[str] or None), state_key (str, equal
      for identical environment states; GiGPO's anchor state), format_error (bool).
    Rewards: `reward_density="sparse"` gives the outcome (1.0 on success) at the last step
    only; "dense" gives score increments every step.
    """

    name: ClassVar[str]
    Options: ClassVar[type[EnvOptions]] = EnvOptions
    # Strings that only the environment writes (e.g. "Observation:"); an action containing
    # one is counted as a hallucinated observation.
    observation_markers: ClassVar[tuple[str, ...]] = ()

    def __init__(
        self, options: EnvOptions | dict | None = None, reward_density: str = "sparse", format_penalty: float = 0.0
    ):
        if not isinstance(options, EnvOptions):
            options = self.Options(**(options or {}))
        if reward_density not in REWARD_DENSITIES:
            raise ValueError(f"reward_density must be one of {REWARD_DENSITIES}, got {reward_density!r}")
        self.options = options
        self.reward_density = reward_density
        self.format_penalty = float(format_penalty)

    @property
    @abstractmethod
    def instructions(self) -> str:
        """The task-independent instruction text (system prompt)."""

    @abstractmethod
    def reset(self, seed: int) -> tuple[str, dict[str, Any]]:
        """Start the task identified by `seed`; return (first observation, info)."""

    @abstractmethod
    def step(self, text: str) -> StepResult:
        """Apply the model's raw text. Unparsable text is a format error, never an exception."""

    @abstractmethod
    def parse_action(self, text: str) -> ParsedAction:
        """Extract the action from the model's text."""

    @abstractmethod
    def expert_action(self) -> str:
        """The expert's action text for the current state (as the model should write it)."""

    def task_type(self, seed: int) -> str:
        """The kind of task `seed` plays (`algo.adv.norm: task` standardises per kind); one kind
        per environment unless the environment has several (ALFWorld's six task types)."""
        return self.name

    def env_label(self, seed: int) -> str:
        """The environment task `seed` comes from, as metrics and `env_std` name it (a mixture's member)."""
        return self.name

    @classmethod
    def markers_for(cls, options: EnvOptions | dict | None = None) -> tuple[str, ...]:
        """The observation markers of this environment with `options` (a mixture: its members')."""
        return tuple(cls.observation_markers)

    @classmethod
    def demo_seeds(cls, n: int, options: EnvOptions | dict | None = None) -> list[int]:
        """The train tasks expert demonstrations are taken from, in order (pre-training, SFT)."""
        return cls.task_seeds("train", n, options)

    @classmethod
    def cache_options(cls, options: EnvOptions | dict | None = None) -> dict:
        """The options that decide demonstrations and models built from them (cache keys)."""
        if not isinstance(options, EnvOptions):
            options = cls.Options(**(options or {}))
        return options.model_dump()

    def close(self) -> None:  # noqa: B027 - an optional hook: most environments hold nothing to release
        """Release external resources (an interpreter process, files); the default has none."""

    @classmethod
    def task_seeds(cls, split: str, n: int, options: EnvOptions | dict | None = None) -> list[int]:
        """`n` task seeds of `split`; the train and heldout sets never intersect.

        Default: even seeds train, odd seeds held out. An env whose distinct seeds can build
        the same task (small maps) defines `task_fingerprint`; seeds are then split by a hash
        of the task content (1 in 4 contents held out), so no held-out task is a train task."""
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        if not isinstance(options, EnvOptions):
            options = cls.Options(**(options or {}))
        if cls.task_fingerprint(0, options) is None:
            offset = 0 if split == "train" else 1
            return [2 * k + offset for k in range(n)]
        # split flags of seeds 0, 1, ... computed once per (env, options), then extended
        flags = _HELDOUT_FLAGS.setdefault((cls, options.model_dump_json()), bytearray())
        held = split == "heldout"
        seeds = [s for s, flag in enumerate(flags) if flag == held][:n]
        while len(seeds) < n:
            flags.append(cls.split_of(len(flags), options) == "heldout")
            if flags[-1] == held:
                seeds.append(len(flags) - 1)
        return seeds

    @classmethod
    def task_fingerprint(cls, seed: int, options: EnvOptions) -> str | None:
        """The content of task `seed` (e.g. its map) or None when every seed is its own task."""
        return None

    @classmethod
    def split_of(cls, seed: int, options: EnvOptions | dict | None = None) -> str:
        """The split task `seed` belongs to (see `task_seeds`)."""
        if not isinstance(options, EnvOptions):
            options = cls.Options(**(options or {}))
        fingerprint = cls.task_fingerprint(seed, options)
        if fingerprint is None:
            return SPLITS[seed % 2]
        digest = hashlib.blake2b(fingerprint.encode(), digest_size=8).digest()
        return "heldout" if digest[0] % 4 == 0 else "train"


# ----------------------------------------------------------------------------- text helpers
_ANSWER = re.compile(r"\s*<answer>(.*?)</answer>\s*", re.S)


def unwrap_answer(text: str) -> str:
    """`<answer>x</answer>` -> `x` (whole text only); anything else is returned stripped."""
    m = _ANSWER.fullmatch(text)
    return (m.group(1) if m else text).strip()


def parse_choice(text: str, choices: tuple[str, ...] | list[str]) -> ParsedAction:
    """One word out of `choices` (case-insensitive), bare or inside `<answer>...</answer>`."""
    word = unwrap_answer(text).lower()
    if word in choices:
        return ParsedAction(word, False)
    shown = word if len(word) <= 20 else word[:20] + "..."
    return ParsedAction(None, True, f"{shown!r} is not one of: {', '.join(choices)}")


def render_turn(state: str, feedback: str = "") -> str:
    """One observation: an optional feedback line above the state text."""
    return f"{feedback}\n{state}" if feedback else state


def format_action(action: str, action_format: str) -> str:
    """The expert's action as the model should write it ("text": bare, "answer": wrapped)."""
    return f"<answer>{action}</answer>" if action_format == "answer" else action


def one_of(choices: tuple[str, ...] | list[str]) -> str:
    """'up, down, left or right'."""
    return ", ".join(choices[:-1]) + f" or {choices[-1]}" if len(choices) > 1 else "".join(choices)


def chat_example(*turns: tuple[str, str]) -> str:
    """A worked example for chat instructions: `user: ...` / `assistant: ...` lines, one pair per turn."""
    return "Example:\n" + "\n".join(f"user: {user}\nassistant: {reply}" for user, reply in turns)


# ----------------------------------------------------------------------------- step mechanics
class TurnEnv(Env):
    """Shared episode mechanics for environments with a scalar progress score in [0, 1].

    Subclasses implement `_new_task(seed)`, `_apply(action) -> feedback`, `render()`,
    `score()`, `won()`, `over()`, `state_key()`, `admissible()`, `parse_action`, `expert_action`.
    Rewards: a format error gives `-format_penalty` and leaves the state unchanged; otherwise
    "sparse" gives 1.0 on the step that ends the episode with a win, else 0; "dense" gives the
    score increment of the step, so an episode's dense rewards sum to final - initial score.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._done = True
        self._seed: int | None = None

    @abstractmethod
    def _new_task(self, seed: int) -> None: ...
    @abstractmethod
    def _apply(self, action: str) -> str: ...
    @abstractmethod
    def render(self) -> str: ...
    @abstractmethod
    def score(self) -> float: ...
    @abstractmethod
    def won(self) -> bool: ...
    @abstractmethod
    def over(self) -> bool: ...
    @abstractmethod
    def state_key(self) -> str: ...

    def admissible(self) -> list[str] | None:
        return None

    @property
    def chat(self) -> bool:
        """True when the options ask for chat prompts (docs/algorithms.md#chat-prompts)."""
        return getattr(self.options, "prompt", "terse") == "chat"

    def reply_cue(self) -> str:
        """Chat prompts: the line closing every observation, saying what to reply (overridden)."""
        return ""

    def shown(self, text: str) -> str:
        """An observation as the agent sees it: with chat prompts, the reply cue on a last line while
        the episode goes on; unchanged otherwise."""
        cue = self.reply_cue() if self.chat and not self._done else ""
        return f"{text}\n{cue}" if cue else text

    def info(self, format_error: bool = False) -> dict[str, Any]:
        return {
            "won": self.won(),
            "score": self.score(),
            "admissible": self.admissible(),
            "state_key": self.state_key(),
            "format_error": format_error,
        }

    def reset(self, seed: int) -> tuple[str, dict[str, Any]]:
        self._seed = int(seed)
        self._new_task(self._seed)
        self._done = False
        return self.shown(self.render()), self.info()

    def step(self, text: str) -> StepResult:
        if self._done:
            raise RuntimeError(f"{type(self).__name__}: step() after the episode ended; call reset(seed) first")
        parsed = self.parse_action(text if isinstance(text, str) else "")
        if parsed.format_error:
            feedback = f"{INVALID_PREFIX}: {parsed.message}"
            return StepResult(
                self.shown(render_turn(self.render(), feedback)),
                -self.format_penalty,
                False,
                self.info(format_error=True),
            )
        before = self.score()
        feedback = self._apply(parsed.action)
        self._done = self.over()
        if self.reward_density == "dense":
            reward = round(self.score() - before, 12)  # 0.1 stays 0.1, not 0.0999...
        else:
            reward = 1.0 if self._done and self.won() else 0.0
        return StepResult(self.shown(render_turn(self.render(), feedback)), reward, self._done, self.info())
