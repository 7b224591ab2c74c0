"""A weighted mixture of environments as one environment: multi-task training (AgentRL, KARL).

Users write `env.mixture: [{name, options, weight, label}, ...]` (the config resolves it to
`env.name: mixture` with these members as options). Every task belongs to one member, so a
group (one task, `rollout.group_size` episodes) is always from one environment, and the task's
type is the member's label: `algo.adv.norm: task` and `env_std` standardise per environment.

Task seeds. Mixture seed s encodes (member m, member seed t) as s = t * M + m, M members; each
member keeps its own seeded train / held-out split, so the mixture's splits are disjoint too.
- train: members in proportion to their weights, interleaved by smooth weighted round-robin (so
  every prefix is as close to the weights as integers allow: 4 tasks per update over weights
  1:1:1 cycle through the members); a member of weight 0 is never trained on;
- held-out: every member equally, weight 0 included (the weights are a training choice; the
  evaluation asks how well each environment is played), members interleaved;
- demonstrations (pre-training, SFT warm-up): every member equally, so every weighting of the
  same members starts from the same checkpoint (`cache_options` drops the weights).

Instructions differ per member: the reset info carries the member's instructions and the
rollout puts them in each episode's system prompt. `observation_markers` is the union of the
members'. A weight-0 member next to trained ones is how `sweeps/multitask.yaml` compares
single-environment training with the mixture on every environment's held-out tasks.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, field_validator, model_validator

from envs.base import SPLITS, Env, EnvOptions, ParsedAction, StepResult
from envs.registry import ENVS, env_class, make_env, validate_options

MIXTURE = "mixture"


class MixtureMember(EnvOptions):
    name: str = Field(description="a registered environment (`harness envs`), not mixture")
    options: dict[str, Any] = Field(default_factory=dict, description="that environment's options")
    weight: float = Field(
        1.0, ge=0, description="share of training groups (normalised over members); 0 = held out only"
    )
    label: str = Field("", description="the member's name in metrics and task types (default: its env name)")

    @field_validator("name")
    @classmethod
    def _known(cls, name: str) -> str:
        if name == MIXTURE:
            raise ValueError("a mixture cannot contain a mixture")
        env_class(name)  # UnknownChoiceError (a KeyError) lists the environments
        return name

    @model_validator(mode="after")
    def _member_options(self) -> MixtureMember:
        self.options = validate_options(self.name, self.options).model_dump(mode="json")
        if not self.label:
            self.label = self.name
        return self


class MixtureOptions(EnvOptions):
    members: list[MixtureMember] = Field(
        default_factory=list,
        description="the environments mixed; set them as env.mixture: [{name, options, weight, label}, ...]",
    )

    @model_validator(mode="after")
    def _check(self) -> MixtureOptions:
        if not self.members:
            raise ValueError("a mixture needs at least one member (env.mixture)")
        labels = [m.label for m in self.members]
        if len(set(labels)) != len(labels):
            raise ValueError(f"member labels must differ (give `label` to repeated envs): {labels}")
        if not any(m.weight > 0 for m in self.members):
            raise ValueError("at least one member needs a weight > 0 (weight 0 = evaluated, never trained)")
        return self


def _round_robin(weights: list[float], n: int) -> list[int]:
    """Smooth weighted round-robin: n member indices, each prefix as close to the weights as
    integers allow; members of weight 0 never appear."""
    total = sum(weights)
    current = [0.0] * len(weights)
    out = []
    for _ in range(n):
        for i, w in enumerate(weights):
            current[i] += w
        best = max(range(len(weights)), key=lambda i: (current[i], -i))
        current[best] -= total
        out.append(best)
    return out


@ENVS.register(
    MIXTURE,
    doc="weighted mixture of environments (env.mixture); each group from one member; per-env metrics",
    source="multi-task agentic RL: AgentRL (Zhang et al. 2025), KARL",
)
class Mixture(Env):
    name = MIXTURE
    Options = MixtureOptions

    def __init__(self, options=None, reward_density: str = "sparse", format_penalty: float = 0.0):
        super().__init__(options, reward_density, format_penalty)
        self._kwargs = {"reward_density": reward_density, "format_penalty": format_penalty}
        self._envs: dict[int, Env] = {}  # built on first use
        self._current: Env | None = None
        self.observation_markers = self.markers_for(self.options)

    # ------------------------------------------------------------------ seeds
    @classmethod
    def _opts(cls, options) -> MixtureOptions:
        return options if isinstance(options, MixtureOptions) else MixtureOptions(**(options or {}))

    @classmethod
    def decode(cls, seed: int, options) -> tuple[int, int]:
        """(member index, member seed) of mixture task `seed`."""
        M = len(cls._opts(options).members)
        return seed % M, seed // M

    @classmethod
    def _interleaved(cls, split: str, order: list[int], options: MixtureOptions) -> list[int]:
        M = len(options.members)
        counts = [order.count(i) for i in range(M)]
        member_seeds = [
            env_class(m.name).task_seeds(split, c, m.options) if c else [] for m, c in zip(options.members, counts)
        ]
        taken = [0] * M
        out = []
        for i in order:
            out.append(member_seeds[i][taken[i]] * M + i)
            taken[i] += 1
        return out

    @classmethod
    def task_seeds(cls, split: str, n: int, options=None) -> list[int]:
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        o = cls._opts(options)
        weights = [m.weight for m in o.members] if split == "train" else [1.0] * len(o.members)
        return cls._interleaved(split, _round_robin(weights, n), o)

    @classmethod
    def demo_seeds(cls, n: int, options=None) -> list[int]:
        o = cls._opts(options)
        return cls._interleaved("train", _round_robin([1.0] * len(o.members), n), o)

    @classmethod
    def split_of(cls, seed: int, options=None) -> str:
        o = cls._opts(options)
        m, t = cls.decode(seed, o)
        return env_class(o.members[m].name).split_of(t, o.members[m].options)

    @classmethod
    def cache_options(cls, options) -> dict:
        """Options that decide demonstrations and models: the members without their weights."""
        dump = cls._opts(options).model_dump(mode="json")
        for m in dump["members"]:
            m.pop("weight")
        return dump

    @classmethod
    def markers_for(cls, options) -> tuple[str, ...]:
        markers: list[str] = []
        for m in cls._opts(options).members:
            markers += [x for x in env_class(m.name).markers_for(m.options) if x not in markers]
        return tuple(markers)

    def labels(self) -> list[str]:
        return [m.label for m in self.options.members]

    def member_label(self, seed: int) -> str:
        return self.options.members[self.decode(seed, self.options)[0]].label

    # ------------------------------------------------------------------ episodes
    def _member(self, i: int) -> Env:
        if i not in self._envs:
            m = self.options.members[i]
            self._envs[i] = make_env(m.name, m.options, **self._kwargs)
        return self._envs[i]

    @property
    def instructions(self) -> str:
        if self._current is not None:
            return self._current.instructions
        names = ", ".join(m.label for m in self.options.members)
        return f"One of several tasks ({names}); each episode states its own rules."

    def task_type(self, seed: int) -> str:
        return self.member_label(seed)

    def env_label(self, seed: int) -> str:
        return self.member_label(seed)

    def reset(self, seed: int) -> tuple[str, dict[str, Any]]:
        m, t = self.decode(int(seed), self.options)
        self._current = self._member(m)
        obs, info = self._current.reset(t)
        return obs, {**info, "instructions": self._current.instructions, "env": self.options.members[m].label}

    def _live(self) -> Env:
        if self._current is None:
            raise RuntimeError("Mixture: step() before reset(seed)")
        return self._current

    def step(self, text: str) -> StepResult:
        return self._live().step(text)

    def parse_action(self, text: str) -> ParsedAction:
        return self._live().parse_action(text)

    def expert_action(self) -> str:
        return self._live().expert_action()

    def close(self) -> None:
        for env in self._envs.values():
            env.close()


def member_labels(env: Env):
    """`env.env_label` (task seed -> member label) when `env` is a mixture, so metrics come per member;
    None for a single environment (its metrics stay as they were)."""
    return env.env_label if isinstance(env, Mixture) else None
