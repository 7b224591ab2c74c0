"""Sweeps with a seed budget (`seeds: {start, step, max}`): the file's checks, the looks run by the
local pool (one process and `--workers 2`), looks.json, resuming at the same look after Ctrl-C or a
lost looks.json, the dry-run plan, the table's seeds, verdicts and seeds-needed note, a plan
changed after a look, bad budgets, and (slow) the same looks through `--backend ray`.

Uses tests/support/sequential_trainer.py: per-task held-out results that are a pure function of
(lr, seed, task), with an lr-coded effect per arm: lr 2e-4 is +0.3 (better at the first look),
3e-4 is 0 (equivalent once the interval is narrow enough), 4e-4 is +0.035 (undetermined at max
6 seeds with margin 0.05). Looks at 3, 4, 5, 6 seeds, Pocock spending.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from analysis.table import table_for
from harness.config.errors import ConfigError
from harness.experiments.point import RunOptions
from harness.experiments.runner import run_sweep
from harness.experiments.sequential import plan_lines
from harness.experiments.sweep import load_sweep
from harness.store import LOOKS, SWEEP_MANIFEST
from tests.helpers import REPO
from tests.support import sequential_trainer

BASE = "env: {name: frozenlake}\ntrain: {updates: 2}\ntracking: {mlflow: false}\n"
GRID = "grid: {algo.lr: [1.0e-4, 2.0e-4, 3.0e-4, 4.0e-4]}\n"
BUDGET = "seeds: {start: 3, step: 1, max: 6, spending: pocock}\n"
# the arm's variant -> (verdict, seeds it used) of this budget on the fake trainer's results
EXPECTED = {"lr=0.0002": ("better", 3), "lr=0.0003": ("equivalent", 5), "lr=0.0004": ("undetermined", 6)}


def sweep_file(
    tmp_path: Path, seeds: str = BUDGET, extra: str = "equivalence_margin: 0.05\n", grid: str = GRID
) -> Path:
    (tmp_path / "base.yaml").write_text(BASE)
    path = tmp_path / "s.yaml"
    path.write_text(f"name: s\nbase: base.yaml\n{grid}{seeds}{extra}")
    return path


def options(tmp_path: Path, **kw) -> RunOptions:
    return RunOptions(results=tmp_path / "results", train_fn=sequential_trainer.train, **kw)


def seeds_run(tmp_path: Path) -> dict[str, list[int]]:
    """Per variant: the seeds that have a point folder."""
    sweep = load_sweep(tmp_path / "s.yaml")
    out: dict[str, list[int]] = {}
    for p in sweep.points:
        if (tmp_path / "results" / "s" / p.id).exists():
            out.setdefault(p.variant, []).append(p.seed)
    return out


def looks_file(tmp_path: Path) -> dict:
    return json.loads((tmp_path / "results" / "s" / LOOKS).read_text())


def test_a_budget_runs_only_the_open_arms_and_records_every_look(tmp_path):
    path = sweep_file(tmp_path)
    result = run_sweep(load_sweep(path), options(tmp_path))
    assert result.ok and result.counts["done"] == 6 + 3 + 5 + 6  # baseline and lr 4e-4 to 6 seeds
    seeds = seeds_run(tmp_path)
    assert seeds == {
        "lr=0.0001": list(range(6)),
        "lr=0.0002": [0, 1, 2],
        "lr=0.0003": list(range(5)),
        "lr=0.0004": list(range(6)),
    }
    looks = looks_file(tmp_path)
    assert looks["plan"] == {"start": 3, "step": 1, "max": 6, "spending": "pocock", "margin": 0.05,
                             "metric": "eval_greedy/success", "baseline": "lr=0.0001"}  # fmt: skip
    assert [look["seeds"] for look in looks["looks"]] == [3, 4, 5, 6] and looks["next_look"] is None
    assert sum(look["alpha"] for look in looks["looks"]) == pytest.approx(0.05)
    assert {a: (d["verdict"], d["seeds"]) for a, d in looks["decisions"].items()} == EXPECTED
    assert list(looks["looks"][0]["verdicts"]) == ["lr=0.0002", "lr=0.0003", "lr=0.0004"]
    assert list(looks["looks"][-1]["verdicts"]) == ["lr=0.0004"]  # decided arms are not tested again
    manifest = json.loads((tmp_path / "results" / "s" / SWEEP_MANIFEST).read_text())
    assert manifest["sequential"] == {"start": 3, "step": 1, "max": 6, "spending": "pocock", "until": "verdict"}
    assert len(manifest["points"]) == 20  # the points the looks scheduled, not all 24 of max

    # the table: the seeds each row used, the verdict of its look, what an undetermined row needs
    table = table_for(tmp_path / "results" / "s")
    rows = {keys[0]: (seeds, entries) for keys, seeds, entries in table.rows}
    assert [rows[k][0] for k in ("0.0001", "0.0002", "0.0003", "0.0004")] == ["6/6", "3/3", "5/5", "6/6"]
    data = table.data.set_index("algo.lr")
    assert list(data["verdict"])[1:] == ["better", "equivalent", "undetermined"]
    assert list(data["delta:n"])[1:] == [3, 5, 6]  # Δ over the seeds each contrast used, paired
    assert list(data["sequential:look"].dropna().astype(int)) == [1, 3, 4]
    needed = data["sequential:seeds_needed"].dropna()
    assert len(needed) == 1 and needed.iloc[0] > 6
    text = "\n".join(table.notes)
    assert "Sequential seeds: looks at 3, 4, 5, 6 seeds with pocock alpha spending" in text
    assert f"0.0004 at look 4 (6 seeds), a verdict would need about {int(needed.iloc[0])} seeds" in text

    # another metric of the same points: the fixed-n rule (the looks were decided on the sweep's metric)
    other = table_for(tmp_path / "results" / "s", ["final/env/success"])
    assert "Sequential seeds" not in "\n".join(other.notes) and "sequential:look" not in other.data

    # run again: every look is decided, nothing runs, looks.json is the same
    again = run_sweep(load_sweep(path), options(tmp_path))
    assert again.ok and again.counts["done"] == 0 and looks_file(tmp_path) == looks


def test_workers_and_resume_after_ctrl_c_and_a_lost_looks_file_reach_the_same_decisions(tmp_path):
    reference = tmp_path / "ref"
    reference.mkdir()
    run_sweep(load_sweep(sweep_file(reference)), options(reference))
    path = sweep_file(tmp_path)
    os.environ["FAKE_INTERRUPT_SEED"] = "4"  # Ctrl-C in the first point of the look at 5 seeds
    try:
        first = run_sweep(load_sweep(path), options(tmp_path))
    finally:
        del os.environ["FAKE_INTERRUPT_SEED"]
    assert first.interrupted
    assert looks_file(tmp_path)["next_look"] == 3  # 1-based: the look at 5 seeds is still to decide
    lines, points = plan_lines(load_sweep(path), tmp_path / "results")
    assert "next: look 3 of 4 (5 seeds) for lr=0.0003, lr=0.0004 and the baseline lr=0.0001" in lines[-1]
    assert "  lr=0.0002: better at look 1 (3 seeds)" in lines
    assert sorted({p.seed for p in points if p.variant == "lr=0.0002"}) == [0, 1, 2]
    (tmp_path / "results" / "s" / LOOKS).unlink()  # the decisions come back from the finished points
    second = run_sweep(load_sweep(path), options(tmp_path, workers=2))  # the last two looks in 2 processes
    assert second.ok and not second.interrupted
    assert looks_file(tmp_path) == looks_file(reference)
    assert seeds_run(tmp_path) == seeds_run(reference)


def test_a_plan_changed_after_a_look_is_an_error(tmp_path):
    path = sweep_file(tmp_path)
    run_sweep(load_sweep(path), options(tmp_path))
    sweep_file(tmp_path, extra="equivalence_margin: 0.1\n")
    with pytest.raises(
        ConfigError, match=r"changed after 4 look\(s\) were taken and 20 of its points finished .*margin 0.05 -> 0.1"
    ):
        run_sweep(load_sweep(path), options(tmp_path))
    sweep_file(tmp_path, seeds="seeds: {start: 3, step: 1, max: 8, spending: pocock}\n")
    with pytest.raises(ConfigError, match="max 6 -> 8"):
        run_sweep(load_sweep(path), options(tmp_path))


def test_a_plan_may_change_until_a_point_has_finished(tmp_path):
    path = sweep_file(tmp_path)
    os.environ["FAKE_INTERRUPT_SEED"] = "0"  # Ctrl-C in the very first point
    try:
        assert run_sweep(load_sweep(path), options(tmp_path)).interrupted
    finally:
        del os.environ["FAKE_INTERRUPT_SEED"]
    assert looks_file(tmp_path)["plan"]["margin"] == 0.05 and looks_file(tmp_path)["looks"] == []
    sweep_file(tmp_path, extra="equivalence_margin: 0.1\n")
    lines, _ = plan_lines(load_sweep(path), tmp_path / "results")
    assert "equivalence margin ±0.1" in lines[0]


def test_a_sweep_decided_at_the_first_look_stops_there_baseline_included(tmp_path):
    path = sweep_file(tmp_path, grid="grid: {algo.lr: [1.0e-4, 2.0e-4]}\n")
    for _ in range(2):  # the second run finds every look decided and runs nothing
        result = run_sweep(load_sweep(path), options(tmp_path))
        assert result.ok and seeds_run(tmp_path) == {"lr=0.0001": [0, 1, 2], "lr=0.0002": [0, 1, 2]}
    assert looks_file(tmp_path)["decisions"]["lr=0.0002"]["verdict"] == "better"
    lines, points = plan_lines(load_sweep(path), tmp_path / "results")
    assert len(points) == 6 and "  every look is decided: nothing to run" in lines


def test_a_list_of_seeds_is_unchanged_and_seeds_overrides_a_budget(tmp_path):
    listed = load_sweep(sweep_file(tmp_path, seeds="seeds: [0, 1]\n"))
    assert listed.budget is None and "sequential" not in listed.manifest()
    budget = load_sweep(sweep_file(tmp_path))
    assert budget.budget is not None and sorted({p.seed for p in budget.points}) == list(range(6))
    fixed = load_sweep(sweep_file(tmp_path), seeds=[0, 1])
    assert fixed.budget is None and sorted({p.seed for p in fixed.points}) == [0, 1]


@pytest.mark.parametrize(
    ("seeds", "extra", "message"),
    [
        ("seeds: {start: 3, step: 0, max: 6}\n", "", "seeds.step = 0 must be a whole number of at least 1"),
        ("seeds: {start: 5, max: 3}\n", "", "seeds.max = 3 must be a whole number from seeds.start (5) up"),
        ("seeds: {start: 1, max: 3}\n", "", "seeds.start = 1 must be a whole number of at least 2"),
        ("seeds: {start: 3, max: 6, spending: linear}\n", "", "choose one of: obrien_fleming, pocock"),
        (
            "seeds: {start: 3, max: 6, looks: 4}\n",
            "",
            "unknown key seeds.looks; valid keys: start, step, max, spending",
        ),
        ("seeds: {max: 6}\n", "", "seeds.start is required"),
        ("seeds: {start: 3, max: 6}\n", "until: convergence\n", "until = 'convergence' is not a stopping goal"),
        ("seeds: [0, 1]\n", "until: verdict\n", "until = 'verdict' applies to a seed budget"),
    ],
)
def test_bad_budgets_are_one_paragraph_naming_file_key_value_and_choices(tmp_path, seeds, extra, message):
    path = sweep_file(tmp_path, seeds=seeds, extra=extra)
    with pytest.raises(ConfigError) as err:
        load_sweep(path)
    text = str(err.value)
    assert text.startswith(str(path)) and message in text and "\n" not in text


@pytest.mark.slow  # two looks, each starting a local Ray instance (about 20 s each on 2 cores)
def test_the_ray_backend_takes_the_same_looks_as_the_local_pool(tmp_path):
    pytest.importorskip("ray")  # the optional extra `dist`
    seeds = "seeds: {start: 3, step: 3, max: 6}\n"
    reference = tmp_path / "ref"
    reference.mkdir()
    run_sweep(load_sweep(sweep_file(reference, seeds=seeds)), options(reference))
    path = sweep_file(tmp_path, seeds=seeds)
    env = {**os.environ, "PYTHONPATH": str(REPO), "HARNESS_TRAIN_FN": "tests.support.sequential_trainer:train"}
    cmd = [sys.executable, "-m", "harness", "sweep", str(path), "--backend", "ray", "--workers", "2"]
    cmd += ["--results", str(tmp_path / "results"), "--no-mlflow"]
    out = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "look 2 of 2: 6 seeds for" in out.stdout
    assert looks_file(tmp_path) == looks_file(reference)
    assert seeds_run(tmp_path) == seeds_run(reference)


@pytest.mark.slow  # six points of the real trainer on the tiny model (about 30 s on 2 shared cores)
def test_the_real_cli_and_trainer_with_the_smallest_budget(tmp_path):
    """`harness sweep` with seeds {start: 2, max: 3}: two looks of the real trainer's per-task results,
    then `harness table` and `--dry-run` read them."""
    import yaml

    from tests.helpers.configs import TINY

    base = json.loads(json.dumps(TINY))
    base["train"].update(updates=1, eval_every=1)
    spec = {"name": "s", "base": base, "grid": {"algo.lr": [1.0e-3, 3.0e-3]}, "seeds": {"start": 2, "max": 3}}
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(spec))
    results = tmp_path / "results"
    env = {**os.environ, "PYTHONPATH": str(REPO)}

    def harness(*args):
        return subprocess.run([sys.executable, "-m", "harness", *args], cwd=REPO, env=env, capture_output=True,
                              text=True, timeout=600)  # fmt: skip

    out = harness("sweep", str(path), "--results", str(results), "--no-mlflow")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "look 1 of 2: 2 seeds for lr=0.003 and the baseline lr=0.001" in out.stdout
    looks = json.loads((results / "s" / LOOKS).read_text())
    assert [look["seeds"] for look in looks["looks"]][0] == 2 and looks["next_look"] is None
    table = harness("table", str(results / "s"))
    assert table.returncode == 0 and "Sequential seeds: looks at 2, 3 seeds" in table.stdout, table.stderr
    dry = harness("sweep", str(path), "--results", str(results), "--dry-run")
    assert dry.returncode == 0 and "every look is decided: nothing to run" in dry.stdout, dry.stderr


def test_a_look_whose_points_failed_blocks_the_sweep_with_a_message(tmp_path):
    path = sweep_file(tmp_path, grid="grid: {algo.lr: [1.0e-4, 5.0e-4]}\n")  # the fake trainer knows no 5e-4
    first = run_sweep(load_sweep(path), options(tmp_path))
    assert not first.ok and first.counts["failed"] == 3
    again = run_sweep(load_sweep(path), options(tmp_path))  # failed points are not run again: blocked
    assert not again.ok and again.counts["blocked"] == 1
    assert "look 1 cannot be decided: its points did not all finish: lr=0.0005__seed=0" in again.errors[LOOKS]
    assert "`harness sweep FILE --retry-failed` runs failed ones again" in again.errors[LOOKS]


def test_a_budget_needs_a_contrast(tmp_path):
    path = sweep_file(tmp_path, grid="grid: {algo.lr: [1.0e-4]}\n")
    with pytest.raises(ConfigError, match="is a seed budget, .* this sweep has one variant, so there is nothing"):
        load_sweep(path)
