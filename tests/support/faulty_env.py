"""A fault-injecting environment for the VectorEnv tests (registered here, not in `envs`).

Actions: "ok" counts up (won at 3), "boom" raises in step, "die" ends the process with
os._exit, "segv" sends the process SIGSEGV, "hang" sleeps; reset(seed == fail_seed) raises.
"""

from __future__ import annotations

import os
import signal
import time

from envs.base import EnvOptions, ParsedAction, TurnEnv, parse_choice
from envs.registry import ENVS

ACTIONS = ("ok", "boom", "die", "segv", "hang")


class FaultyOptions(EnvOptions):
    fail_seed: int = -1


class Faulty(TurnEnv):
    name = "faulty"
    Options = FaultyOptions

    @property
    def instructions(self) -> str:
        return "Say ok."

    def _new_task(self, seed: int) -> None:
        if seed == self.options.fail_seed:
            raise ValueError(f"cannot build task {seed}")
        self.count = 0

    def _apply(self, action: str) -> str:
        if action == "boom":
            raise RuntimeError("boom")
        if action == "die":
            os._exit(3)
        if action == "segv":
            os.kill(os.getpid(), signal.SIGSEGV)
        if action == "hang":
            time.sleep(60)
        self.count += 1
        return ""

    def render(self) -> str:
        return f"count {self.count}"

    def score(self) -> float:
        return self.count / 3

    def won(self) -> bool:
        return self.count >= 3

    def over(self) -> bool:
        return self.won()

    def state_key(self) -> str:
        return str(self.count)

    def parse_action(self, text: str) -> ParsedAction:
        return parse_choice(text, ACTIONS)

    def expert_action(self) -> str:
        return "ok"


if "faulty" not in ENVS:  # the module may be imported under two names; register once
    ENVS.register("faulty", doc="test-only env that raises, exits or segfaults on demand")(Faulty)
