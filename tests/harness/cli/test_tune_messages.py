"""`harness tune` / `harness sweep` through the real CLI: a file of the other kind is named as such,
a bad objective name is one paragraph, a finished study says its target is reached, and
`--workers N` runs N workers on one SQLite study.

The trainer is tests/support/trust_trainer.py (HARNESS_TRAIN_FN); real Optuna storage.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
import yaml
from optuna.trial import TrialState

REPO = Path(__file__).resolve().parents[3]
TRUST = "tests.support.trust_trainer:train"


def harness(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "harness", *args],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO), "HARNESS_TRAIN_FN": TRUST, **env},
        capture_output=True,
        text=True,
        timeout=300,
    )


def study_file(tmp_path: Path, **over) -> Path:
    spec = {
        "name": "s",
        "base": {"env": {"name": "frozenlake"}, "train": {"updates": 2, "eval_every": 1, "checkpoint_every": 1}},
        "space": {"algo.lr": {"type": "float", "low": 1.0e-4, "high": 3.0e-3, "log": True}},
        "objective": "gain",
        "pruner": "none",
        "n_trials": 4,
        "heartbeat_s": 1,
        **over,
    }
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def test_a_sweep_file_given_to_tune_is_named_a_sweep_file(tmp_path):
    out = harness("tune", "sweeps/clipping.yaml", "--results", str(tmp_path / "r"))
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.startswith(
        "error: sweeps/clipping.yaml: this is a sweep file (it has points, baseline, metric and no `space`); "
        "run it with `harness sweep sweeps/clipping.yaml`."
    ), out.stderr
    assert "unknown key" not in out.stderr and not (tmp_path / "r").exists()


def test_a_study_file_given_to_sweep_is_named_a_study_file(tmp_path):
    out = harness("sweep", "sweeps/tune_grpo.yaml", "--results", str(tmp_path / "r"))
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "sweeps/tune_grpo.yaml: this is a study file (it has space, objective" in out.stderr
    assert "run it with `harness tune sweeps/tune_grpo.yaml`" in out.stderr
    assert "unknown key" not in out.stderr and not (tmp_path / "r").exists()


def test_a_bad_objective_name_is_one_paragraph(tmp_path):
    path = study_file(tmp_path, objective="sampled-gain")
    out = harness("tune", str(path), "--results", str(tmp_path / "r"))
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert f"{path}: objective = 'sampled-gain' is not an objective name. Did you mean 'sampled_gain'?" in out.stderr
    assert "Choose one of: gain, sampled_gain, greedy_gain" in out.stderr


def test_workers_share_the_study_and_a_finished_study_says_its_target_is_reached(tmp_path):
    path, results = study_file(tmp_path), tmp_path / "results"
    gate = tmp_path / "gate"  # every trial waits until both workers hold one
    out = harness(
        "tune", str(path), "--results", str(results), "--no-mlflow", "--workers", "2", TRUST_GATE_DIR=str(gate)
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "[worker 1] trial " in out.stdout and "[worker 2] trial " in out.stdout
    assert out.stdout.count("study s: ") == 1  # one summary, from the first worker, after the others
    ts = optuna.load_study(study_name="s", storage=f"sqlite:///{results.resolve() / 's' / 'optuna.db'}").get_trials()
    finished = [t for t in ts if t.state == TrialState.COMPLETE]
    assert 4 <= len(finished) <= 5 and len({t.user_attrs["worker"] for t in finished}) == 2
    points = [t.user_attrs["points"][0] for t in finished]
    assert len(points) == len(set(points))

    again = harness("tune", str(path), "--results", str(results), "--no-mlflow")
    assert again.returncode == 0
    assert f"study s: target reached: it holds {len(finished)} finished trials and the target is 4" in again.stdout


@pytest.mark.slow
def test_sigterm_to_workers_requeues_every_running_trial(tmp_path):
    """SIGTERM (or Ctrl-C) to `harness tune --workers 2` reaches both workers: each requeues its trial."""
    path, results, gate = study_file(tmp_path), tmp_path / "results", tmp_path / "gate"
    cmd = [sys.executable, "-m", "harness", "tune", str(path), "--results", str(results), "--no-mlflow"]
    env = {**os.environ, "PYTHONPATH": str(REPO), "HARNESS_TRAIN_FN": TRUST, "TRUST_DELAY": "30"}
    proc = subprocess.Popen(
        [*cmd, "--workers", "2"], cwd=REPO, env={**env, "TRUST_GATE_DIR": str(gate)}, stdout=subprocess.PIPE, text=True
    )
    deadline = time.monotonic() + 240
    while not (gate.exists() and len(list(gate.iterdir())) >= 2):  # both workers hold a trial
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    out = proc.communicate(timeout=240)[0]
    assert proc.returncode == 130, out
    assert "[worker 2] interrupted" in out and out.rstrip().endswith("(the interrupted trial runs first)")
    ts = optuna.load_study(study_name="s", storage=f"sqlite:///{results.resolve() / 's' / 'optuna.db'}").get_trials()
    assert [t.state for t in ts] == [TrialState.FAIL] * 2 + [TrialState.WAITING] * 2
    assert sorted(t.user_attrs["resumes"] for t in ts[2:]) == [0, 1]
