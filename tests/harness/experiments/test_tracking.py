"""MLflow: one run per point in a real local sqlite store, params flattened, one step per update."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid

import pytest

from harness.experiments.runner import RunOptions, run_sweep
from harness.experiments.sweep import load_sweep
from harness.experiments.tracking import RunLogger, default_tracking_uri
from harness.store import read_jsonl
from tests.support import fake_trainer
from tests.support.pause import wait_until

pytest.importorskip("mlflow")

from tests.helpers import REPO  # noqa: E402

BASE_WITH_MLFLOW = "env: {name: frozenlake}\ntrain: {updates: 3, checkpoint_every: 1}\n"


@pytest.fixture
def store() -> tuple[str, str]:
    """The session's sqlite store (tests/conftest.py; created once) and a fresh experiment name."""
    return os.environ["MLFLOW_TRACKING_URI"], f"exp-{uuid.uuid4().hex[:8]}"


def client(uri: str):
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=uri)


def test_run_logger_writes_a_run_to_a_local_store(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"  # a store of its own: created on first use
    logger = RunLogger(
        tmp_path / "run", experiment="exp", run_name="point-1", mlflow_uri=uri, tags={"config_hash": "abcd1234"}
    )
    logger.log_params({"algo.clip.level": "token", "turns.max": 8})
    for update in range(3):
        logger.log(update, {"env/success": 0.1 * update, "loss/policy": float("nan")})
    logger.close("done")

    c = client(uri)
    exp = c.get_experiment_by_name("exp")
    (run,) = c.search_runs([exp.experiment_id])
    assert run.info.run_name == "point-1" and run.info.status == "FINISHED"
    assert run.data.params == {"algo.clip.level": "token", "turns.max": "8"}
    assert run.data.tags["config_hash"] == "abcd1234" and run.data.tags["status"] == "done"
    history = c.get_metric_history(run.info.run_id, "env/success")
    assert [(m.step, round(m.value, 6)) for m in history] == [(0, 0.0), (1, 0.1), (2, 0.2)]
    assert len(read_jsonl(tmp_path / "run" / "metrics.jsonl")) == 3
    assert exp.artifact_location.startswith((tmp_path / "mlartifacts").as_uri())  # beside the store, not in cwd


def test_a_resumed_point_continues_its_mlflow_run(tmp_path, store):
    uri, exp = store
    first = RunLogger(tmp_path / "run", experiment=exp, run_name="p", mlflow_uri=uri)
    first.log(1, {"x": 1.0})
    first.close("interrupted")
    second = RunLogger(tmp_path / "run", experiment=exp, run_name="p", mlflow_uri=uri)
    second.log(2, {"x": 2.0})
    second.close("done")
    runs = client(uri).search_runs([client(uri).get_experiment_by_name(exp).experiment_id])
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"
    assert [m.step for m in client(uri).get_metric_history(runs[0].info.run_id, "x")] == [1, 2]


def test_a_run_created_by_a_call_that_then_failed_is_adopted_not_duplicated(tmp_path, store, monkeypatch):
    """A busy SQLite store can commit create_run and still raise (the run is read back after the
    commit): the retry finds the run this logger created instead of creating a second one."""
    from mlflow.tracking import MlflowClient

    uri, exp = store
    real, calls = MlflowClient.create_run, []

    def commits_then_raises_once(self, *args, **kwargs):
        run = real(self, *args, **kwargs)
        calls.append(run.info.run_id)
        if len(calls) == 1:
            raise RuntimeError("(sqlite3.OperationalError) database is locked")
        return run

    monkeypatch.setattr(MlflowClient, "create_run", commits_then_raises_once)
    logger = RunLogger(tmp_path / "run", experiment=exp, run_name="p", mlflow_uri=uri)
    logger.log(1, {"x": 1.0})
    logger.close("done")
    runs = client(uri).search_runs([client(uri).get_experiment_by_name(exp).experiment_id])
    assert len(calls) == 1 and [r.info.run_id for r in runs] == calls
    assert runs[0].info.status == "FINISHED" and runs[0].info.run_name == "p"


def test_sweep_points_become_runs_of_the_sweep_experiment(tmp_path, store):
    uri, exp = store
    (tmp_path / "base.yaml").write_text("train: {updates: 2}\n")
    (tmp_path / "s.yaml").write_text(f"name: {exp}\nbase: base.yaml\ngrid: {{algo.lr: [1.0e-4, 2.0e-4]}}\nseeds: [0]\n")
    sweep = load_sweep(tmp_path / "s.yaml")
    result = run_sweep(sweep, RunOptions(results=tmp_path / "results", mlflow_uri=uri, train_fn=fake_trainer.train))
    assert result.ok
    c = client(uri)
    runs = c.search_runs([c.get_experiment_by_name(exp).experiment_id])
    assert sorted(r.info.run_name for r in runs) == sorted(p.id for p in sweep.points)
    for r in runs:
        assert r.data.params["algo.lr"] in ("0.0001", "0.0002")
        assert r.data.tags["point_id"] == r.info.run_name
        assert len(c.get_metric_history(r.info.run_id, "env/success")) == 2


def test_default_store_is_under_results_unless_the_env_says_otherwise(tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert default_tracking_uri(tmp_path) == f"sqlite:///{tmp_path.resolve() / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://tracking.example:5000")
    assert default_tracking_uri(tmp_path) == "http://tracking.example:5000"


def test_a_broken_store_never_stops_the_run(tmp_path, capsys):
    (tmp_path / "blocker").write_text("a file where the store's folder should be")
    uri = f"sqlite:///{tmp_path / 'blocker' / 'mlflow.db'}"
    logger = RunLogger(tmp_path / "run", experiment="exp", run_name="p", mlflow_uri=uri)
    logger.log(1, {"x": 1.0})
    logger.close("done")
    assert read_jsonl(tmp_path / "run" / "metrics.jsonl") == [{"update": 1, "x": 1.0}]
    assert "MLflow logging" in capsys.readouterr().err


RACER = """
import sys, time
from pathlib import Path
from harness.experiments.tracking import ensure_experiment
folder = Path(sys.argv[1])
(folder / f"ready-{sys.argv[2]}").touch()
while not (folder / "go").exists():  # every racer is imported and waiting: start together
    time.sleep(0.001)
print(ensure_experiment(f"sqlite:///{folder / 'mlflow.db'}", "s"))
"""


def test_processes_creating_one_fresh_store_at_once_all_get_a_complete_store(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", RACER, str(tmp_path), str(i)], env=env, stdout=subprocess.PIPE, text=True
        )
        for i in range(3)
    ]
    wait_until(lambda: len(list(tmp_path.glob("ready-*"))) == 3)
    (tmp_path / "go").touch()
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], outs
    assert len({out.strip() for out, _ in outs}) == 1  # one experiment
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    c = client(uri)
    run = c.create_run(c.get_experiment_by_name("s").experiment_id)  # the store works for later runs
    c.log_metric(run.info.run_id, "x", 1.0)
    assert c.get_run(run.info.run_id).data.metrics == {"x": 1.0}


def test_two_first_sweeps_into_a_fresh_folder_both_log_to_mlflow(tmp_path):
    from tests.helpers.sweeps import make_sweep

    path, results = make_sweep(tmp_path, base=BASE_WITH_MLFLOW), tmp_path / "results"
    cmd = [sys.executable, "-m", "harness", "sweep", str(path), "--results", str(results)]
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "HARNESS_TRAIN_FN": "tests.support.fake_trainer:train",
        "MLFLOW_TRACKING_URI": "",
    }
    procs = [subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for _ in "ab"]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    assert not [o for o in outs if "warning: MLflow" in o], outs  # no "not ready" / "switched off" warning
    c = client(f"sqlite:///{results.resolve() / 'mlflow.db'}")
    runs = c.search_runs([c.get_experiment_by_name("s").experiment_id])
    assert sorted(r.info.run_name for r in runs) == sorted(p.id for p in load_sweep(path).points)
    assert {r.info.status for r in runs} == {"FINISHED"}
