"""Vector environments of a run, one per batch size, kept for the whole run (worker processes
start once)."""

from __future__ import annotations

from envs.vector import VectorEnv
from harness.config.schema import EnvConfig


class VenvPool:
    """`pool(n)` -> a VectorEnv of `n` instances of the configured environment; `close()` ends them."""

    def __init__(self, env: EnvConfig):
        self.env = env
        self._venvs: dict[int, VectorEnv] = {}

    def __call__(self, n: int) -> VectorEnv:
        if n not in self._venvs:
            c = self.env
            self._venvs[n] = VectorEnv(
                c.name,
                c.options,
                reward_density=c.reward_density,
                format_penalty=c.format_penalty,
                n=n,
                workers=c.workers,
            )
        return self._venvs[n]

    def close(self) -> None:
        for venv in self._venvs.values():
            venv.close()
        self._venvs.clear()
