"""Progress of slow set-up steps (games generated, demonstrations played, pre-training), reported
through the standard `logging` module so every package can report without importing a display.

    report("expert episodes", done=64, total=1000)

goes to the logger `harness.stage` as an INFO record carrying `stage`, `done` and `total`. Nothing
shows by default (Python's root logger drops INFO); the trainer attaches a handler while it builds
its models and evaluates the starting policy, and forwards the records to the sweep's progress
display (`harness.experiments.progress`), which prints them with an ETA.
"""

from __future__ import annotations

import logging

STAGE_LOGGER = "harness.stage"
_log = logging.getLogger(STAGE_LOGGER)
_log.setLevel(logging.INFO)  # records reach whatever handler is attached (Python's last resort shows WARNING+ only)


_COUNTS: dict[str, int] = {}  # per-process running counts of `count`


def count(stage: str) -> None:
    """One more unit of an open-ended `stage` (e.g. a game generated); reported with no total."""
    _COUNTS[stage] = _COUNTS.get(stage, 0) + 1
    report(stage, _COUNTS[stage])


def report(stage: str, done: int, total: int | None = None) -> None:
    """`done` of `total` units of `stage` are finished (total None: unknown)."""
    if _log.hasHandlers():  # skip building the record when nobody listens
        _log.info(
            "%s: %d/%s",
            stage,
            done,
            "?" if total is None else total,
            extra={"stage": stage, "done": done, "total": total},
        )
