"""Synthetic sweeps for `harness diagnose`, in the layout `harness sweep` writes, with one planted signal.

Each run logs every update's diagnostics (metrics.jsonl), held-out evaluations before RL and at the
end (summary.json and the paired per-episode rows of eval_tasks.jsonl). A run collapses when its
final held-out success falls from 0.5 to 0.25 on the same tasks. The planted diagnostic is
`diag/kl_k3`: high over the first updates of a collapsing run (or, with `flip`, of a healthy one);
every other diagnostic is noise drawn independently of the outcome. A plain module: tests import it.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import yaml

TASKS = 32
UPDATES = 20


def _eval_rows(update: int, success: float) -> list[dict]:
    """TASKS sampled episodes, the first round(success * TASKS) tasks solved: a run that falls loses
    tasks it solved before, one that improves keeps them (the paired change is exact)."""
    wins = round(success * TASKS)
    return [
        {"update": update, "mode": "sampled", "task": t, "sample": 0, "success": int(t < wins), "return": 0.0}
        for t in range(TASKS)
    ]


def write_run(
    root: Path,
    pid: str,
    collapse: bool,
    seed: int,
    flip: bool = False,
    echo_before: bool = False,
    keys: tuple[str, ...] = (),
    mi_every: int = 0,
) -> None:
    """One finished run. `keys` restricts the diag/ metrics written (empty: all of them). With
    `mi_every`, the MI proxy every that many updates: its value tracks the final success."""
    rng = np.random.default_rng(seed)
    d = root / pid
    d.mkdir(parents=True)
    final = 0.25 if collapse else float(rng.choice([0.5, 0.5625, 0.625, 0.6875]))
    signal = collapse != flip
    rows = [{"update": 0, "eval_sampled/success": 0.5}]
    for u in range(1, UPDATES + 1):
        row = {
            "update": u,
            "env/success": float(rng.uniform(0.3, 0.6)),
            "env/group_reward_std": float(rng.uniform(0.1, 0.4)),
            "env/zero_var_group_frac": float(rng.uniform(0, 0.5)),
            "diag/kl_k3": float(rng.uniform(0.3, 0.5) if signal else rng.uniform(0.0, 0.2)),
            "diag/entropy": float(rng.uniform(0.5, 1.5)),
            "diag/grad_norm": float(rng.uniform(0.1, 1.0)),
            "diag/kl_spike": 0.0,
            "diag/echo_trap": float(echo_before and collapse and u >= UPDATES // 2),
        }
        if mi_every and u % mi_every == 0:
            row["diag/mi_estimate"] = final + float(rng.normal(0, 0.01))
        if keys:
            row = {k: v for k, v in row.items() if not k.startswith("diag/") or k in keys}
        rows.append(row)
    rows[-1]["eval_sampled/success"] = final  # the final evaluation is logged with the last update
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    evals = _eval_rows(0, 0.5) + _eval_rows(UPDATES, final)
    (d / "eval_tasks.jsonl").write_text("".join(json.dumps(r) + "\n" for r in evals))
    (d / "config.yaml").write_text(yaml.safe_dump({"train": {"seed": seed, "updates": UPDATES}}))
    metrics = {
        "init/eval_sampled/success": 0.5,
        "final/eval_sampled/success": final,
        "final/eval_sampled/episodes": float(TASKS),
    }
    summary = {"status": "done", "metrics": metrics, "config_hash": f"{root.name}-{pid}"[:40]}
    (d / "summary.json").write_text(json.dumps(summary))
    (d / "status").write_text("done\n")


def make_sweep(
    root: Path,
    name: str,
    runs: int = 12,
    collapses: int = 5,
    seed: int = 0,
    flip: bool = False,
    echo_before: bool = False,
    keys: tuple[str, ...] = (),
    mi_every: int = 0,
) -> Path:
    """A sweep folder with `runs` runs, the first `collapses` of which collapse."""
    folder = root / name
    folder.mkdir(parents=True)
    points = []
    for i in range(runs):
        pid = f"run{i:02d}__seed={i}"
        write_run(folder, pid, i < collapses, 1000 * seed + i, flip, echo_before, keys, mi_every)
        points.append({"id": pid, "seed": i, "overrides": {}})
    manifest = {"name": name, "axes": [], "baseline": {}, "seeds": list(range(runs)), "points": points}
    (folder / "sweep.json").write_text(json.dumps(manifest))
    return folder
