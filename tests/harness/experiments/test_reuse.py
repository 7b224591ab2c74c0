"""Copying an identical finished run from another sweep folder (RunOptions.reuse, `--no-reuse`).

A CPU run is a function of its resolved config, code, packages and CPU code path, so the baseline
every sweep of one base config shares is trained once. Uses the deterministic fake trainer."""

from __future__ import annotations

import json
from pathlib import Path

import mlflow
import pytest

from harness.experiments.point import RunOptions, find_donor
from harness.experiments.runner import run_sweep
from harness.experiments.sweep import load_sweep
from harness.store import atomic_write_json, read_jsonl
from tests.support import fake_trainer

BASE = "env: {name: frozenlake}\ntrain: {updates: 3}\ntracking: {mlflow: %s}\n"


def sweep_file(tmp_path: Path, name: str, lrs: str, mlflow_on: bool = False) -> Path:
    (tmp_path / "base.yaml").write_text(BASE % ("true" if mlflow_on else "false"))
    path = tmp_path / f"{name}.yaml"
    path.write_text(f"name: {name}\nbase: base.yaml\ngrid: {{algo.lr: {lrs}}}\nseeds: [0, 1]\n")
    return path


def run(tmp_path: Path, name: str, lrs: str, **kw):
    sweep = load_sweep(sweep_file(tmp_path, name, lrs, kw.pop("mlflow_on", False)))
    result = run_sweep(sweep, RunOptions(results=tmp_path / "results", train_fn=fake_trainer.train, **kw))
    assert result.ok, result.errors
    return sweep, result


def shared(a, b) -> list[tuple[Path, Path]]:
    """(donor folder, copy folder) of the points two sweeps share (same config hash)."""
    by_hash = {p.config_hash: p for p in a.points}
    return [
        (Path(a.name) / by_hash[p.config_hash].id, Path(b.name) / p.id) for p in b.points if p.config_hash in by_hash
    ]


def test_shared_points_are_copied_byte_for_byte_and_the_rest_trained(tmp_path):
    a, _ = run(tmp_path, "first", "[1.0e-4, 2.0e-4]")
    b, result = run(tmp_path, "second", "[2.0e-4, 3.0e-4]")
    pairs = shared(a, b)
    assert len(pairs) == 2 and result.counts["done"] == 4 and result.counts["reused"] == 2
    root = tmp_path / "results"
    for donor, copy in pairs:
        assert not (root / copy / fake_trainer.CALLS).exists()  # the trainer never ran
        for name in ("metrics.jsonl", "samples.jsonl"):
            assert (root / copy / name).read_bytes() == (root / donor / name).read_bytes(), name
        summary, donor_summary = (json.loads((root / p / "summary.json").read_text()) for p in (copy, donor))
        assert summary["metrics"] == donor_summary["metrics"] and summary["sweep"] == "second"
        events = read_jsonl(root / copy / "events.jsonl")
        assert [e["event"] for e in events] == ["start", "reused", "end"] and events[1]["from"] == str(donor)
    trained = [p for p in b.points if not any(p.id == c.name for _, c in pairs)]
    assert len(trained) == 2 and all((root / "second" / p.id / fake_trainer.CALLS).exists() for p in trained)


def test_no_reuse_trains_and_a_different_provenance_or_status_is_not_a_donor(tmp_path):
    a, _ = run(tmp_path, "first", "[1.0e-4]")
    b, result = run(tmp_path, "second", "[1.0e-4]", reuse=False)
    assert result.counts.get("reused", 0) == 0
    assert all((tmp_path / "results" / "second" / p.id / fake_trainer.CALLS).exists() for p in b.points)
    # another commit, or a failed donor: the point trains
    root = tmp_path / "results"
    point = a.points[0]
    summary_path = root / "first" / point.id / "summary.json"
    opts = RunOptions(results=root)
    assert find_donor(point, "second", opts) is not None
    summary = json.loads(summary_path.read_text())
    atomic_write_json(summary_path, {**summary, "code_version": {**summary["code_version"], "commit": "0" * 40}})
    assert find_donor(point, "second", opts) is None
    atomic_write_json(summary_path, summary)
    (root / "first" / point.id / "status").write_text("failed\n")
    assert find_donor(point, "second", opts) is None
    (root / "first" / point.id / "status").write_text("done\n")
    gpu = point.config.model_copy(update={"train": point.config.train.model_copy(update={"device": "cuda"})})
    assert find_donor(type(point)(**{**point.__dict__, "config": gpu}), "second", opts) is None


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_a_copied_point_logs_its_metrics_to_mlflow(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    run(tmp_path, "first", "[1.0e-4]", mlflow_uri=uri, mlflow_on=True)
    b, result = run(tmp_path, "second", "[1.0e-4]", mlflow_uri=uri, mlflow_on=True)
    assert result.counts["reused"] == 2
    client = mlflow.tracking.MlflowClient(uri)
    exp = client.get_experiment_by_name("second")
    runs = client.search_runs([exp.experiment_id])
    assert len(runs) == 2
    for r in runs:
        assert r.info.status == "FINISHED" and r.data.tags["reused_from"].startswith("first/")
        point = next(p for p in b.points if p.id == r.data.tags["point_id"])
        rows = read_jsonl(tmp_path / "results" / "second" / point.id / "metrics.jsonl")
        history = client.get_metric_history(r.info.run_id, "env/success")
        assert [m.value for m in sorted(history, key=lambda m: m.step)] == [row["env/success"] for row in rows]


def test_committed_runs_keep_their_point_ids_under_today_s_schema():
    """A config key added after results were published, at the default that reproduces them, must leave their
    hashes alone (provenance.HASH_NEUTRAL_DEFAULTS): every committed run of a sequential sweep, its config.yaml
    loaded by today's schema (new keys filled with their defaults), hashes to the point id it was written under,
    so a sweep finds, copies and resumes it instead of training it again."""
    import yaml

    from analysis.records import read_pack
    from harness.config.loading import validate_run_config
    from harness.experiments.provenance import config_hash

    root = Path(__file__).resolve().parents[3]
    _, files = read_pack(root / "results" / "process_reward.records.jsonl.gz")
    configs = {p.split("/")[0]: t for p, t in files.items() if p.endswith("/config.yaml") and p.count("/") == 1}
    assert len(configs) >= 40
    for point, text in configs.items():
        assert config_hash(validate_run_config(yaml.safe_load(text), point)) == point.rsplit("__", 1)[1], point
