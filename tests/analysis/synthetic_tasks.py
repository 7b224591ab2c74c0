"""A synthetic sweep with per-task results (eval_tasks.jsonl) and cost, with known answers.

Axis algo.filter.name: none (baseline), ragen_top_p, dapo; seeds 0, 1, 2; 8 held-out tasks;
4 updates, evaluations at updates 0, 2, 4. A point solves task j at update u iff
j < threshold(u) (+1 on seed 2), in greedy decoding; sample k of sampled decoding iff
j < threshold(u) - k. Thresholds: none 2 + u/2, ragen_top_p and dapo 2 + u. Episodes per update:
16, dapo 40 (2.5x, DAPO refills). Hence, in greedy success:
    none        start 7/24, final 13/24, gain exactly 0.25 on every seed
    ragen_top_p final 19/24, Δ = +0.25, same cost
    dapo        final 19/24, Δ = +0.25, but 2.5x the episodes; at the baseline's 64 episodes it
                sits 0.8 of the way from update 0 to update 2: Δ @ equal episodes = -0.05.
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml

SEEDS = (0, 1, 2)
TASKS = 8
UPDATES = 4
EVAL_EVERY = 2
SAMPLES = 2
CELLS = {"none": (2.0, 0.5, 16), "ragen_top_p": (2.0, 1.0, 16), "dapo": (2.0, 1.0, 40)}  # thr0, slope, episodes
AXIS = "algo.filter.name"
CODE = {"commit": "89abcdef0123456789abcdef0123456789abcdef", "dirty": False, "diff_sha": None, "version": "0.1.0"}


def config(level: str, seed: int, updates: int = UPDATES) -> dict:
    return {
        "model": {"name": "tiny"},
        "env": {"name": "frozenlake", "heldout_tasks": TASKS},
        "algo": {"filter": {"name": level}, "lr": 1e-5},
        "train": {"seed": seed, "updates": updates, "eval_every": EVAL_EVERY, "eval_episodes": TASKS},
    }


def threshold(level: str, seed: int, update: int) -> float:
    thr0, slope, _ = CELLS[level]
    return thr0 + slope * update + (1 if seed == 2 else 0)


def task_rows(level: str, seed: int, updates: int) -> list[dict]:
    rows = []
    for u in [u for u in range(updates + 1) if u % EVAL_EVERY == 0 or u == updates]:
        thr = threshold(level, seed, u)
        for j in range(TASKS):
            g = int(j < thr)
            rows.append(
                {"update": u, "mode": "greedy", "task": 100 + j, "sample": 0, "success": g, "return": g, "turns": 3}
            )
            for k in range(SAMPLES):
                s = int(j < thr - k)
                rows.append(
                    {
                        "update": u,
                        "mode": "sampled",
                        "task": 100 + j,
                        "sample": k,
                        "success": s,
                        "return": s,
                        "turns": 4,
                    }
                )
    return rows


def curve(level: str, seed: int, updates: int, tasks: list[dict]) -> list[dict]:
    eps = CELLS[level][2]
    rows = []
    for u in range(updates + 1):
        row: dict = {"update": u}
        if u:
            row.update(
                {
                    "env/success": 0.1 * u,
                    "env/episodes": float(eps),
                    "perf/episodes": float(eps),
                    "perf/rollout_tokens": 30.0 * eps,
                    "diag/kl_k3": 0.002 * u * (1 + seed),
                    "loss/entropy": 1.5 - 0.05 * u,
                    "env/group_reward_std": 0.4,
                }
            )
        for mode in ("greedy", "sampled"):
            sel = [r["success"] for r in tasks if r["update"] == u and r["mode"] == mode]
            if sel:
                row[f"eval_{mode}/success"] = sum(sel) / len(sel)
                row[f"eval_{mode}/episodes"] = float(len(sel))
        rows.append(row)
    return rows


def write_point(root: Path, pid: str, level: str, seed: int, updates: int = UPDATES, per_task: bool = True) -> None:
    d = root / pid
    d.mkdir(parents=True, exist_ok=True)
    cfg = config(level, seed, updates)
    (d / "config.yaml").write_text(yaml.safe_dump(cfg))
    tasks = task_rows(level, seed, updates)
    rows = curve(level, seed, updates, tasks)
    if per_task:
        (d / "eval_tasks.jsonl").write_text("".join(json.dumps(r) + "\n" for r in tasks))
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    evals = [r for r in rows if "eval_greedy/success" in r]
    metrics = {
        **{f"init/{k}": v for k, v in evals[0].items() if k.startswith("eval_")},
        **{f"final/{k}": v for k, v in evals[-1].items() if k.startswith("eval_")},
        "best/eval_greedy/success": max(r["eval_greedy/success"] for r in evals),
        "collapsed_at": None,
        "cost/episodes": float(CELLS[level][2] * updates),
        "cost/generated_tokens": 30.0 * CELLS[level][2] * updates,
        "cost/wall_s": 600.0 * (2.5 if level == "dapo" else 1.0),
    }
    summary = {
        "status": "done",
        "metrics": metrics,
        "config_hash": f"h{seed}{level[:3]}{updates}",
        "code_version": CODE,
    }
    (d / "summary.json").write_text(json.dumps(summary))
    (d / "status").write_text("done\n")


def base_config() -> dict:
    flat = {}
    for k, v in _flatten(config("none", 0)).items():
        if k not in (AXIS, "train.seed"):
            flat[k] = v
    return flat


def _flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        out.update(_flatten(v, key + ".") if isinstance(v, dict) and v else {key: v})
    return out


def make_task_sweep(root: Path, per_task: bool = True, seeds: tuple[int, ...] = SEEDS) -> Path:
    """The sweep described in the module doc, as `harness sweep` writes it (sweep.json included)."""
    points = []
    for level in CELLS:
        for seed in seeds:
            pid = f"filter.name={level}__seed={seed}__h{seed}"
            write_point(root, pid, level, seed, per_task=per_task)
            points.append(
                {
                    "id": pid,
                    "variant": f"filter.name={level}",
                    "label": None,
                    "seed": seed,
                    "overrides": {AXIS: level},
                    "config_hash": f"h{seed}",
                    "is_baseline": level == "none",
                }
            )
    manifest = {
        "name": "filters",
        "description": "",
        "source": "sweeps/filters.yaml",
        "command": "harness sweep sweeps/filters.yaml",
        "axes": [AXIS],
        "baseline": {AXIS: "none"},
        "baseline_variant": "filter.name=none",
        "seeds": list(seeds),
        "base_config": base_config(),
        "base_excluded": [AXIS, "train.seed"],
        "points": points,
    }
    (root / "sweep.json").write_text(json.dumps(manifest))
    return root


def add_other_config(root: Path, updates: int = 6) -> list[str]:
    """Points of the same sweep run with another base (train.updates), not in the manifest: what a
    second `harness sweep ... -o train.updates=6` into the same folder leaves behind."""
    pids = []
    for level in ("none", "dapo"):
        for seed in SEEDS:
            pid = f"filter.name={level}__seed={seed}__u{updates}"
            write_point(root, pid, level, seed, updates)
            pids.append(pid)
    return pids
