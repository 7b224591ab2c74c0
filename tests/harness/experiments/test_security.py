"""What the harness refuses to do: unpickle code from a checkpoint, echo a password, take a test hook
from the environment outside the tests, write a run outside its results folder, or leave the
process environment changed after an environment ran.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from harness.config.errors import ConfigError
from harness.diagnostics.collapse import CollapseMonitor
from harness.experiments.point import RunOptions, resolve_train_fn
from harness.experiments.redact import mask_credentials
from harness.experiments.runner import run_sweep
from harness.experiments.sweep import load_sweep, single_point
from harness.rl.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from tests.helpers import REPO  # noqa: E402
from tests.helpers.cli import TUNE_FAKE_TRAINER, harness_cli
from tests.helpers.sweeps import make_sweep, study_file
from tests.support import fake_trainer

PASSWORD = "hunter2-s3cret"


# ----------------------------------------------------------------------------- checkpoints
class _Payload:
    """Unpickling this runs code: it creates the file it names."""

    def __init__(self, path: Path):
        self.path = str(path)

    def __reduce__(self):
        return (Path.touch, (Path(self.path),))


def _model_and_optimizer(seed: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Dropout(0.1), torch.nn.Linear(8, 2))
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2)


def test_a_real_checkpoint_loads_with_weights_only_including_optimizer_and_rng_state(tmp_path):
    model, opt = _model_and_optimizer(0)
    for _ in range(3):
        opt.zero_grad()
        model(torch.randn(5, 4)).pow(2).sum().backward()
        opt.step()
    monitor = CollapseMonitor()
    for step, kl in enumerate([0.01, 0.02, 3.0]):  # a KL blow-up: an event in the saved state
        monitor.update(step, {"diag/kl_k3": kl, "env/group_reward_std": 0.5})
    state = {"best": {"update": 2, "success": 0.5}, "collapse": monitor.state_dict(), "init_eval": {"x": 1.0}}
    save_checkpoint(tmp_path, 7, {"policy": model}, opt, state)
    rng = torch.get_rng_state()
    torch.manual_seed(123)  # the load must bring the saved RNG state back
    fresh, fresh_opt = _model_and_optimizer(1)
    update, loaded = load_checkpoint(tmp_path, {"policy": fresh}, fresh_opt)
    assert update == 7 and loaded == state and loaded["collapse"]["events"]
    assert torch.equal(torch.get_rng_state(), rng)
    for a, b in zip(model.parameters(), fresh.parameters()):
        assert torch.equal(a, b)
    saved, restored = opt.state_dict(), fresh_opt.state_dict()
    assert saved["param_groups"] == restored["param_groups"]
    for k, v in saved["state"].items():
        assert all(torch.equal(v[n], restored["state"][k][n]) for n in ("exp_avg", "exp_avg_sq", "step"))


def test_a_crafted_checkpoint_is_refused_and_runs_no_code(tmp_path):
    model, opt = _model_and_optimizer(0)
    marker = tmp_path / "code-ran"
    (tmp_path / "checkpoint").mkdir()
    torch.save({"update": 3, "weights": {}, "optimizer": _Payload(marker)}, tmp_path / "checkpoint" / "state.pt")
    with pytest.raises(CheckpointError, match="refused to load the checkpoint"):
        load_checkpoint(tmp_path, {"policy": model}, opt)
    assert not marker.exists()


# ----------------------------------------------------------------------------- credentials
@pytest.mark.parametrize(
    "text, masked",
    [
        ("postgresql://bob:pa@ss@db:5432/optuna", "postgresql://bob:***@db:5432/optuna"),
        ("see mysql+pymysql://u:p%40w@h/db?x=1 and http://h", "see mysql+pymysql://u:***@h/db?x=1 and http://h"),
        (
            "postgresql://h/db?user=a&password=zz&sslmode=require",
            "postgresql://h/db?user=a&password=***&sslmode=require",
        ),
        ("sqlite:////tmp/x.db, https://user@host/x, a:b@c", "sqlite:////tmp/x.db, https://user@host/x, a:b@c"),
    ],
)
def test_mask_credentials(text, masked):
    assert mask_credentials(text) == masked


def test_storage_and_tracking_passwords_never_reach_a_message(tmp_path, capsys):
    url = f"postgresql://optuna:{PASSWORD}@127.0.0.1:1/db"  # no driver installed: an error naming the URL
    out = harness_cli(
        "tune",
        str(study_file(tmp_path)),
        "--storage",
        url,
        "--results",
        str(tmp_path / "r"),
        "--no-mlflow",
        HARNESS_TRAIN_FN=TUNE_FAKE_TRAINER,
    )
    assert out.returncode == 2 and "--storage postgresql://optuna:***@127.0.0.1:1/db" in out.stderr, out.stderr
    assert PASSWORD not in out.stdout + out.stderr
    sweep = load_sweep(make_sweep(tmp_path, grid="algo.lr: [1.0e-4]", seeds="[0]", base="env: {name: frozenlake}\n"))
    uri = f"postgresql://mlflow:{PASSWORD}@127.0.0.1:1/db"
    assert run_sweep(sweep, RunOptions(tmp_path / "res", uri, fake_trainer.train)).ok  # MLflow trouble only warns
    printed = capsys.readouterr()
    assert "postgresql://mlflow:***@127.0.0.1:1/db" in printed.out + printed.err
    assert PASSWORD not in printed.out + printed.err


# ----------------------------------------------------------------------------- test hooks and paths
def test_the_train_fn_hook_is_honoured_only_when_testing(monkeypatch, capsys):
    from harness.rl.trainer import train

    monkeypatch.setenv("HARNESS_TRAIN_FN", "tests.support.fake_trainer:train")
    assert resolve_train_fn(None) is fake_trainer.train  # tests/conftest.py sets HARNESS_TESTING=1
    monkeypatch.delenv("HARNESS_TESTING")
    assert resolve_train_fn(None) is train
    assert "HARNESS_TRAIN_FN=tests.support.fake_trainer:train ignored: it is a testing hook" in capsys.readouterr().err
    assert resolve_train_fn("tests.support.fake_trainer:train") is fake_trainer.train  # an explicit RunOptions.train_fn


@pytest.mark.parametrize("name", ["../../x", "a/b", "..", ".hidden", "/abs", "a\\b", ""])
def test_run_names_that_leave_the_results_folder_are_refused(name):
    with pytest.raises(ConfigError, match="is not a results folder name"):
        single_point(REPO / "configs" / "frozenlake_tiny.yaml", [], name)


def test_run_name_with_a_path_is_one_paragraph_and_exit_2(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "harness", "run", "configs/frozenlake_tiny.yaml", "--name", "../../x"]
        + ["--out", str(tmp_path / "a" / "b"), "--no-mlflow"],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO), "HARNESS_TRAIN_FN": "tests.support.fake_trainer:train"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2 and "--name '../../x' is not a results folder name" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr and not (tmp_path / "x").exists()
