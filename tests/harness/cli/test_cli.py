"""Smoke tests of the real command line (`python -m harness ...` in a subprocess)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.experiments.sweep import load_sweep
from tests.helpers import REPO  # noqa: E402


def harness(*args: str, cwd: Path = REPO, **env: str) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "PYTHONPATH": str(REPO), **env}
    return subprocess.run(
        [sys.executable, "-m", "harness", *args], cwd=cwd, env=full_env, capture_output=True, text=True, timeout=300
    )


def test_version():
    from harness import __version__

    out = harness("--version")
    assert out.returncode == 0 and out.stdout.strip() == f"harness {__version__}"


@pytest.mark.parametrize(
    "command, options",
    [
        ("sweep", ["--dry-run", "--workers", "--retry-failed", "--no-mlflow", "--results", "--backend"]),
        ("run", ["--override", "--out", "--no-mlflow", "--dry-run", "config-docs"]),
    ],
)
def test_help(command, options):
    out = harness(command, "--help", COLUMNS="200")
    assert out.returncode == 0
    for option in options:
        assert option in out.stdout


def test_dry_run_lists_the_points_of_the_clipping_sweep():
    out = harness("sweep", "sweeps/clipping.yaml", "--dry-run", "--results", "/nonexistent-results")
    assert out.returncode == 0, out.stderr
    for point in load_sweep(REPO / "sweeps" / "clipping.yaml").points:
        assert point.id in out.stdout
    assert "baseline: ppo-token" in out.stdout and "[new]" in out.stdout


def test_axes_lists_every_registered_value_and_the_schema_choices():
    import algorithms

    out = harness("axes")
    assert out.returncode == 0, out.stderr
    for key, registry in algorithms.AXES.items():
        assert key in out.stdout
        for name in registry.names():
            assert f"  {name}" in out.stdout
    assert "context.policy: full | window | obs_truncate | single" in out.stdout
    assert "algo.kl.where: loss | reward" in out.stdout
    presets = out.stdout.split("algo.preset  (")[1].split("\n\n")[0]
    for name, keys in algorithms.PRESETS.items():  # what each preset sets
        line = next(row for row in presets.splitlines() if row.split()[0] == name)
        assert all(f"{k}=" in line for k in keys), line
    assert "  ppo  " in presets and "adv.estimator=gae" in presets and "critic.enabled=true" in presets
    assert "refills the batch only with algo.filter.max_extra_rounds > 0" in out.stdout


def test_envs_and_config_docs():
    envs_out = harness("envs")
    assert envs_out.returncode == 0 and "frozenlake" in envs_out.stdout and "options." in envs_out.stdout
    docs = harness("config-docs")
    assert docs.returncode == 0
    assert "algo.clip.level: str" in docs.stdout and "Importance-ratio level" in docs.stdout


@pytest.mark.parametrize(
    "text, expected",
    [
        ("algo:\n  clip:\n    level: tokn\n", ["algo.clip.level = 'tokn'", "sequence"]),
        ("algo: {agg: token-mean\n", ["bad.yaml:", "invalid YAML"]),
        ("turns:\n  maxx: 3\n", ["unknown key 'turns.maxx'", "Did you mean 'turns.max'"]),
    ],
)
def test_bad_config_is_one_paragraph_and_exit_2(tmp_path, text, expected):
    (tmp_path / "bad.yaml").write_text(text)
    out = harness("run", str(tmp_path / "bad.yaml"), "--out", str(tmp_path / "results"))
    assert out.returncode == 2
    assert "Traceback" not in out.stderr and out.stderr.startswith("error: ")
    for piece in expected:
        assert piece in out.stderr
    assert not (tmp_path / "results").exists()  # nothing ran


def test_bad_override_and_bad_sweep_exit_2(tmp_path):
    out = harness("run", "configs/frozenlake_tiny.yaml", "-o", "context.policy=windowed", "--dry-run")
    assert out.returncode == 2 and "context.policy = 'windowed'" in out.stderr and "obs_truncate" in out.stderr
    (tmp_path / "s.yaml").write_text("name: s\nbase: {}\ngrid: {algo.agg: [token-mean, nope]}\n")
    out = harness("sweep", str(tmp_path / "s.yaml"), "--dry-run")
    assert out.returncode == 2 and "algo.agg = 'nope'" in out.stderr and "Traceback" not in out.stderr


def test_missing_trainer_is_one_line_and_exit_1(tmp_path):
    out = harness(
        "run",
        "configs/frozenlake_tiny.yaml",
        "--out",
        str(tmp_path),
        "--no-mlflow",
        HARNESS_TRAIN_FN="no_such_trainer_module:train",
    )
    assert out.returncode == 1
    assert out.stderr.strip().count("\n") == 0 and "no_such_trainer_module" in out.stderr
    assert "Traceback" not in out.stderr


def test_run_end_to_end_with_mlflow_under_results(tmp_path):
    env = {"HARNESS_TRAIN_FN": "tests.support.fake_trainer:train", "MLFLOW_TRACKING_URI": ""}
    out = harness(
        "run",
        str(REPO / "configs/frozenlake_tiny.yaml"),
        "-o",
        "train.updates=3",
        "-o",
        "train.seed=4",
        "--out",
        str(tmp_path / "res"),
        cwd=tmp_path,
        **env,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    (point,) = (tmp_path / "res" / "frozenlake_tiny").glob("train.updates=3__seed=4__*")
    summary = json.loads((point / "summary.json").read_text())
    assert summary["status"] == "done" and summary["seed"] == 4
    assert (tmp_path / "res" / "mlflow.db").exists() and not (tmp_path / "mlruns").exists()
    again = harness(
        "run",
        str(REPO / "configs/frozenlake_tiny.yaml"),
        "-o",
        "train.updates=3",
        "-o",
        "train.seed=4",
        "--out",
        str(tmp_path / "res"),
        "--no-mlflow",
        cwd=tmp_path,
        **env,
    )
    assert again.returncode == 0 and "1 skipped" in again.stdout


def test_progress_plain_lines_and_live_view():
    import io

    from rich.console import Console

    from harness.experiments.progress import SweepProgress

    buf = io.StringIO()
    plain = SweepProgress(Console(file=buf, force_terminal=False, width=60), plain_every_s=0)
    plain.begin("s", total=3, finished=1, to_run_updates=[3, 3])
    plain.point_start("p1", 3)
    for k in (1, 2, 3):
        plain.point_update("p1", {"update": k, "updates": 3, "success": 0.5})
    plain.point_end("p1", "done", 1.0)
    plain.end()
    text = buf.getvalue()
    assert "sweep s: 3 points, 1 already finished, 2 to run" in text
    assert "p1: update 3/3  success 0.50" in text and "[2/3] done p1" in text
    assert plain.eta() is not None  # one point (3 updates) left at the measured rate

    live = SweepProgress(Console(file=io.StringIO(), force_terminal=True, width=120))
    live.begin("s", total=2, finished=0, to_run_updates=[4, 4])
    live.point_start("p1", 4)
    live.point_update("p1", {"update": 2, "updates": 4, "success": 1.0})
    rendered = Console(file=io.StringIO(), width=120)
    rendered.print(live.render())
    live.end()
    out = rendered.file.getvalue()
    assert "0/2 points" in out and "update 2/4" in out and "success 1.00" in out


def test_progress_shows_set_up_steps_with_an_eta_until_the_first_update():
    import io

    from rich.console import Console

    from harness.experiments.progress import SweepProgress, _Running

    buf = io.StringIO()
    plain = SweepProgress(Console(file=buf, force_terminal=False, width=200), plain_every_s=0)
    plain.begin("s", total=1, finished=0, to_run_updates=[3])
    plain.point_start("p1", 3)
    plain.point_update("p1", {"stage": "pre-training", "done": 0, "total": 40})
    plain.point_update("p1", {"stage": "pre-training", "done": 10, "total": 40})
    plain.point_update("p1", {"stage": "games", "done": 3, "total": None})
    set_up_over = plain.running["p1"].last_tick  # the per-update rate starts counting here
    assert set_up_over > plain.running["p1"].started
    plain.point_update("p1", {"update": 1, "updates": 3, "success": 0.5})
    plain.point_update("p1", {"stage": "late", "done": 1, "total": 2})  # after the first update: ignored
    text = buf.getvalue()
    assert "p1: pre-training 0/40\n" in text and "p1: pre-training 10/40" in text
    assert "p1: games 3/?" in text and "late" not in text and "update 1/3" in text
    # the ETA counts from the first report of the stage: 10 steps in 10 s, 30 to go
    run = _Running(updates=3, stage=("pre-training", 12, 40), stage_started=100.0, stage_done0=2)
    assert run.stage_text(110.0) == "pre-training 12/40  eta 00:28"
    assert _Running(updates=3, stage=("games", 3, None)).stage_text(5.0) == "games 3/?"


def test_the_trainer_reports_its_set_up_steps_before_the_first_update(tmp_path, monkeypatch):
    """From a cold cache: the demonstrations, the pre-training steps and the starting evaluation are
    reported (envs.stage) before update 1, nothing after it, and the handler is gone afterwards."""
    import logging

    from envs.stage import STAGE_LOGGER
    from harness.config.schema import RunConfig
    from harness.experiments.tracking import RunLogger
    from harness.rl.trainer import train
    from tests.helpers import baseline as baseline_run
    from tests.helpers.configs import merge

    monkeypatch.setenv("HARNESS_CACHE", str(tmp_path / "cache"))
    seen: list[dict] = []
    cfg = merge(baseline_run.CONFIG, {"model": {"tiny": {"pretrain_demos": 40, "pretrain_epochs": 2}}})
    logger = RunLogger(tmp_path / "run")
    train(RunConfig.model_validate(cfg), tmp_path / "run", logger, seen.append)
    logger.close("done")
    first = next(i for i, s in enumerate(seen) if "stage" not in s)
    assert all(s["update"] == 0 for s in seen[:first]) and seen[first]["update"] == 1
    stages = [s["stage"] for s in seen[:first]]
    assert all("stage" in s for s in seen[:first]) and not any("stage" in s for s in seen[first:])
    assert any(s.startswith("expert episodes (frozenlake)") for s in stages)
    assert any(s.startswith("pre-training the tiny model") for s in stages)
    assert "held-out evaluation at update 0 (episodes)" in stages
    pre = [s for s in seen[:first] if s["stage"].startswith("pre-training")]
    assert pre[-1]["done"] == pre[-1]["total"] > 0  # the last step is always forwarded
    assert not logging.getLogger(STAGE_LOGGER).handlers
