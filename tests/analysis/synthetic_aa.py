"""A synthetic A/A sweep as `harness sweep` writes it, with a known truth.

Arms: `baseline` and `noop` (an override that changes nothing, on the baseline's seeds) and `copy`
(the base config again, seed_offset 1000). Each run (arm, seed) solves held-out task t at its final
update with probability clip(0.6 + a + b_t + shift, 0, 1): a ~ N(0, sigma_seed) its own seed effect
(chaos: runs of one seed are independent after training), b_t ~ N(0, sigma_task) shared by every
run (common tasks), `shift` added to the `noop` arm only (0: a true A/A). At update 0 the runs of
one train.seed score the same (same seed, same model before any update), success with probability
0.55 + b_t. The training rollouts of noop and baseline on one seed agree until update SPLIT.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import yaml

ARMS = {"baseline": 0, "noop": 0, "copy": 1000}  # arm -> seed_offset
AXIS = "algo.micro_batch_tokens"
VALUE = {"baseline": 1024, "noop": 512, "copy": 1024}
SPLIT = 3  # the first update whose training rollouts differ between noop and baseline on one seed
CODE = {"commit": "89abcdef0123456789abcdef0123456789abcdef", "dirty": False, "diff_sha": None, "version": "0.1.0"}


def _success(rng: np.random.Generator, p: np.ndarray) -> np.ndarray:
    return (rng.random(p.shape) < np.clip(p, 0, 1)).astype(int)


def _write_point(root: Path, pid: str, arm: str, seed: int, start: np.ndarray, final: np.ndarray) -> None:
    d = root / pid
    d.mkdir(parents=True, exist_ok=True)
    cfg = {
        "model": {"name": "tiny"},
        "env": {"name": "frozenlake", "heldout_tasks": len(final)},
        "algo": {"micro_batch_tokens": VALUE[arm]},
        "train": {"seed": seed, "updates": 4, "eval_every": 4, "eval_episodes": len(final)},
    }
    (d / "config.yaml").write_text(yaml.safe_dump(cfg))
    rows = [
        {"update": u, "mode": "sampled", "task": 100 + j, "sample": 0, "success": int(s), "return": int(s), "turns": 3}
        for u, scores in ((0, start), (4, final))
        for j, s in enumerate(scores)
    ]
    (d / "eval_tasks.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    curve = [{"update": u} for u in range(5)]
    for u, scores in ((0, start), (4, final)):
        curve[u]["eval_sampled/success"] = float(np.mean(scores))
    # training rollouts: a function of the seed alone until update SPLIT, where the noop arm's drift apart
    for u in range(1, 5):
        moved = 0.001 if arm == "noop" and u >= SPLIT else 0.0
        curve[u].update({"env/success": 0.5 + 0.01 * (seed % 7) + 0.02 * u + moved, "env/turns": 4.0})
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in curve))
    metrics = {"init/eval_sampled/success": float(start.mean()), "final/eval_sampled/success": float(final.mean())}
    summary = {"status": "done", "metrics": metrics, "config_hash": pid[-8:], "code_version": CODE}
    (d / "summary.json").write_text(json.dumps(summary))
    (d / "status").write_text("done\n")


def make_aa_sweep(
    root: Path,
    seeds: int = 20,
    tasks: int = 32,
    sigma_seed: float = 0.04,
    sigma_task: float = 0.15,
    shift: float = 0.0,
    rng_seed: int = 0,
) -> Path:
    """The sweep of the module doc in `root` (sweep.json included); returns `root`."""
    rng = np.random.default_rng(rng_seed)
    b = rng.normal(0, sigma_task, tasks)
    start = {s: _success(rng, 0.55 + b) for s in sorted({i + o for i in range(seeds) for o in ARMS.values()})}
    points, variants = [], []
    for arm, offset in ARMS.items():
        variants.append(
            {
                "variant": arm,
                "label": arm,
                "overrides": {AXIS: VALUE[arm]} if arm == "noop" else {},
                "is_baseline": arm == "baseline",
                **({"seed_offset": offset} if offset else {}),
            }
        )
        for i in range(seeds):
            seed = i + offset
            pid = f"{arm}__seed={seed}__{arm[:2]}{seed:06d}"
            p = 0.6 + rng.normal(0, sigma_seed) + b + (shift if arm == "noop" else 0.0)
            _write_point(root, pid, arm, seed, start[seed], _success(rng, p))
            points.append(
                {
                    "id": pid,
                    "variant": arm,
                    "label": arm,
                    "seed": seed,
                    "overrides": variants[-1]["overrides"],
                    "config_hash": pid[-8:],
                    "is_baseline": arm == "baseline",
                }
            )
    manifest = {
        "name": "aa",
        "description": "",
        "source": "sweeps/aa.yaml",
        "command": "harness sweep sweeps/aa.yaml",
        "axes": [AXIS],
        "baseline": {AXIS: 1024},
        "baseline_variant": "baseline",
        "seeds": list(range(seeds)),
        "metric": "final/eval_sampled/success",
        "variants": variants,
        "points": points,
    }
    (root / "sweep.json").write_text(json.dumps(manifest))
    return root
