"""The time cap of `harness sweep --max-minutes` (RunOptions.max_minutes / deadline): once it has
passed no new point and no new look starts, the points in flight finish, sweep.json records where
it stopped, the table says so with the seeds each open row would need, and a later run resumes to the
same looks as a run without a cap.

The sweep is the smallest sequential one of test_sequential_sweep.py (tests/support/sequential_trainer.py:
lr 2e-4 better at the first look, 3e-4 equivalent at 5 seeds, 4e-4 undetermined at 6; looks at 3,
4, 5, 6 seeds). The clock passing the cap is the trainer of one chosen point setting the run's
deadline to now, in-process (one worker), so where the cap falls does not depend on the machine's speed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from analysis.findings import answer
from analysis.table import table_for
from harness.experiments.point import RunOptions
from harness.experiments.runner import run_sweep
from harness.experiments.sweep import load_sweep
from harness.store import LOOKS, SWEEP_MANIFEST
from tests.helpers import REPO
from tests.support import sequential_trainer

SWEEP = (
    "name: s\nbase: base.yaml\ngrid: {algo.lr: [1.0e-4, 2.0e-4, 3.0e-4, 4.0e-4]}\n"
    "seeds: {start: 3, step: 1, max: 6, spending: pocock}\nequivalence_margin: 0.05\n"
)


def sweep_file(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "base.yaml").write_text("env: {name: frozenlake}\ntrain: {updates: 2}\ntracking: {mlflow: false}\n")
    (folder / "s.yaml").write_text(SWEEP)
    return folder / "s.yaml"


def capped_at(opts: RunOptions, lr: float, seed: int):
    """The fake trainer, which moves the run's deadline to now once point (lr, seed) has trained."""

    def train(cfg, run_dir, logger, progress=None):
        out = sequential_trainer.train(cfg, run_dir, logger, progress)
        if cfg.algo.lr == lr and cfg.train.seed == seed:
            opts.deadline = time.time()
        return out

    return train


def points_run(folder: Path) -> dict[str, list[int]]:
    sweep = load_sweep(folder / "s.yaml")
    out: dict[str, list[int]] = {}
    for p in sweep.points:
        if (folder / "results" / "s" / p.id / "status").is_file():
            out.setdefault(p.variant, []).append(p.seed)
    return out


def manifest(folder: Path) -> dict:
    return json.loads((folder / "results" / "s" / SWEEP_MANIFEST).read_text())


def looks(folder: Path) -> dict:
    return json.loads((folder / "results" / "s" / LOOKS).read_text())


def reference(tmp_path: Path) -> Path:
    folder = tmp_path / "ref"
    run_sweep(load_sweep(sweep_file(folder)), RunOptions(folder / "results", train_fn=sequential_trainer.train))
    return folder


def test_a_cap_inside_a_look_lets_the_point_in_flight_finish_and_a_later_run_resumes(tmp_path):
    ref = reference(tmp_path)
    folder = tmp_path / "capped"
    path = sweep_file(folder)
    opts = RunOptions(folder / "results", max_minutes=30)
    opts.train_fn = capped_at(opts, 1.0e-4, 3)  # the baseline's seed 3: the first point of look 2
    first = run_sweep(load_sweep(path), opts)
    assert first.ok and not first.interrupted
    assert first.counts["done"] == 12 + 1 and first.counts["capped"] == 2  # look 2's other two points
    assert points_run(folder)["lr=0.0001"] == [0, 1, 2, 3] and points_run(folder)["lr=0.0003"] == [0, 1, 2]
    assert manifest(folder)["sequential"]["capped"] == {
        "max_minutes": 30,
        "look": 2,
        "seeds": 4,
        "open": ["lr=0.0003", "lr=0.0004"],
    }
    assert looks(folder)["next_look"] == 2

    table = table_for(folder / "results" / "s")
    notes = "\n".join(table.notes)
    assert "1 of 4 looks taken: the time cap of its last run (30 minutes) stopped it in look 2 (4 seeds)" in notes
    assert "Verdicts: 1 of 3 contrasts decided (1 better); 2 still open (more looks to come)." in notes
    data = table.data.set_index("algo.lr")
    needed = data["sequential:seeds_needed"].dropna()
    assert list(needed.index) == ["0.0003", "0.0004"] and (needed > 3).all()  # the open rows, what they need
    need = int(needed["0.0004"])
    assert f"0.0004 still open after look 1 (3 seeds), a verdict would need about {need} seeds" in notes
    # the findings rows say the same: open, with more looks to come, and the seeds a verdict would need
    said = {f["cell"]: answer(f, 0.05) for f in table.findings}
    assert said["0.0004"].endswith(
        f"(still open after look 1 of 4 (3 seeds): the sweep's next looks add seeds; a verdict would need about "
        f"{need} seeds at the observed Δ and variance)"
    )

    again = run_sweep(load_sweep(path), RunOptions(folder / "results", train_fn=sequential_trainer.train))
    assert again.ok and again.counts.get("capped", 0) == 0
    assert looks(folder) == looks(ref) and points_run(folder) == points_run(ref)
    assert "capped" not in manifest(folder)["sequential"]  # the resumed run wrote its manifest afresh
    assert "every look is decided" in "\n".join(table_for(folder / "results" / "s").notes)


