"""Damaged results: `harness check`, the sweep's own check (corrupt points are reported, never
skipped as done, and run again from scratch with --retry-failed), and the analysis commands on a
folder with damaged points. Real sweeps with the fake trainer of tests/support/fake_trainer.py.
"""

from __future__ import annotations

import os

import pytest
from typer.testing import CliRunner

from harness.cli.main import app
from harness.experiments.runner import run_sweep
from harness.experiments.sweep import load_sweep
from harness.store import check_sweep, read_jsonl
from tests.helpers.sweeps import calls, check_complete, make_sweep, opts
from tests.support import fake_trainer

GARBAGE = os.urandom(48) + b"\xff\xfe\x00"


def damage(dirs: list) -> dict[str, str]:
    """Damage three finished points three ways; returns point id -> the expected reason."""
    (dirs[0] / "status").write_bytes(GARBAGE)
    (dirs[1] / "summary.json").write_bytes(GARBAGE)
    text = (dirs[2] / "metrics.jsonl").read_text()
    (dirs[2] / "metrics.jsonl").write_text(text[: len(text) - 20])  # cut mid-line
    return {
        dirs[0].name: "status is not text",
        dirs[1].name: "summary.json is not valid JSON",
        dirs[2].name: "metrics.jsonl line 6 of 6 is not a JSON row",
    }


@pytest.fixture
def finished(tmp_path):
    """A finished sweep of four points (two lr x two seeds): (sweep, point folders)."""
    sweep = load_sweep(make_sweep(tmp_path))
    assert run_sweep(sweep, opts(tmp_path)).ok
    return sweep, [tmp_path / "results" / "s" / p.id for p in sweep.points]


def test_a_row_count_other_than_the_summary_s_is_corrupt(finished):
    _, dirs = finished
    rows = (dirs[0] / "metrics.jsonl").read_text().splitlines(keepends=True)
    (dirs[0] / "metrics.jsonl").write_text("".join(rows[:-1]))  # cut at a line boundary
    (dirs[1] / "status").write_text("donee\n")
    found = {c.path.name: c.problems for c in check_sweep(dirs[0].parent)}
    assert found == {
        dirs[0].name: ["metrics.jsonl has 5 rows but summary.json records 6"],
        dirs[1].name: ["status is not one of running | done | failed | diverged | pruned (6 bytes)"],
    }


def test_the_sweep_reports_corrupt_points_and_redoes_them_only_with_retry_failed(tmp_path, finished):
    sweep, dirs = finished
    reasons = damage(dirs)
    found = {c.path.name: c.problems for c in check_sweep(dirs[0].parent)}
    assert set(found) == set(reasons) and all(found[pid][0].startswith(r) for pid, r in reasons.items())
    again = run_sweep(sweep, opts(tmp_path))
    assert not again.ok and again.counts["corrupt"] == 3 and again.counts["skipped"] == 1
    assert all(again.errors[pid].startswith("corrupt: " + r) for pid, r in reasons.items())
    assert (dirs[1] / "summary.json").read_bytes() == GARBAGE  # left as found
    redo = run_sweep(sweep, opts(tmp_path, retry_failed=True))
    assert redo.ok and redo.counts["done"] == 3 and redo.counts["skipped"] == 1
    for p, d in zip(sweep.points, dirs):
        check_complete(d, p.seed, p.config.algo.lr, 6)
        if d.name in reasons:  # from scratch, the damaged files kept aside
            assert [c["start"] for c in calls(d)] == [0]
            (kept,) = (d / ".corrupt").iterdir()
            assert [c["start"] for c in read_jsonl(kept / fake_trainer.CALLS)] == [0]
        else:
            assert not (d / ".corrupt").exists()
    assert (next((dirs[1] / ".corrupt").iterdir()) / "summary.json").read_bytes() == GARBAGE
    assert check_sweep(dirs[0].parent) == []


def invoke(*args) -> tuple[int, str]:
    r = CliRunner().invoke(app, [str(a) for a in args])
    assert r.exception is None or isinstance(r.exception, SystemExit), r.exception  # no traceback
    return r.exit_code, r.output


def test_check_sweep_table_report_plot_on_damaged_points(tmp_path, finished, monkeypatch):
    sweep, dirs = finished
    reasons = damage(dirs)
    results = tmp_path / "results"
    code, out = invoke("check", results)  # a results root: every sweep folder in it
    assert code == 1 and f"{results / 's'}: 4 points, 3 corrupt" in out
    for pid, reason in reasons.items():
        assert f"  {pid}: {reason}" in out
    code, out = invoke("table", results / "s", "-m", "final/success")
    assert code == 0 and "| 1/2 (1 corrupt) |" in out and "| 0/2 (2 corrupt) |" in out, out
    code, out = invoke("report", results / "s")
    assert code == 0 and "3 corrupt" in (results / "s" / "report.md").read_text()
    assert invoke("plot", results / "s", "-m", "env/success")[0] == 0
    monkeypatch.setenv("HARNESS_TRAIN_FN", "tests.support.fake_trainer:train")
    sweep_file = tmp_path / "sweep.yaml"
    code, out = invoke("sweep", sweep_file, "--results", results, "--no-mlflow")
    assert code == 1 and "3 corrupt (damaged files; --retry-failed runs them again)" in out, out
    code, out = invoke("sweep", sweep_file, "--results", results, "--no-mlflow", "--retry-failed")
    assert code == 0 and "3 done, 0 diverged, 0 failed, 1 skipped" in out, out
    code, out = invoke("check", results / "s")
    assert code == 0 and "4 points, none corrupt" in out
    assert invoke("check", tmp_path / "nope")[0] == 2
