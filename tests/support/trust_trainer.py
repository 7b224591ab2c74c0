"""A deterministic fake trainer whose policy may not move, for the `harness tune` trust tests.

HARNESS_TRAIN_FN=tests.support.trust_trainer:train (the repository root on sys.path). It logs what
the real trainer logs for the tuner: the held-out evaluation (eval_greedy/success and
eval_sampled/success) at update 0 and every `train.eval_every` updates, and diag/kl_k3 (the KL to
the reference at the start of each update, so 0 at update 1) at every update; the progress
callback gets the rows as the real trainer passes them. Resumes from checkpoint/state.json.

The issue's study in miniature: below STILL_LR the policy does not move (KL 0, every evaluation
equal to update 0's); above it greedy success falls with the learning rate (a negative greedy gain)
while sampled success rises by `sampled_slope(lr)` per update, largest near lr = 3e-4. So an
objective on final greedy success crowns the trial that did not train.

Switches: a file <study folder>/interrupt_at holding an update number makes the next point that
reaches it raise KeyboardInterrupt there (as Ctrl-C would), once, consuming the file.
TRUST_GATE_DIR: each call writes <dir>/<pid> and waits until TRUST_GATE_N (default 2) processes
have written theirs, so that many workers hold a trial at once. TRUST_DELAY sleeps per update.
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path

from harness.store import atomic_write_json

STILL_LR = 3e-5
GREEDY0, SAMPLED0 = 0.75, 0.5
INTERRUPT_AT = "interrupt_at"
GATE_LIMIT_S = 300.0


def sampled_slope(lr: float) -> float:
    return 0.02 - 0.01 * (math.log10(lr) + 3.5) ** 2


def evaluation(lr: float, update: int) -> dict[str, float]:
    if lr < STILL_LR or update == 0:
        return {"eval_greedy/success": GREEDY0, "eval_sampled/success": SAMPLED0}
    return {
        "eval_greedy/success": round(GREEDY0 - lr * 10 * update, 9),
        "eval_sampled/success": round(SAMPLED0 + sampled_slope(lr) * update, 9),
    }


def kl(lr: float, update: int) -> float:
    return 0.0 if lr < STILL_LR else round(lr * 100 * (update - 1), 9)


def _gate() -> None:
    folder = os.environ.get("TRUST_GATE_DIR")
    if not folder:
        return
    gate, want = Path(folder), int(os.environ.get("TRUST_GATE_N", "2"))
    gate.mkdir(parents=True, exist_ok=True)
    (gate / str(os.getpid())).touch()
    deadline = time.monotonic() + GATE_LIMIT_S
    while len(list(gate.iterdir())) < want:
        if time.monotonic() > deadline:
            raise RuntimeError(f"only {len(list(gate.iterdir()))} of {want} workers reached {gate}")
        time.sleep(0.05)


def _interrupt(run_dir: Path, update: int) -> None:
    order = run_dir.parent / INTERRUPT_AT
    if order.exists() and int(order.read_text()) == update:
        order.unlink()
        raise KeyboardInterrupt


def train(cfg, run_dir, logger, progress=None) -> dict:
    run_dir = Path(run_dir)
    ckpt = run_dir / "checkpoint" / "state.json"
    start = json.loads(ckpt.read_text())["update"] if ckpt.exists() else 0
    if start:
        logger.truncate_after(start)
    _gate()
    lr, n, every = cfg.algo.lr, cfg.train.updates, cfg.train.eval_every
    delay = float(os.environ.get("TRUST_DELAY", "0"))
    if start == 0:
        logger.log(0, evaluation(lr, 0))
    for u in range(start + 1, n + 1):
        time.sleep(delay)
        row = {"env/success": 0.5, "diag/kl_k3": kl(lr, u)}
        if (every and u % every == 0) or u == n:
            row.update(evaluation(lr, u))
        logger.log(u, row)
        ckpt.parent.mkdir(exist_ok=True)
        atomic_write_json(ckpt, {"update": u})
        if progress is not None:
            progress({"update": u, "updates": n, "success": row["env/success"], **row})
        _interrupt(run_dir, u)
    return {f"final/{k}": v for k, v in evaluation(lr, n).items()}
