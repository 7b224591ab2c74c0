"""A deterministic fake trainer that writes per-task held-out results, for sequential-seed sweeps.

HARNESS_TRAIN_FN=tests.support.sequential_trainer:train (the checkout on PYTHONPATH) or passed as
`RunOptions.train_fn`. It evaluates TASKS held-out tasks greedily at update 0 and at its last
update; the final score of task t for seed s is 0.3 + EFFECTS[algo.lr] + a seed term (sd 0.01) + a
task-by-seed term (sd 0.1), drawn from a generator seeded by (lr, seed, task), so a point's rows
are a pure function of its config and the arms of a sweep differ by the effect its lr names.
FAKE_INTERRUPT_SEED=k raises KeyboardInterrupt in the first point of seed k it runs (Ctrl-C
mid-look), once per results folder. Each call appends {start} to <run_dir>/fake_calls.jsonl.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from harness.store import append_jsonl

CALLS = "fake_calls.jsonl"
TASKS = 24
EFFECTS = {1.0e-4: 0.0, 2.0e-4: 0.3, 3.0e-4: 0.0, 4.0e-4: 0.035}  # Δ to the baseline (lr 1e-4) per arm


def scores(lr: float, seed: int) -> np.ndarray:
    """The final score of each held-out task."""
    rng = np.random.default_rng([int(round(lr * 1e6)), seed])
    return 0.3 + EFFECTS[lr] + rng.normal(0, 0.01) + rng.normal(0, 0.1, TASKS)


def _rows(values) -> list[dict]:
    return [
        {"mode": "greedy", "task": t, "sample": 0, "success": float(v), "return": float(v), "turns": 1}
        for t, v in enumerate(values)
    ]


def train(cfg, run_dir, logger, progress=None) -> dict:
    run_dir = Path(run_dir)
    append_jsonl(run_dir / CALLS, [{"start": 0}])
    lr, seed, n = cfg.algo.lr, cfg.train.seed, cfg.train.updates
    flag = run_dir.parent / ".fake_interrupted"
    if os.environ.get("FAKE_INTERRUPT_SEED") == str(seed) and not flag.exists():
        flag.write_text("")
        raise KeyboardInterrupt
    final = scores(lr, seed)
    logger.log(0, {"eval_greedy/success": 0.3})
    logger.log_eval_tasks(0, _rows(np.full(TASKS, 0.3)))
    for u in range(1, n + 1):
        logger.log(u, {"env/success": 0.3, **({"eval_greedy/success": float(final.mean())} if u == n else {})})
    logger.log_eval_tasks(n, _rows(final))
    return {"final/eval_greedy/success": float(final.mean()), "init/eval_greedy/success": 0.3}
