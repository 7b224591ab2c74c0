"""Sweep and study files for the runner's tests, run options with the fake trainer, and the checks of a
finished point (tests/support/fake_trainer.py: metrics are a pure function of seed, update and lr)."""

from __future__ import annotations

from pathlib import Path

import yaml

from harness.experiments.point import RunOptions
from harness.store import read_jsonl
from tests.support import fake_trainer

BASE = """
env: {name: frozenlake}
train: {updates: 6, checkpoint_every: 2}
tracking: {mlflow: false}
"""


def make_sweep(
    tmp_path: Path, points: str = "", grid: str = "algo.lr: [1.0e-4, 2.0e-4]", seeds: str = "[0, 1]", base: str = BASE
) -> Path:
    """A sweep file `s` over `grid` x `seeds` (plus `points`, YAML list items) on the base config `base`."""
    (tmp_path / "base.yaml").write_text(base)
    body = f"name: s\nbase: base.yaml\ngrid: {{{grid}}}\nseeds: {seeds}\n"
    if points:
        body += f"points:\n{points}"
    path = tmp_path / "sweep.yaml"
    path.write_text(body)
    return path


def opts(tmp_path: Path, **kw) -> RunOptions:
    """Run options into tmp_path/results with the fake trainer."""
    return RunOptions(results=tmp_path / "results", train_fn=fake_trainer.train, **kw)


def calls(run_dir: Path) -> list[dict]:
    """The fake trainer's calls for a point: one row per call, with the update it started from."""
    return read_jsonl(run_dir / fake_trainer.CALLS)


def check_complete(run_dir: Path, seed: int, lr: float, updates: int) -> None:
    """Every update's row, with the fake trainer's metric for it, and every update's samples."""
    rows = read_jsonl(run_dir / "metrics.jsonl")
    assert [r["update"] for r in rows] == list(range(1, updates + 1))
    assert [r["env/success"] for r in rows] == [fake_trainer.metric(seed, u, lr) for u in range(1, updates + 1)]
    assert [r["update"] for r in read_jsonl(run_dir / "samples.jsonl")] == list(range(1, updates + 1))


def study_file(tmp_path: Path, name: str = "s", mlflow: bool = False, **over) -> Path:
    """A study `name` over algo.lr and rollout.group_size (4 trials, no pruner); `over` replaces top-level keys."""
    spec = {
        "name": name,
        "base": {
            "env": {"name": "frozenlake"},
            "tracking": {"mlflow": mlflow},
            "train": {"updates": 4, "eval_every": 1, "checkpoint_every": 1},
        },
        "space": {
            "algo.lr": {"type": "float", "low": 1.0e-4, "high": 1.0e-2, "log": True},
            "rollout.group_size": {"type": "categorical", "choices": [2, 4]},
        },
        "objective": {"metric": "eval_greedy/success", "direction": "maximize"},
        "pruner": {"name": "none"},
        "n_trials": 4,
        "heartbeat_s": 1,
        **over,
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path
