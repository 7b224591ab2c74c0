"""A small deterministic trainer with the real trainer's contract, for runner and CLI tests.

Selected with HARNESS_TRAIN_FN=tests.support.fake_trainer:train (the checkout on PYTHONPATH) or passed as
`RunOptions.train_fn`. Metrics are a pure function of (seed, update, algo.lr), so a resumed run
must reproduce them exactly. Behaviour switches come from the config so sweep points differ:
model.name "fake-fail" raises, "fake-diverge" raises Diverged, "fake-flaky" fails until the
file <run_dir>/heal exists, "fake-crash" kills its own process; env var FAKE_TRAIN_DELAY sleeps
per update and FAKE_INTERRUPT_AT raises KeyboardInterrupt at that update; tests/support/pause.py
stops a point after an update until the test lets it go.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from harness.config.errors import Diverged
from harness.store import append_jsonl, atomic_write_json
from tests.support.pause import pause_point

CALLS = "fake_calls.jsonl"


def metric(seed: int, update: int, lr: float) -> float:
    return round(((seed * 7919 + update * 104729) % 1000) / 1000 + lr, 6)


def train(cfg, run_dir, logger, progress=None) -> dict:
    run_dir = Path(run_dir)
    ckpt = run_dir / "checkpoint" / "state.json"
    start = 0
    if ckpt.exists():
        start = json.loads(ckpt.read_text())["update"]
        logger.truncate_after(start)
    append_jsonl(run_dir / CALLS, [{"start": start, "pid": os.getpid()}])
    kind = cfg.model.name
    if kind == "fake-fail" or (kind == "fake-flaky" and not (run_dir / "heal").exists()):
        raise RuntimeError(f"boom from {kind}")
    if kind == "fake-crash":
        os._exit(3)
    seed, n, lr = cfg.train.seed, cfg.train.updates, cfg.algo.lr
    delay = float(os.environ.get("FAKE_TRAIN_DELAY", "0"))
    interrupt_at = int(os.environ.get("FAKE_INTERRUPT_AT", "0"))
    for u in range(start + 1, n + 1):
        if interrupt_at == u:
            raise KeyboardInterrupt
        time.sleep(delay)
        if kind == "fake-diverge" and u == 2:
            raise Diverged("loss is NaN", {"diverged_at": u})
        logger.log(u, {"env/success": metric(seed, u, lr), "loss/policy": -metric(seed, u, 0.0)})
        logger.log_samples(u, [{"episode": 0, "text": f"update {u}"}])
        if progress is not None:
            progress({"update": u, "updates": n, "success": metric(seed, u, lr)})
        if cfg.train.checkpoint_every and u % cfg.train.checkpoint_every == 0:
            ckpt.parent.mkdir(exist_ok=True)
            atomic_write_json(ckpt, {"update": u})
        pause_point(run_dir, u)
    return {"final/success": metric(seed, n, lr), "updates": n}
