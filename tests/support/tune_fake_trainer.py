"""A deterministic fake trainer that evaluates like the real one, for `harness tune` / Ray tests.

HARNESS_TRAIN_FN=tests.support.tune_fake_trainer:train (the checkout on PYTHONPATH). Rows: update 0 is an
evaluation; every `train.eval_every` updates and the last one carry eval_greedy/success =
score(lr, seed, update), larger for a larger algo.lr (so pruners have something to prune), and the
progress callback gets them as the real trainer passes them. Resumes from checkpoint/state.json.
model.name "fake-once" fails on the first call for its folder, "fake-fail" always; FAKE_TRAIN_DELAY
sleeps per update; tests/support/pause.py stops a point after an update until the test lets it
go. Each call appends {start, pid, ray_node_ip} to <run_dir>/fake_calls.jsonl.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from harness.store import append_jsonl, atomic_write_json, read_jsonl
from tests.support.pause import pause_point

CALLS = "fake_calls.jsonl"


def score(lr: float, seed: int, update: int) -> float:
    return round(lr * 100 * update + seed * 1e-3, 9)


def _ray_node_ip() -> str | None:
    """The Ray node this runs on (None outside Ray): a local instance must be on 127.0.0.1."""
    ray = sys.modules.get("ray")
    return ray.util.get_node_ip_address() if ray is not None and ray.is_initialized() else None


def train(cfg, run_dir, logger, progress=None) -> dict:
    run_dir = Path(run_dir)
    ckpt = run_dir / "checkpoint" / "state.json"
    start = json.loads(ckpt.read_text())["update"] if ckpt.exists() else 0
    if start:
        logger.truncate_after(start)
    earlier = read_jsonl(run_dir / CALLS)
    append_jsonl(run_dir / CALLS, [{"start": start, "pid": os.getpid(), "ray_node_ip": _ray_node_ip()}])
    if cfg.model.name == "fake-fail" or (cfg.model.name == "fake-once" and not earlier):
        raise RuntimeError(f"{cfg.model.name}: attempt {len(earlier) + 1} fails")
    lr, seed, n, every = cfg.algo.lr, cfg.train.seed, cfg.train.updates, cfg.train.eval_every
    delay = float(os.environ.get("FAKE_TRAIN_DELAY", "0"))
    if start == 0:
        logger.log(0, {"eval_greedy/success": score(lr, seed, 0)})
    for u in range(start + 1, n + 1):
        time.sleep(delay)
        row = {"env/success": score(lr, seed, u) / 2}
        if (every and u % every == 0) or u == n:
            row["eval_greedy/success"] = score(lr, seed, u)
        logger.log(u, row)
        if progress is not None:
            progress(
                {
                    "update": u,
                    "updates": n,
                    "success": row["env/success"],
                    **{k: v for k, v in row.items() if k.startswith("eval_")},
                }
            )
        ckpt.parent.mkdir(exist_ok=True)
        atomic_write_json(ckpt, {"update": u})
        pause_point(run_dir, u)
    return {"final/eval_greedy/success": score(lr, seed, n)}
