"""`harness tune`: trials as points, pruning, resume after a real interruption, two workers on one
SQLite study, bad search spaces through the CLI, --show, and one study with the real trainer.

Real Optuna storage (SQLite files) everywhere; the fake trainer tests/support/tune_fake_trainer.py
(HARNESS_TRAIN_FN) where the real one would be too slow.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
import yaml
from optuna.trial import TrialState

from harness.config.errors import ConfigError
from harness.experiments.study import load_study
from harness.experiments.tuner import TuneOptions, default_storage, run_study
from harness.store import read_jsonl
from tests.helpers import REPO  # noqa: E402
from tests.helpers.sweeps import study_file
from tests.support import tune_fake_trainer
from tests.support.pause import RESUME, paused, resume, start_interruptible, wait_until

FAKE = "tests.support.tune_fake_trainer:train"
SHARED_CACHE = os.environ["HARNESS_CACHE"]  # conftest: one cache (tiny model) for the whole session


def harness(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "harness", *args],
        cwd=REPO,
        env=cli_env(**env),
        capture_output=True,
        text=True,
        timeout=300,
    )


def cli_env(**env: str) -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "HARNESS_TRAIN_FN": FAKE,
        "HARNESS_CACHE": SHARED_CACHE,
        **env,
    }


def trials(results: Path, name: str = "s") -> list[optuna.trial.FrozenTrial]:
    return optuna.load_study(study_name=name, storage=default_storage(results, name)).get_trials()


def finished(ts: list) -> list:
    return [t for t in ts if t.state in (TrialState.COMPLETE, TrialState.PRUNED)]


def calls(results: Path, point: str, name: str = "s") -> list[dict]:
    return read_jsonl(results / name / point / tune_fake_trainer.CALLS)


# ----------------------------------------------------------------------------- in-process
def test_trials_are_points_and_pruned_trials_are_recorded(tmp_path, monkeypatch):
    monkeypatch.setenv("HARNESS_TRAIN_FN", FAKE)
    study = load_study(
        study_file(tmp_path, mlflow=True, n_trials=8, seeds=[0, 1], pruner={"name": "median", "n_startup_trials": 2})
    )
    results, lines = tmp_path / "results", []
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    run_study(study, TuneOptions(results=results, mlflow_uri=uri, say=lines.append))
    ts = trials(results)
    assert len(finished(ts)) == 8 and not [t for t in ts if t.state == TrialState.FAIL]
    complete = [t for t in ts if t.state == TrialState.COMPLETE]
    pruned = [t for t in ts if t.state == TrialState.PRUNED]
    assert complete and pruned
    for t in complete:  # the objective: final eval_greedy/success, mean over the two seeds
        lr = t.params["algo.lr"]
        assert t.value == pytest.approx((tune_fake_trainer.score(lr, 0, 4) + tune_fake_trainer.score(lr, 1, 4)) / 2)
        assert len(t.user_attrs["points"]) == 2
        for pid in t.user_attrs["points"]:
            d = results / "s" / pid
            assert (d / "status").read_text().strip() == "done"
            summary = json.loads((d / "summary.json").read_text())
            assert summary["sweep"] == "s" and summary["overrides"]["algo.lr"] == lr
            assert {"config.yaml", "metrics.jsonl", "events.jsonl"} <= {f.name for f in d.iterdir()}
    for t in pruned:  # pruned at an evaluation: the point says so, not "failed"
        dirs = [results / "s" / pid for pid in t.user_attrs["points"]]
        statuses = [(d / "status").read_text().strip() for d in dirs if (d / "status").exists()]
        assert statuses[-1] == "pruned" and set(statuses[:-1]) <= {"done"}
        summary = json.loads((dirs[len(statuses) - 1] / "summary.json").read_text())
        assert summary["status"] == "pruned" and summary["error"].startswith("pruned at update")
        assert t.intermediate_values
    assert any(line.startswith(f"trial {pruned[0].number} pruned") for line in lines)
    from mlflow.tracking import MlflowClient

    runs = MlflowClient(uri).search_runs([MlflowClient(uri).get_experiment_by_name("s").experiment_id])
    tagged = {(r.data.tags["study"], r.data.tags["trial"], r.data.tags["status"]) for r in runs}
    assert ("s", str(pruned[0].number), "pruned") in tagged
    assert ("s", str(complete[0].number), "done") in tagged


def test_a_config_sampled_again_reuses_its_point(tmp_path, monkeypatch):
    monkeypatch.setenv("HARNESS_TRAIN_FN", FAKE)
    study = load_study(study_file(tmp_path, n_trials=4, space={"algo.lr": {"type": "categorical", "choices": [0.001]}}))
    run_study(study, TuneOptions(results=tmp_path / "results", say=lambda s: None))
    ts = trials(tmp_path / "results")
    assert len(ts) == 4 and len({t.user_attrs["points"][0] for t in ts}) == 1
    assert len(calls(tmp_path / "results", ts[0].user_attrs["points"][0])) == 1  # trained once
    assert len({t.value for t in ts}) == 1


def test_objective_value_final_best_and_missing_metric():
    from harness.experiments.study import ObjectiveSpec, objective_value

    rows = [{"update": 0, "m": 0.9}, {"update": 1, "x": 1.0}, {"update": 2, "m": 0.2}, {"update": 4, "m": 0.5}]
    assert objective_value(rows, ObjectiveSpec(metric="m"), "d") == 0.5
    assert objective_value(rows, ObjectiveSpec(metric="m", at="best"), "d") == 0.5  # update 0 is not a result
    assert objective_value(rows, ObjectiveSpec(metric="m", at="best", direction="minimize"), "d") == 0.2
    with pytest.raises(
        ConfigError,
        match="objective.metric 'eval_greedy/success' is not in d/metrics.jsonl; metrics there: m, update, x",
    ):
        objective_value(rows, ObjectiveSpec(), "d")


# ----------------------------------------------------------------------------- interruptions
def _interrupt_after_two_trials(tmp_path: Path, sig: int, **over) -> tuple[Path, Path, str]:
    """Start `harness tune`, stop it with `sig` while its third trial is past a checkpoint.

    Every trial stops after update 2 until this lets it go: the first two are let go, the third is
    where the signal arrives."""
    path, results = study_file(tmp_path, **over), tmp_path / "results"
    proc = start_interruptible(
        [sys.executable, "-m", "harness", "tune", str(path), "--results", str(results), "--no-mlflow"],
        REPO,
        cli_env(FAKE_PAUSE_AT="2"),
    )

    def waiting() -> list[Path]:
        dirs = list((results / "s").glob("lr=*")) if (results / "s").exists() else []
        return [d for d in dirs if paused(d) and not (d / RESUME).exists()]

    for _ in range(2):
        wait_until(lambda: bool(waiting()), proc)
        resume(waiting()[0])
    wait_until(lambda: bool(waiting()), proc)
    interrupted = waiting()[0]
    proc.send_signal(sig)
    proc.communicate(timeout=60)
    return path, results, interrupted.name


def _check_resumed(results: Path, interrupted: str) -> None:
    ts = trials(results)
    assert len(finished(ts)) == 4
    points = [t.user_attrs["points"][0] for t in finished(ts)]
    assert len(points) == len(set(points)) and interrupted in points  # no trial ran twice
    for pid in points:
        starts = [c["start"] for c in calls(results, pid)]
        assert starts == ([0, starts[-1]] if pid == interrupted else [0]), (pid, starts)
    assert [c["start"] for c in calls(results, interrupted)][1] >= 1  # resumed from its checkpoint
    rows = read_jsonl(results / "s" / interrupted / "metrics.jsonl")
    assert [r["update"] for r in rows] == [0, 1, 2, 3, 4]


def test_ctrl_c_then_rerun_resumes_the_study_without_repeating_trials(tmp_path):
    path, results, interrupted = _interrupt_after_two_trials(tmp_path, signal.SIGINT)
    ts = trials(results)
    assert [t.state for t in ts] == [TrialState.COMPLETE, TrialState.COMPLETE, TrialState.FAIL, TrialState.WAITING]
    assert ts[3].user_attrs["resumes"] == 2
    assert (results / "s" / interrupted / "status").read_text().strip() == "running"
    out = harness("tune", str(path), "--results", str(results), "--no-mlflow")
    assert out.returncode == 0, out.stderr
    assert "trial 3 (again, for trial 2)" in out.stdout
    ts = trials(results)
    assert ts[3].params == ts[2].params and ts[3].user_attrs["points"] == [interrupted]
    _check_resumed(results, interrupted)


def test_a_killed_worker_s_trial_is_run_again_after_its_heartbeat_goes_stale(tmp_path):
    path, results, interrupted = _interrupt_after_two_trials(tmp_path, signal.SIGKILL)
    assert [t.state for t in trials(results)][-1] == TrialState.RUNNING  # killed: nobody marked it
    out = harness("tune", str(path), "--results", str(results), "--no-mlflow")
    assert out.returncode == 0, out.stdout + out.stderr
    ts = trials(results)
    assert ts[2].state == TrialState.FAIL and any(t.params == ts[2].params for t in finished(ts))
    _check_resumed(results, interrupted)


def test_two_workers_share_one_sqlite_study_without_duplicate_trials(tmp_path):
    path, results = study_file(tmp_path, n_trials=8), tmp_path / "results"
    cmd = [sys.executable, "-m", "harness", "tune", str(path), "--results", str(results), "--no-mlflow"]
    gate = tmp_path / "both-workers-have-a-trial"  # each worker's first trial waits for the other's
    env = cli_env(FAKE_PAUSE_AT="1", FAKE_GATE=str(gate))
    procs = [
        subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for _ in range(2)
    ]
    wait_until(lambda: (results / "s").exists() and len([d for d in (results / "s").glob("lr=*") if paused(d)]) >= 2)
    gate.touch()
    outs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    ts = trials(results)
    assert 8 <= len(finished(ts)) <= 9 and len(ts) == len(finished(ts))  # a race may start one extra
    assert len({t.user_attrs["worker"] for t in ts}) == 2  # both workers ran trials
    points = [t.user_attrs["points"][0] for t in ts]
    assert len(points) == len(set(points))  # per-trial seeds: no repeats
    assert all(len(calls(results, pid)) == 1 for pid in points)  # every point trained once


# ----------------------------------------------------------------------------- CLI: errors and --show
BAD_SPACES = [
    (
        {"algo.lrr": {"type": "float", "low": 0.1, "high": 0.2}},
        "space.algo.lrr: unknown config key 'algo.lrr'. Did you mean 'algo.lr'?",
    ),
    ({"algo.lr": {"type": "float", "low": 0.1, "high": 0.01}}, "space.algo.lr: low = 0.1 is greater than high = 0.01"),
    (
        {"algo.kl.coef": {"type": "float", "low": 0.0, "high": 0.1, "log": True}},
        "space.algo.kl.coef: log scale needs low > 0, got low = 0",
    ),
    (
        {"algo.agg": {"type": "categorical", "choices": ["token-mean", "token-sum"]}},
        "space.algo.agg: the value 'token-sum' is not valid for the config",
    ),
    ({"context.policy": {"type": "categorical", "choices": ["full", "windows"]}}, "choose one of: full, window"),
    (
        {"rollout.group_size": {"type": "float", "low": 2, "high": 8}},
        "rollout.group_size is an integer setting; use type: int",
    ),
    ({"algo.lr": {"type": "float", "low": 0.1, "high": 0.2, "choices": [1]}}, "choices apply to categorical"),
    ({"train.seed": {"type": "int", "low": 0, "high": 3}}, "set by the study's `seeds` list"),
]


@pytest.mark.parametrize(
    "space, message", BAD_SPACES, ids=[next(iter(s)) + str(i) for i, (s, _) in enumerate(BAD_SPACES)]
)
def test_bad_search_spaces_are_one_paragraph_errors(tmp_path, space, message):
    out = harness("tune", str(study_file(tmp_path, space=space)), "--results", str(tmp_path / "r"))
    assert out.returncode == 2, out.stderr
    assert message in out.stderr and "Traceback" not in out.stderr and str(tmp_path) in out.stderr
    assert not (tmp_path / "r").exists()  # nothing ran, nothing written


def test_bad_sampler_pruner_and_storage_are_clear_errors(tmp_path):
    with pytest.raises(
        ConfigError, match="pruner: unknown option 'n_startup' for MedianPruner; valid options: n_startup_trials"
    ):
        load_study(study_file(tmp_path, pruner={"name": "median", "n_startup": 2}))
    with pytest.raises(ConfigError, match="sampler.name = 'cmaes' is not a valid choice; choose one of: tpe, random"):
        load_study(study_file(tmp_path, sampler={"name": "cmaes"}))
    out = harness(
        "tune",
        str(study_file(tmp_path)),
        "--storage",
        "nosuchdb://x/y",
        "--results",
        str(tmp_path / "r"),
        "--no-mlflow",
    )
    assert out.returncode == 2 and "--storage nosuchdb://x/y: cannot open it" in out.stderr
    assert "Traceback" not in out.stderr


def test_show_prints_best_trial_and_importances(tmp_path):
    path, results = study_file(tmp_path, n_trials=1), tmp_path / "results"
    out = harness("tune", str(path), "--results", str(results), "--show")
    assert out.returncode == 2 and "no study 's' yet" in out.stderr
    assert harness("tune", str(path), "--results", str(results), "--no-mlflow").returncode == 0
    out = harness("tune", str(path), "--results", str(results), "--show")
    assert out.returncode == 0 and "best trial 0: eval_greedy/success =" in out.stdout
    assert "parameter importances: not shown: 1 complete trial(s); at least 4 are needed" in out.stdout
    assert harness("tune", str(path), "--results", str(results), "--no-mlflow", "--n-trials", "5").returncode == 0
    out = harness("tune", str(path), "--results", str(results), "--show")
    best = max(finished(trials(results)), key=lambda t: t.value)
    assert f"best trial {best.number}: eval_greedy/success = {best.value:.4g}" in out.stdout
    assert "study s: 5 trials (5 complete)" in out.stdout
    listed = out.stdout.split("trials:\n")[1].split("best trial")[0].splitlines()[1:]
    assert [int(line.split()[0]) for line in listed] == [0, 1, 2, 3, 4]  # every trial, not only the best
    assert all(" complete " in line and "algo.lr=" in line for line in listed)
    importances = out.stdout.split("parameter importances:\n")[1].split()
    assert importances[0] == "algo.lr" and "rollout.group_size" in importances  # lr drives the fake metric


def test_importances_are_suppressed_for_a_constant_objective(tmp_path):
    from optuna.distributions import FloatDistribution

    from harness.experiments.tuner import describe

    ostudy = optuna.create_study(direction="maximize")
    for i in range(5):
        ostudy.add_trial(
            optuna.trial.create_trial(
                params={"algo.lr": 1e-4 * (i + 1)},
                distributions={"algo.lr": FloatDistribution(1e-4, 1e-2)},
                value=0.5,
            )
        )
    lines = describe(load_study(study_file(tmp_path)), ostudy, tmp_path)
    assert lines[-1] == "parameter importances: not shown: every complete trial has the same objective (0.5)"
    assert sum(line.split()[1:2] == ["complete"] for line in lines) == 5  # every trial is listed


# ----------------------------------------------------------------------------- the shipped study, real trainer
def test_shipped_study_loads():
    study = load_study(REPO / "sweeps" / "tune_grpo.yaml")
    assert study.name == "tune_grpo" and {"algo.lr", "rollout.group_size"} <= set(study.spec.space)
    assert study.points({"algo.lr": 1e-3, "algo.clip.eps_high": 0.25, "algo.kl.coef": 0.01, "rollout.group_size": 2})[
        0
    ].config.rollout.constrain


def test_a_tiny_study_with_the_real_trainer(tmp_path, monkeypatch):
    from tests.helpers.configs import TINY

    monkeypatch.delenv("HARNESS_TRAIN_FN", raising=False)
    base = json.loads(json.dumps(TINY))
    base["train"].update(updates=2, eval_every=1, mi_every=0)
    base["tracking"]["mlflow"] = True
    path = study_file(
        tmp_path,
        base=base,
        n_trials=2,
        sampler={"name": "random", "seed": 3},
        space={
            "algo.lr": {"type": "float", "low": 1.0e-4, "high": 1.0e-2, "log": True},
            "algo.kl.coef": {"type": "categorical", "choices": [0.0, 0.05]},
        },
    )
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    ostudy = run_study(load_study(path), TuneOptions(results=tmp_path / "results", mlflow_uri=uri, say=print))
    ts = ostudy.get_trials()
    assert [t.state for t in ts] == [TrialState.COMPLETE] * 2
    for t in ts:
        d = tmp_path / "results" / "s" / t.user_attrs["points"][0]
        rows = read_jsonl(d / "metrics.jsonl")
        assert [r["update"] for r in rows] == [0, 1, 2]
        assert t.value == rows[-1]["eval_greedy/success"]
        assert sorted(t.intermediate_values) == [1, 2]  # reported at each evaluation
        summary = json.loads((d / "summary.json").read_text())
        assert summary["status"] == "done" and summary["metrics"]["final/eval_greedy/success"] == t.value
        assert yaml.safe_load((d / "config.yaml").read_text())["algo"]["lr"] == t.params["algo.lr"]
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("s").experiment_id])
    assert sorted(r.data.tags["trial"] for r in runs) == ["0", "1"]