def test_no_new_look_starts_after_the_cap(tmp_path):
    folder = tmp_path / "between"
    path = sweep_file(folder)
    opts = RunOptions(folder / "results", max_minutes=30)
    opts.train_fn = capped_at(opts, 4.0e-4, 2)  # the last point of look 1
    result = run_sweep(load_sweep(path), opts)
    assert result.ok and result.counts["done"] == 12 and result.counts["capped"] == 3  # look 2: 3 points
    assert max(max(seeds) for seeds in points_run(folder).values()) == 2
    assert manifest(folder)["sequential"]["capped"]["look"] == 2 and looks(folder)["next_look"] == 2
    # another metric of the same points is read at fixed n: no note that the cap came before any result
    other = "\n".join(table_for(folder / "results" / "s", metrics=["init/eval_greedy/success"]).notes)
    capped = "\n".join(table_for(folder / "results" / "s").notes)
    assert "stopped it in look 2" in capped and "before its contrasts had results" not in capped
    assert "before its contrasts had results" not in other and "Sequential seeds" not in other


def test_a_cap_already_passed_starts_nothing_in_the_pool(tmp_path):
    folder = tmp_path / "pool"
    path = sweep_file(folder)
    opts = RunOptions(folder / "results", train_fn=sequential_trainer.train, workers=2, max_minutes=0)
    result = run_sweep(load_sweep(path), opts)
    assert result.ok and result.counts["capped"] == 12 and result.counts["done"] == 0
    assert points_run(folder) == {} and manifest(folder)["sequential"]["capped"]["look"] == 1


def test_the_cli_says_the_cap_stopped_it_and_how_to_resume(tmp_path):
    path = sweep_file(tmp_path / "cli")
    env = {**os.environ, "PYTHONPATH": str(REPO), "HARNESS_TRAIN_FN": "tests.support.sequential_trainer:train"}
    cmd = [sys.executable, "-m", "harness", "sweep", str(path), "--max-minutes", "0", "--no-mlflow"]
    out = subprocess.run(cmd + ["--results", str(tmp_path / "r")], cwd=REPO, env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "12 not started (the --max-minutes cap had passed)" in out.stdout
    assert "time cap of 0 minutes reached: 12 point(s) not started; run the same command again to resume" in out.stdout
    bad = subprocess.run(cmd[:5] + ["--max-minutes", "-1"], cwd=REPO, env=env, capture_output=True, text=True)
    assert bad.returncode == 2 and "--max-minutes" in bad.stderr


def test_a_cap_before_any_contrast_has_results_is_in_the_table(tmp_path):
    folder = tmp_path / "early"
    path = sweep_file(folder)
    opts = RunOptions(folder / "results", max_minutes=30)
    opts.train_fn = capped_at(opts, 1.0e-4, 0)  # the very first point
    result = run_sweep(load_sweep(path), opts)
    assert result.counts["done"] == 1 and result.counts["capped"] == 11
    notes = "\n".join(table_for(folder / "results" / "s").notes)
    assert "the time cap of its last run (30 minutes) stopped it in look 1 (3 seeds) before its contrasts" in notes
