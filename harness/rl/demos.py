"""The expert's demonstrations of a run's environment: played once per config, handed to model/.

The tiny model's pre-training (harness.model.tiny), the SFT warm-up (harness.model.sft) and the
pre-flight check (harness.rl.preflight) learn from or look at expert episodes on the environment's
train seeds. The trainer makes one `Demonstrations` per run and passes it down (model/ sees it as a
`harness.model.supervised.DemoSource` and imports no environment). It plays an episode only when one
is taken, so a cached tiny model or SFT checkpoint plays none, and each seed at most once however
many callers take it: an expert episode depends on its seed only, so a kept one is the one a fresh
play would give.
"""

from __future__ import annotations

from envs import demos as env_demos
from envs.demos import expert_episodes
from envs.registry import env_class, validate_options
from envs.stage import report
from harness.config.schema import RunConfig
from harness.model.cache import code_version
from harness.model.supervised import Demo, to_demo

DEMO_MAX_TURNS = 64  # cap of an expert episode; independent of turns.max so budgets share a cache
REFILL_ROUNDS = 8  # rounds of asking for more seeds when the expert fails some


class Demonstrations:
    """The expert's demonstrations of one environment (a `DemoSource`), played on demand and kept."""

    def __init__(self, env_name: str, options: dict | None):
        self.env_name, self.options = env_name, options
        self._played: dict[tuple[int, int], Demo | None] = {}  # (seed, max_turns) -> demo (None: not usable)

    @classmethod
    def of(cls, cfg: RunConfig) -> Demonstrations:
        return cls(cfg.env.name, cfg.env.options)

    @property
    def key(self) -> dict:
        """The environment part of a cache key: name, validated options, source of its classes."""
        cls = env_class(self.env_name)
        return {
            "name": self.env_name,
            "options": cls.cache_options(validate_options(self.env_name, self.options)),
            "code": code_version(cls, *[c for c in cls.__mro__ if c.__module__.startswith("envs.")]),
        }

    @property
    def code(self) -> str:
        """Hash of the source that plays the demonstrations (the expert's player and this module)."""
        return code_version(env_demos, Demonstrations)

    def markers(self) -> list[str]:
        """The environment's observation markers (text a tokenizer must learn)."""
        return list(env_class(self.env_name).markers_for(self.options))

    def report(self, stage: str, done: int, total: int | None = None) -> None:
        report(stage, done, total)

    def take(self, n: int, start: int = 0, max_turns: int = DEMO_MAX_TURNS) -> tuple[list[Demo], int]:
        """`n` won expert episodes on the train seeds from index `start` on, in seed order.

        Returns (demos, next_index): the index after the last train seed used, so a later caller can
        take demonstrations of other tasks. Episodes the expert fails are skipped.
        """
        cls = env_class(self.env_name)
        demos: list[Demo] = []
        index = start
        for _ in range(REFILL_ROUNDS):
            need = n - len(demos)
            if need <= 0:
                break
            ask = need + max(4, need // 4) if demos else need
            for demo in self._play(cls.demo_seeds(index + ask, self.options)[index:], max_turns):
                index += 1
                if demo is not None:
                    demos.append(demo)
                    if len(demos) == n:
                        break
        return demos, index

    def _play(self, seeds: list[int], max_turns: int) -> list[Demo | None]:
        """Each seed's demonstration (None when the expert failed it), playing only seeds not played yet."""
        new = [s for s in seeds if (s, max_turns) not in self._played]
        for s, ep in zip(new, expert_episodes(self.env_name, self.options, new, max_turns)):
            self._played[(s, max_turns)] = to_demo(ep) if ep.won and not ep.env_error and ep.turns else None
        return [self._played[(s, max_turns)] for s in seeds]


def collect_demos(
    env_name: str, options: dict | None, n: int, start: int = 0, max_turns: int = DEMO_MAX_TURNS
) -> tuple[list[Demo], int]:
    """`n` won expert episodes from train seed index `start` on, and the next index (`Demonstrations.take`)."""
    return Demonstrations(env_name, options).take(n, start, max_turns)
