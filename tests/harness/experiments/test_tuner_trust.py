"""`harness tune` that a new user can trust: objectives that reward learning, trials whose policy did
not move (marked, or rejected so they cannot be the best), trial numbers that agree between --show
and MLflow after a retried trial, a finished study that says so, and the baseline a table of a study
folder names.

Real Optuna storage (SQLite files) and a real MLflow store; the trainer is tests/support/trust_trainer.py
(HARNESS_TRAIN_FN), whose policy does not move below lr 3e-5 while greedy success falls and sampled
success rises for the trials that train: the new user's study in miniature.
"""

from __future__ import annotations

import json
from pathlib import Path

import optuna
import pytest
import yaml
from optuna.trial import TrialState

from harness.config.errors import ConfigError
from harness.experiments.study import ObjectiveSpec, TuneStudy, load_study, movement, objective_value
from harness.experiments.tuner import (
    TuneOptions,
    default_storage,
    describe,
    load_optuna_study,
    open_storage,
    run_study,
)
from tests.support import trust_trainer

REPO = Path(__file__).resolve().parents[3]
TRUST = "tests.support.trust_trainer:train"
SHIPPED = REPO / "sweeps" / "tune_grpo.yaml"


def study_file(tmp_path: Path, name: str = "s", mlflow: bool = False, **over) -> Path:
    spec = {
        "name": name,
        "base": {
            "env": {"name": "frozenlake"},
            "tracking": {"mlflow": mlflow},
            "train": {"updates": 4, "eval_every": 2, "checkpoint_every": 1},
        },
        "space": {"algo.lr": {"type": "float", "low": 1.0e-5, "high": 3.0e-3, "log": True}},
        "objective": "greedy_final",
        "sampler": {"name": "random", "seed": 0},
        "pruner": "none",
        "n_trials": 5,
        "heartbeat_s": 1,
        **over,
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def enqueue(study: TuneStudy, results: Path, params: list[dict]) -> None:
    """Create the study in its default storage with these trials first in line."""
    storage = open_storage(default_storage(results, study.name), study.spec.heartbeat_s)
    ostudy = load_optuna_study(study, storage)
    for p in params:
        ostudy.enqueue_trial(p)


def run(study: TuneStudy, results: Path, params: list[dict], **opts) -> tuple[optuna.Study, list[str]]:
    enqueue(study, results, params)
    lines: list[str] = []
    return run_study(study, TuneOptions(results=results, say=lines.append, **opts)), lines


LRS = [1e-5, 2e-5, 1e-4, 3e-4, 1e-3]  # the first two do not move


@pytest.fixture
def trust(monkeypatch):
    monkeypatch.setenv("HARNESS_TRAIN_FN", TRUST)


# ----------------------------------------------------------------------------- objectives
def test_named_objectives_and_the_gain():
    rows = [
        {"update": 0, "eval_sampled/success": 0.5, "eval_greedy/success": 0.75},
        {"update": 2, "eval_sampled/success": 0.625, "eval_greedy/success": 0.5},
        {"update": 4, "eval_sampled/success": 0.5625, "eval_greedy/success": 0.625},
    ]
    gain = ObjectiveSpec.model_validate({"metric": "eval_sampled/success", "at": "gain"})
    assert objective_value(rows, gain, "d") == pytest.approx(0.0625)
    assert objective_value(rows, ObjectiveSpec(metric="eval_greedy/success", at="gain"), "d") == pytest.approx(-0.125)
    with pytest.raises(ConfigError, match="at: gain needs the update-0 evaluation of 'eval_sampled/success'"):
        objective_value(rows[1:], gain, "d")


def test_objective_names_and_a_bad_one_are_checked_at_load(tmp_path):
    study = load_study(study_file(tmp_path, objective="gain"))
    assert (study.spec.objective.metric, study.spec.objective.at) == ("eval_sampled/success", "gain")
    assert load_study(study_file(tmp_path, objective="greedy_final")).spec.objective.metric == "eval_greedy/success"
    path = study_file(tmp_path, objective="gian")
    with pytest.raises(ConfigError) as e:
        load_study(path)
    text = str(e.value)
    assert text.startswith(f"{path}: objective = 'gian' is not an objective name. Did you mean 'gain'?")
    assert "gain, sampled_gain, greedy_gain, sampled_final, greedy_final, sampled_best, greedy_best" in text
    with pytest.raises(ConfigError, match=r"objective.at = 'gains'.*final, best, gain"):
        load_study(study_file(tmp_path, objective={"metric": "eval_sampled/success", "at": "gains"}))


# ----------------------------------------------------------------------------- movement
def _rows(evals: list[float], kl: list[float] | None) -> list[dict]:
    rows = [{"update": 0, "eval_greedy/success": evals[0], "eval_sampled/success": 0.5}]
    for u in range(1, 5):
        row = {"update": u, **({"diag/kl_k3": kl[u - 1]} if kl is not None else {})}
        if u % 2 == 0:
            row.update({"eval_greedy/success": evals[u // 2], "eval_sampled/success": 0.5})
        rows.append(row)
    return rows


def test_the_rule_for_a_policy_that_did_not_move():
    m = "eval_greedy/success"
    assert movement(_rows([0.75, 0.75, 0.75], [0.0, 1e-5, 2e-4, 9e-4]), m, 1e-3).moved is False
    assert movement(_rows([0.75, 0.75, 0.75], None), m, 1e-3).moved is False  # no KL logged: evaluations decide
    assert movement(_rows([0.75, 0.75, 0.7], [0.0, 0.0, 0.0, 0.0]), m, 1e-3).moved is True  # an evaluation moved
    assert movement(_rows([0.75, 0.75, 0.75], [0.0, 2e-3, 0.0, 0.0]), m, 1e-3).moved is True  # the KL moved
    only_start = [{"update": 0, m: 0.75}, {"update": 1, "diag/kl_k3": 0.0}]
    assert movement(only_start, m, 1e-3).moved is None  # no evaluation after update 0: cannot tell
    sampled = _rows([0.75, 0.75, 0.75], [0.0] * 4)
    sampled[-1]["eval_sampled/success"] = 0.5625
    assert movement(sampled, m, 1e-3).moved is True  # sampled success counts even under a greedy objective


# ----------------------------------------------------------------------------- the shipped study
def test_the_shipped_study_cannot_pick_a_trial_whose_policy_did_not_move(tmp_path, trust):
    shipped = load_study(SHIPPED)
    obj = shipped.spec.objective
    assert (obj.metric, obj.at, obj.direction, shipped.spec.unmoved) == (
        "eval_sampled/success",
        "gain",
        "maximize",
        "reject",
    )
    still = {"algo.lr": 1e-5, "algo.clip.eps_high": 0.25, "algo.kl.coef": 0.01, "rollout.group_size": 2}
    trials = [still, {**still, "algo.lr": 3e-4}, {**still, "algo.lr": 2e-3}]
    ostudy, lines = run(shipped, tmp_path / "results", trials, n_trials=3)
    ts = ostudy.get_trials()
    assert ts[0].state == TrialState.PRUNED and ts[0].user_attrs["point_status"] == "did not move"
    assert ts[0].user_attrs["rejected_value"] == 0.0 and ts[0].user_attrs["moved"] == [False]
    assert "trial 0 pruned (did not move) (value 0 not counted)" in " ".join(lines)
    assert ostudy.best_trial.number == 1 and ostudy.best_trial.user_attrs["moved"] == [True]
    assert ostudy.best_trial.value == pytest.approx(trust_trainer.sampled_slope(3e-4) * 12, abs=1e-9)

    # the same trials scored as the new user's study was (final greedy success, unmoved trials kept):
    # the trial that did not train wins, and --show says so
    old = TuneStudy(
        shipped.spec.model_copy(update={"name": "old", "objective": ObjectiveSpec(), "unmoved": "mark"}),
        shipped.path,
        shipped.base,
    )
    ostudy, _ = run(old, tmp_path / "results", trials, n_trials=3)
    assert ostudy.best_trial.number == 0 and ostudy.best_trial.user_attrs["unmoved"] is True
    text = "\n".join(describe(old, ostudy, tmp_path / "results"))
    assert "warning: the best trial did not move" in text and "The best trial that moved is trial 1" in text


# ----------------------------------------------------------------------------- --show
def test_show_marks_trials_that_did_not_move_and_counts_the_trials_under_importances(tmp_path, trust):
    study = load_study(study_file(tmp_path))
    results = tmp_path / "results"
    ostudy, _ = run(study, results, [{"algo.lr": lr} for lr in LRS])
    lines = describe(study, ostudy, results)
    listed = {int(line.split()[0]): line for line in lines if line.startswith("  ") and line.split()[0].isdigit()}
    assert all("complete (did not move)" in listed[n] for n in (0, 1))
    assert not any("did not move" in listed[n] for n in (2, 3, 4))
    assert listed[0].split()[-2] == "0" and listed[4].split()[-2] != "-"  # the KL column
    best = next(line for line in lines if line.startswith("best trial "))
    assert best in ("best trial 0: eval_greedy/success = 0.75", "best trial 1: eval_greedy/success = 0.75")
    assert any(line.startswith("warning: the best trial did not move") for line in lines)
    assert "  (fANOVA over the 5 complete trials; pruned, rejected and failed trials do not count)" in lines

    # rejected instead: pruned, their values shown in parentheses, never the best, not in importances
    study = load_study(study_file(tmp_path, name="r", unmoved="reject"))
    ostudy, _ = run(study, results, [{"algo.lr": lr} for lr in LRS])
    lines = describe(study, ostudy, results)
    assert [t.state for t in ostudy.get_trials()][:2] == [TrialState.PRUNED] * 2
    assert sum("pruned (did not move)" in line and "(0.75)" in line for line in lines) == 2
    assert "2 trial(s) did not move and were rejected (pruned, value in parentheses): 0, 1" in lines
    assert "best trial 2: eval_greedy/success = 0.746" in lines
    assert not any(line.startswith("warning: the best trial did not move") for line in lines)
    assert lines[-1].startswith("parameter importances: not shown: 3 complete trial(s)")


def test_a_gain_that_nobody_improved_is_a_warning(tmp_path, trust):
    study = load_study(study_file(tmp_path, objective="greedy_gain", unmoved="reject"))
    ostudy, _ = run(study, tmp_path / "results", [{"algo.lr": lr} for lr in (1e-5, 1e-4, 1e-3)], n_trials=3)
    lines = describe(study, ostudy, tmp_path / "results")
    assert "best trial 1: gain of eval_greedy/success (last - update 0) = -0.004" in lines
    assert "warning: no complete trial improved on its start: the best gain is -0.004" in lines


# ----------------------------------------------------------------------------- trial numbers, re-runs
def test_a_retried_trial_has_the_same_number_in_mlflow_as_in_show(tmp_path, trust):
    from mlflow.tracking import MlflowClient

    study = load_study(study_file(tmp_path, mlflow=True, n_trials=3))
    results, uri = tmp_path / "results", f"sqlite:///{tmp_path / 'mlflow.db'}"
    (results / "s").mkdir(parents=True)
    (results / "s" / trust_trainer.INTERRUPT_AT).write_text("2")  # trial 0 is interrupted at update 2
    with pytest.raises(KeyboardInterrupt):
        run(study, results, [{"algo.lr": lr} for lr in (3e-4, 1e-3, 2e-3)], mlflow_uri=uri)
    run_study(study, TuneOptions(results=results, mlflow_uri=uri, say=lambda s: None))
    ts = optuna.load_study(study_name="s", storage=default_storage(results, "s")).get_trials()
    assert [t.state for t in ts] == [TrialState.FAIL] + [TrialState.COMPLETE] * 3
    assert ts[3].user_attrs["resumes"] == 0 and ts[3].user_attrs["points"] == ts[0].user_attrs["points"]
    client = MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("s").experiment_id])
    by_point = {r.info.run_name: r.data.tags for r in runs}
    assert len(runs) == 3  # the retried point resumed its MLflow run
    for t in ts[1:]:
        tags = by_point[t.user_attrs["points"][0]]
        assert tags["trial"] == str(t.number) and tags["status"] == "done"
    assert by_point[ts[3].user_attrs["points"][0]]["resumes_trial"] == "0"
    lines = describe(study, optuna.load_study(study_name="s", storage=default_storage(results, "s")), results)
    assert any(line.split()[:2] == ["3", "complete"] for line in lines)


def test_a_finished_study_run_again_says_the_target_is_reached(tmp_path, trust):
    study = load_study(study_file(tmp_path, n_trials=2))
    results = tmp_path / "results"
    _, first = run(study, results, [])
    assert not any("target reached" in line for line in first)
    again: list[str] = []
    run_study(study, TuneOptions(results=results, say=again.append))
    assert again == [
        "study s: target reached: it holds 2 finished trials and the target is 2 (n_trials); nothing to run. "
        "`--n-trials 7` runs 5 more."
    ]


# ----------------------------------------------------------------------------- a table of the study folder
def points_of(ostudy: optuna.Study) -> list[str]:
    return [p for t in ostudy.get_trials() for p in t.user_attrs.get("points", [])]


def test_a_table_of_a_study_folder_names_its_baseline_the_best_trial(tmp_path, trust):
    from analysis import load_results

    study = load_study(study_file(tmp_path, unmoved="reject", objective="gain"))
    results = tmp_path / "results"
    ostudy, _ = run(study, results, [{"algo.lr": lr} for lr in LRS])
    best = ostudy.best_trial
    manifest = json.loads((results / "s" / "sweep.json").read_text())
    assert manifest["study"]["baseline_trial"] == best.number == 3  # lr 3e-4: the largest sampled gain
    assert manifest["axes"] == ["algo.lr"] and manifest["baseline"] == {"algo.lr": 3e-4}
    baseline_points = [p["id"] for p in manifest["points"] if p["is_baseline"]]
    assert baseline_points == best.user_attrs["points"]
    labels = {p["label"] for p in manifest["points"]}
    assert len(manifest["points"]) == 5 and labels == {"trial 0", "trial 1", "trial 2", "trial 3 (best)", "trial 4"}
    assert manifest["study"]["baseline_note"].startswith("an Optuna study: the baseline is trial 3, the best")
    df = load_results(results / "s")
    assert set(df.loc[df["is_baseline"], "label"]) == {"trial 3 (best)"}
    assert set(df.loc[df["is_baseline"], "point"]) == set(baseline_points)
    (results / "s" / "sweep.json").unlink()  # a study folder of an older harness tune: says what it picked
    problems = load_results(results / "s").attrs["sweep"].problems
    assert problems == [
        f"an Optuna study without sweep.json: the baseline is the first point by name, {sorted(points_of(ostudy))[0]}; "
        "`harness tune FILE --show` writes sweep.json with the best trial as the baseline"
    ]


# ----------------------------------------------------------------------------- the real trainer
@pytest.mark.slow
def test_the_real_trainer_s_unmoved_policy_is_rejected(tmp_path, monkeypatch):
    """The rule on real metrics: at lr 1e-6 two updates of the tiny model leave the KL near 1e-8 and
    every evaluation as it was (rejected); at lr 3e-2 the policy moves (kept)."""
    from tests.helpers.configs import TINY

    monkeypatch.delenv("HARNESS_TRAIN_FN", raising=False)
    base = json.loads(json.dumps(TINY))
    base["train"].update(updates=2, eval_every=1, mi_every=0)
    path = study_file(
        tmp_path,
        base=base,
        unmoved="reject",
        space={"algo.lr": {"type": "categorical", "choices": [1e-6, 3e-2]}},
    )
    ostudy, _ = run(load_study(path), tmp_path / "results", [{"algo.lr": 1e-6}, {"algo.lr": 3e-2}], n_trials=2)
    still, moved = ostudy.get_trials()
    assert still.state == TrialState.PRUNED and still.user_attrs["point_status"] == "did not move"
    assert still.user_attrs["kl_max"] < 1e-4
    assert moved.state == TrialState.COMPLETE and moved.user_attrs["moved"] == [True]
    assert ostudy.best_trial.number == 1
