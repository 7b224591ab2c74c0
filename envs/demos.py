"""Expert demonstrations for SFT warm-up, played through `VectorEnv` (so they can use workers).

An `Episode` is the instructions plus the list of `Turn(observation, action, reward, info)`:
`observation` is what the agent saw before writing `action`; `reward` and `info` come from
the step that action made. `final_observation` is the text after the last step.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

from envs.stage import report
from envs.vector import VectorEnv


class Turn(NamedTuple):
    observation: str
    action: str
    reward: float
    info: dict[str, Any]


@dataclass
class Episode:
    env_name: str
    seed: int
    instructions: str
    turns: list[Turn] = field(default_factory=list)
    final_observation: str = ""
    won: bool = False
    truncated: bool = False  # hit max_turns
    env_error: str | None = None  # the environment failed; not a usable demonstration

    @property
    def total_reward(self) -> float:
        return sum(t.reward for t in self.turns)


def expert_episodes(
    env_name: str,
    options: dict | None,
    seeds: list[int],
    max_turns: int,
    reward_density: str = "sparse",
    format_penalty: float = 0.0,
    workers: int = 0,
    batch_size: int = 64,
    only_won: bool = False,
) -> list[Episode]:
    """Play the expert on every seed (in order); `only_won` drops the episodes it failed."""
    episodes: list[Episode] = []
    if not seeds:
        return episodes
    n = min(batch_size, len(seeds))
    with VectorEnv(
        env_name, options, reward_density, format_penalty, n=n, workers=workers, max_turns=max_turns
    ) as venv:
        for start in range(0, len(seeds), n):
            batch = list(seeds[start : start + n])
            episodes += _play_batch(venv, env_name, batch + [None] * (n - len(batch)))
            report(f"expert episodes ({env_name})", len(episodes), len(seeds))
    return [e for e in episodes if e.won] if only_won else episodes


def _play_batch(venv: VectorEnv, env_name: str, seeds: list[int | None]) -> list[Episode]:
    episodes: dict[int, Episode] = {}
    observations: dict[int, str] = {}
    for i, reset in enumerate(venv.reset(seeds)):
        if reset is not None:
            episodes[i] = Episode(env_name, seeds[i], reset[1].get("instructions", venv.instructions))
            observations[i] = reset[0]
            episodes[i].env_error = reset[1].get("env_error")
    live = {i for i in episodes if venv.active[i]}
    while live:
        expert = venv.expert_actions()
        for i in sorted(live):
            if expert[i] is None:  # the expert failed on a broken env: not a demonstration
                episodes[i].env_error = episodes[i].env_error or "no expert action"
                live.discard(i)
        actions = [expert[i] if i in live else None for i in range(venv.n)]
        for i, result in enumerate(venv.step(actions)):
            if result is None:
                continue
            ep = episodes[i]
            ep.turns.append(Turn(observations[i], actions[i], result.reward, result.info))
            observations[i] = result.observation
            if result.done:
                live.discard(i)
                ep.final_observation = result.observation
                ep.won = bool(result.info.get("won"))
                ep.truncated = bool(result.info.get("truncated"))
                ep.env_error = result.info.get("env_error", ep.env_error)
    return [episodes[i] for i in sorted(episodes)]


def expert_solve_rate(env_name: str, options: dict | None, seeds: list[int], max_turns: int, workers: int = 0) -> float:
    """Fraction of `seeds` the expert wins within `max_turns`."""
    episodes = expert_episodes(env_name, options, seeds, max_turns, workers=workers)
    return sum(e.won for e in episodes) / max(1, len(episodes))
