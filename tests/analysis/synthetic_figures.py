"""Synthetic results folders shaped like the shipped sweeps whose figures were hard to read: many
cells, a 4 x 3 grid, noisy 30-update training curves, a KL blow-up, two identical cells, a
mixture of environments, an SFT/RL split under a budget and a reward-hacking probe.

A plain module (builders, not tests), as synthetic.py. Values are deterministic functions of the
cell, seed and update (a seeded generator per point)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import yaml

UPDATES = 30
EVAL_EVERY = 10
SEEDS = (0, 1, 2)


def _row(rng, u: int, level: float, kl: float, envs: tuple[str, ...], probe: bool) -> dict:
    row = {"update": u}
    if u:
        row.update(
            {
                "env/success": float(np.clip(0.5 + level * u / UPDATES + rng.normal(0, 0.08), 0, 1)),
                "env/return": float(0.5 + level * u / UPDATES + rng.normal(0, 0.1)),
                "env/turns": float(5 + rng.normal(0, 0.5)),
                "env/episodes": 32.0,
                "perf/episodes": 32.0,
                "perf/rollout_tokens": 320.0,
                "diag/kl_k3": float(abs(kl * (u / UPDATES) ** 2 + 0.02 + rng.normal(0, 0.01))),
                "diag/entropy": float(0.25 + rng.normal(0, 0.03)),
                "env/group_reward_std": float(0.3 + rng.normal(0, 0.05)),
            }
        )
    if u % EVAL_EVERY == 0:
        for mode, start in (("greedy", 0.74), ("sampled", 0.58)):
            v = float(np.clip(start + level * u / UPDATES + rng.normal(0, 0.02), 0, 1))
            row[f"eval_{mode}/success"] = v
            row[f"eval_{mode}/episodes"] = 256.0
            for k, env in enumerate(envs):
                row[f"eval_{mode}/{env}/success"] = float(np.clip(v - 0.2 * k + rng.normal(0, 0.02), 0, 1))
            if probe:
                row[f"eval_{mode}/true_success"] = float(np.clip(v - 0.1 - level * u / UPDATES, 0, 1))
                row[f"eval_{mode}/exploit_rate"] = float(np.clip(0.3 + 2 * level * u / UPDATES, 0, 1))
        if u == 0:
            row["diag/mi_estimate"] = 0.0
        else:
            row["diag/mi_estimate"] = float(0.05 + rng.normal(0, 0.02))
    return row


def make_sweep(
    root: Path,
    name: str,
    cells: list[tuple[str, dict, float, float]],
    axes: list[str],
    baseline: dict,
    envs: tuple[str, ...] = (),
    probe: bool = False,
    config: dict | None = None,
    same_as: dict[str, str] | None = None,
) -> Path:
    """cells: (label, overrides, learning level, KL peak); same_as: {label: label whose curves it copies}."""
    points, curves = [], {}
    for c, (label, overrides, _, _) in enumerate(cells):
        for seed in SEEDS:
            pid = f"{label}__seed={seed}"
            src = [x[0] for x in cells].index((same_as or {})[label]) if label in (same_as or {}) else c
            rng = np.random.default_rng(1000 * src + seed)
            rows = [_row(rng, u, cells[src][2], cells[src][3], envs, probe) for u in range(UPDATES + 1)]
            curves[pid] = rows
            d = root / pid
            d.mkdir(parents=True, exist_ok=True)
            cfg = {"train": {"seed": seed, "updates": UPDATES}, "env": {"name": "mixture" if envs else "frozenlake"}}
            for k, v in {**(config or {}), **overrides}.items():
                parts = k.split(".")
                node = cfg
                for p in parts[:-1]:
                    node = node.setdefault(p, {})
                node[parts[-1]] = v
            (d / "config.yaml").write_text(yaml.safe_dump(cfg))
            (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
            last = rows[-1]
            metrics = {f"final/{k}": v for k, v in last.items() if k.startswith("eval_")}
            metrics.update({f"init/{k}": v for k, v in rows[0].items() if k.startswith("eval_")})
            blown = cells[src][3] > 1 and seed < 2
            metrics["collapsed_at"] = {"update": 20 + seed, "reason": "kl_blowup"} if blown else None
            summary = {"status": "done", "metrics": metrics, "config_hash": f"{c}{seed}", "code_version": "abc1234"}
            (d / "summary.json").write_text(json.dumps(summary))
            (d / "status").write_text("done\n")
            points.append(
                {
                    "id": pid,
                    "variant": label,
                    "label": label,
                    "seed": seed,
                    "overrides": overrides,
                    "is_baseline": all(overrides.get(a) == v for a, v in baseline.items()),
                }
            )
    manifest = {"name": name, "axes": axes, "baseline": baseline, "seeds": list(SEEDS), "points": points}
    manifest["metric"] = "final/eval_sampled/success"
    (root / "sweep.json").write_text(json.dumps(manifest))
    return root


def clipping(root: Path) -> Path:
    cells = [
        ("ppo-token", {"algo.clip.level": "token"}, 0.09, 0.05),
        ("dapo-clip-higher", {"algo.clip.level": "token-high"}, 0.09, 0.05),
        ("gspo-sequence", {"algo.clip.level": "sequence"}, 0.06, 0.04),
        ("sampo", {"algo.clip.level": "sampo"}, 0.09, 0.02),
        ("no-clip", {"algo.clip.level": "none"}, 0.03, 4.0),
    ]
    return make_sweep(root, "clipping", cells, ["algo.clip.level"], {"algo.clip.level": "token"})


def offpolicy(root: Path) -> Path:
    cells = [
        (f"staleness={k}, correction={c}", {"rollout.staleness": k, "algo.correction.name": c}, 0.1 - 0.01 * k, 0.05)
        for k in (0, 1, 2, 4)
        for c in ("none", "tis_token", "icepop")
    ]
    axes = ["rollout.staleness", "algo.correction.name"]
    return make_sweep(root, "offpolicy", cells, axes, {"rollout.staleness": 0, "algo.correction.name": "none"})


def advantage(root: Path) -> Path:
    names = ("grpo", "dr_grpo", "rloo", "reinforce_pp", "reinforce_pp_baseline", "gae", "gigpo")
    cells = [(n, {"algo.adv.estimator": n}, 0.08 - 0.005 * i, 0.05) for i, n in enumerate(names)]
    return make_sweep(root, "advantage", cells, ["algo.adv.estimator"], {"algo.adv.estimator": "grpo"})


def filtering(root: Path) -> Path:
    names = ("none", "dapo", "dapo-refill", "ragen-top-p", "ragen-top-k")
    cells = [(n, {"algo.filter.name": n}, 0.05 + 0.01 * i, 0.05) for i, n in enumerate(names)]
    return make_sweep(
        root, "filtering", cells, ["algo.filter.name"], {"algo.filter.name": "none"}, same_as={"ragen-top-p": "dapo"}
    )


def multitask(root: Path) -> Path:
    names = ("mix-task-norm", "mix-batch-norm", "mix-group-norm", "only-frozenlake", "only-sokoban")
    cells = [(n, {"algo.adv.norm": n}, 0.03 * i, 0.05) for i, n in enumerate(names)]
    envs = ("frozenlake", "search", "sokoban")
    return make_sweep(root, "multitask", cells, ["algo.adv.norm"], {"algo.adv.norm": "mix-task-norm"}, envs=envs)


def sft_rl_split(root: Path) -> Path:
    cells = [(f"sft.demos={d}", {"sft.demos": d}, 0.1 * i, 0.05) for i, d in enumerate((40, 20, 60))]
    config = {"sft.budget": 1000, "sft.demo_cost": 10.0}
    return make_sweep(root, "sft_rl_split", cells, ["sft.demos"], {"sft.demos": 40}, config=config)


def reward_hacking(root: Path) -> Path:
    names = ("proxy", "kl-0", "kl-0.5", "no-clip", "dapo", "judge-rule")
    cells = [(n, {"algo.variant": n}, 0.02 * i, 0.05) for i, n in enumerate(names)]
    return make_sweep(root, "reward_hacking", cells, ["algo.variant"], {"algo.variant": "proxy"}, probe=True)
