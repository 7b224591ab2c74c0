"""The real trainer, held in its progress callback where $FAKE_PAUSE_AT says (tests/support/pause.py).

HARNESS_TRAIN_FN=tests.support.pausing_trainer:train (the checkout on PYTHONPATH). Where FAKE_PAUSE_AT=k
is set, e.g. in the environment of one Ray node only, a point stops after update k is logged and before
its checkpoint is written, until the test resumes or kills it; elsewhere it is `harness.rl.trainer.train`
unchanged, with the same metrics.
"""

from __future__ import annotations

from pathlib import Path

from tests.support.pause import pause_point


def train(cfg, run_dir, logger, progress=None) -> dict:
    from harness.rl.trainer import train as real_train

    def pausing(info: dict) -> None:
        if progress is not None:
            progress(info)
        if "update" in info and "updates" in info:  # an update's progress, not a set-up stage
            pause_point(Path(run_dir), int(info["update"]))

    return real_train(cfg, run_dir, logger, pausing)
