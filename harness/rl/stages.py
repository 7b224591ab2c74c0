"""Set-up progress: the records of `envs.stage` (games, demonstrations, pre-training, the starting
evaluation) forwarded to the trainer's progress callback until the first update."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from envs.stage import STAGE_LOGGER

ProgressFn = Callable[[dict], None]


class StageForwarder(logging.Handler):
    """Forwards the set-up progress records of `envs.stage` (games, demonstrations, pre-training,
    the starting evaluation) to the trainer's progress callback as {"stage", "done", "total",
    "update": 0} (update 0: before the first update, for callbacks that only read "update"), at
    most one every `every_s` seconds per stage (and always its last one)."""

    def __init__(self, progress: ProgressFn, every_s: float = 2.0):
        super().__init__(logging.INFO)
        self.forward, self.every_s, self.last = progress, every_s, {}

    def emit(self, record: logging.LogRecord) -> None:
        stage = getattr(record, "stage", None)
        if stage is None:
            return
        done, total = int(getattr(record, "done", 0)), getattr(record, "total", None)
        now = time.monotonic()
        if total is not None and done >= total or now - self.last.get(stage, -1e9) >= self.every_s:
            self.last[stage] = now
            self.forward({"stage": stage, "done": done, "total": total, "update": 0})

    def attach(self) -> StageForwarder:
        logging.getLogger(STAGE_LOGGER).addHandler(self)
        return self

    def detach(self) -> None:
        logging.getLogger(STAGE_LOGGER).removeHandler(self)
