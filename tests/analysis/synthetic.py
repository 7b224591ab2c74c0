"""Synthetic results folders with known answers (the layout `harness sweep` writes).

A plain module, not conftest.py: tests import these builders by name (`from synthetic import ...`)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import yaml

SEEDS = [0, 1, 2]
# final held-out greedy success per (clip level, seed); binary-exact so differences are exact.
FINAL = {"ppo": [0.25, 0.5, 0.75], "dual": [0.5, 0.75, 1.0], "none": [0.125, 0.25, None]}
COLLAPSE = {("none", 0): 6, ("none", 1): 8}
STATUS = {("none", 2): "failed"}


def base_config(level: str, seed: int) -> dict:
    return {
        "model": {"name": "tiny", "lora": {"r": 16}},
        "algo": {"clip": {"level": level, "eps_low": 0.2}, "agg": "token-mean"},
        "train": {"seed": seed, "updates": 10},
    }


def write_point(
    root: Path,
    pid: str,
    config: dict | None,
    status: str,
    metrics: dict | None,
    curve: list[dict] | None,
    code_version="0123456789abcdef0123456789abcdef01234567",
) -> None:
    d = root / pid
    d.mkdir(parents=True, exist_ok=True)
    if config is not None:
        (d / "config.yaml").write_text(yaml.safe_dump(config))
    if curve is not None:
        (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in curve))
    if metrics is not None:
        summary = {
            "status": status,
            "metrics": metrics,
            "config_hash": hashlib.sha256(pid.encode()).hexdigest()[:8],
            "code_version": code_version,
            "packages": {"numpy": "2.4.6"},
            "timings": {},
        }
        (d / "summary.json").write_text(json.dumps(summary))
    (d / "status").write_text(status + "\n")


def curve_rows(final: float, seed: int, collapse: int | None, updates: int = 10) -> list[dict]:
    rows = []
    for k in range(updates + 1):
        row = {
            "update": k,
            "env/success": final * k / updates,
            "diag/kl_k3": 0.001 * k * (1 + seed),
            "loss/entropy": 2.0 - 0.1 * k,
            "env/group_reward_std": 0.5 if collapse is None or k < collapse else 0.01,
        }
        if k % 5 == 0:
            row["eval_greedy/success"] = final * k / updates
            row["diag/mi_estimate"] = 1.0 - 0.05 * k
        rows.append(row)
    return rows


def make_clip_sweep(root: Path, with_sweep_json: bool = True, drop: tuple = ()) -> Path:
    """sweep.json as harness.experiments.sweep.Sweep.manifest writes it. 3 clip levels x 3 seeds.
    ppo = baseline; dual = ppo + 0.25 on every seed; none: seeds 0, 1 collapsed, seed 2 failed.
    `drop` = point ids whose folders are not written (missing)."""
    points = []
    for level in FINAL:
        for seed in SEEDS:
            pid = f"clip.level={level}__seed{seed}"
            points.append(
                {
                    "id": pid,
                    "variant": f"clip.level={level}",
                    "label": None,
                    "seed": seed,
                    "overrides": {"algo.clip.level": level},
                    "config_hash": None,
                    "is_baseline": level == "ppo",
                }
            )
            if pid in drop:
                continue
            final = FINAL[level][seed]
            status = STATUS.get((level, seed), "done")
            collapse = COLLAPSE.get((level, seed))
            metrics = (
                None
                if final is None
                else {
                    "final/eval_greedy/success": final,
                    "best/eval_greedy/success": final,
                    "init/eval_greedy/success": 0.0,
                    "collapsed_at": {"update": collapse, "reason": "echo_trap"} if collapse else None,
                }
            )
            curve = curve_rows(final if final is not None else 0.0, seed, collapse, 10 if final is not None else 3)
            write_point(root, pid, base_config(level, seed), status, metrics, curve)
            if final is None:  # a failed point records its error
                s = root / pid / "summary.json"
                s.write_text(json.dumps({"status": "failed", "error": "CUDA out of memory\ntrace...", "metrics": {}}))
    if with_sweep_json:
        (root / "sweep.json").write_text(
            json.dumps(
                {
                    "name": "clip",
                    "description": "",
                    "axes": ["algo.clip.level"],
                    "baseline": {"algo.clip.level": "ppo"},
                    "baseline_variant": "clip.level=ppo",
                    "seeds": SEEDS,
                    "points": points,
                }
            )
        )
    return root
