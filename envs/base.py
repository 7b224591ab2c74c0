"""The environment protocol every reference environment implements.

An environment instance plays one episode at a time. A *task* is identified by an integer
seed: `reset(seed)` always builds the same task for the same seed and options. Train and
held-out tasks come from disjoint seed sets (`task_seeds`). Rollouts give every episode of a
group its own instance, so instances never share mutable state.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict

SPLITS = ("train", "heldout")


class EnvOptions(BaseModel):
    """Base class of every environment's options; unknown keys are errors."""

    model_config = ConfigDict(extra="forbid")


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

    def __init__(self, options: EnvOptions | dict | None = None, reward_density: str = "sparse",
                 format_penalty: float = 0.0):
        if not isinstance(options, EnvOptions):
            options = self.Options(**(options or {}))
        self.options = options
        self.reward_density = reward_density
        self.format_penalty = format_penalty

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

    @classmethod
    def task_seeds(cls, split: str, n: int, options: EnvOptions | dict | None = None) -> list[int]:
        """`n` task seeds of `split`; the train and heldout sets never intersect."""
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        offset = 0 if split == "train" else 1
        return [2 * k + offset for k in range(n)]
