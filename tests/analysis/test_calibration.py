"""A/A calibration (analysis.calibration): reading an A/A results folder, the pseudo-sweeps' rates on
data with a known truth (a null: rates near their nominal level; a planted shift: far from it), the
interval of a rate, and the text."""

from __future__ import annotations

import math

import numpy as np
import pytest
from synthetic_aa import SPLIT, make_aa_sweep

from analysis.calibration import (
    Runs,
    calibrate,
    contrast,
    fixed_draws,
    jackknife_var,
    load_runs,
    rate,
    rate_var,
    rates,
    sequential_draws,
    wilson,
)
from analysis.calibration_text import FINDING_PREFIX, finding, markdown
from analysis.intervals import grid_interval, unpaired_interval
from analysis.sequential import Plan


def normal_runs(seeds: int, shift: float = 0.0, tasks: int = 16, rng_seed: int = 0) -> Runs:
    """Three arms of seeds x tasks scores from the two-way model (σ_seed 0.04, σ_task 0.1, residual
    0.3; the shipped sweeps' regime per issue 54, fewer tasks), `shift` added to the second arm."""
    rng = np.random.default_rng(rng_seed)
    b = rng.normal(0, 0.1, tasks)
    final = {
        arm: 0.6
        + rng.normal(0, 0.04, (seeds, 1))
        + b
        + rng.normal(0, 0.3, (seeds, tasks))
        + (shift if arm == "b" else 0)
        for arm in ("a", "b", "c")
    }
    return Runs(["a", "b", "c"], "a", {"a": 0, "b": 0, "c": 1000}, list(range(seeds)), final, {}, "final/x")


def test_load_runs_maps_seed_offsets_to_seed_indices_and_pairs_as_the_table(tmp_path):
    runs = load_runs(make_aa_sweep(tmp_path / "aa", seeds=6, tasks=8))
    assert runs.arms == ["baseline", "noop", "copy"] and runs.baseline == "baseline"
    assert runs.offsets == {"baseline": 0, "noop": 0, "copy": 1000}
    assert runs.index == list(range(6))  # the copy's seeds 1000..1005 are indices 0..5
    assert {a: g.shape for a, g in runs.final.items()} == {a: (6, 8) for a in runs.arms}
    rows = np.array([0, 2, 4])
    same = contrast(runs, "noop", "baseline", rows)  # same train.seed: paired by seed and task
    assert same == grid_interval(runs.final["noop"][rows] - runs.final["baseline"][rows])
    other = contrast(runs, "copy", "baseline", rows)  # other seeds: unpaired by seed
    assert other == unpaired_interval(runs.final["copy"][rows], runs.final["baseline"][rows])
    assert other != grid_interval(runs.final["copy"][rows] - runs.final["baseline"][rows])


def test_only_seeds_every_arm_finished_are_drawn_and_two_are_needed(tmp_path):
    from analysis.load import AnalysisError

    root = make_aa_sweep(tmp_path / "aa", seeds=4, tasks=4)
    (root / "copy__seed=1001__co001001" / "status").write_text("failed\n")
    assert load_runs(root).index == [0, 2, 3]
    for d in root.glob("copy__*"):
        (d / "status").write_text("failed\n")
    with pytest.raises(AnalysisError, match="common seeds"):
        load_runs(root)


def test_under_the_null_the_rates_are_near_their_nominal_level():
    runs = normal_runs(seeds=200)
    d = fixed_draws(runs, 5, 600, np.random.default_rng(1))
    r = rates(d)
    assert abs(r["single"].value - 0.05) < 0.03  # each contrast alone: a 5% test
    assert r["family"].value <= 0.05 + 0.03  # Holm over the sweep: at most 5%
    assert r["contrast"].value <= r["single"].value  # Holm never rejects more than the test alone
    assert r["single"].lo <= r["single"].value <= r["single"].hi
    assert abs(r["p<0.5"].value - 0.5) < 0.1 and abs(r["p<0.2"].value - 0.2) < 0.06  # p-values near uniform


def test_a_planted_shift_is_not_a_null():
    runs = normal_runs(seeds=60, shift=0.15)
    r = rates(fixed_draws(runs, 10, 300, np.random.default_rng(2)))
    assert r["family"].value > 0.5  # the shifted arm is found in most pseudo-sweeps
    assert r["single"].value > 0.3
    assert r["p<0.5"].value > 0.75  # far from uniform


def test_the_sequential_rule_holds_where_re_reading_the_table_does_not():
    runs = normal_runs(seeds=60)
    d = sequential_draws(runs, 300, np.random.default_rng(3), Plan(start=3, step=2, max=15))
    r = rates(d)
    assert r["family"].value <= 0.05 + 0.03
    assert r["naive_family"].value >= r["family"].value
    assert 3 <= d.seeds_used <= 15
    assert d.members.sum(axis=1).tolist() == [15] * 300


def test_wilson_by_hand_and_the_interval_of_a_rate():
    lo, hi = wilson(0.5, 100)  # (p + z²/2n ± z sqrt(p(1-p)/n + z²/4n²)) / (1 + z²/n)
    assert lo == pytest.approx(0.4038, abs=1e-3) and hi == pytest.approx(0.5962, abs=1e-3)
    assert wilson(0.0, math.nan) == (0.0, 1.0)
    members = np.zeros((4, 3), dtype=bool)
    members[[0, 1], 0] = members[[2, 3], 1] = members[:, 2] = True
    # values of draws without seed 0: 0.5 (draws 2, 3); without seed 1: 0 (draws 0, 1); seed 2: in all
    values = np.array([0.0, 0.0, 1.0, 0.0])
    assert jackknife_var(values, members) == pytest.approx(0.5 * (0.5 - 0.25) ** 2 * 2)
    none = rate(np.zeros(4), members)  # no event: Wilson at the worst case n / k = 3 / 2 (Hoeffding)
    assert none.value == 0 and none.lo == pytest.approx(0, abs=1e-12) and none.n_eff == 1.5
    assert none.hi == pytest.approx(1.96**2 / (1.5 + 1.96**2), abs=1e-3)
    many = np.zeros((400, 20), dtype=bool)
    many[:, :3] = True  # every draw on the same 3 seeds: nothing to average over, n_eff stays >= 20 / 3
    assert rate(np.r_[np.ones(20), np.zeros(380)], many).n_eff >= 20 / 3


def test_draw_noise_is_not_counted_as_variance_of_the_runs():
    """Values that ignore the data (coin flips): the runs add no variance, only the draws' s^2 / R;
    the raw jackknife counts the draw noise (k s^2 / R_i) many times over."""
    rng = np.random.default_rng(4)
    n, k, draws = 20, 10, 4000
    members = np.zeros((draws, n), dtype=bool)
    for r in range(draws):
        members[r, rng.choice(n, size=k, replace=False)] = True
    values = (rng.random(draws) < 0.05).astype(float)
    s2 = values.var(ddof=1)
    assert jackknife_var(values, members) > 5 * s2 / draws
    assert rate_var(values, members) < 2.5 * s2 / draws


def test_calibrate_and_its_text_on_a_results_folder(tmp_path):
    cal = calibrate(make_aa_sweep(tmp_path / "aa", seeds=6, tasks=8), seed_counts=(3, 5, 10), draws=40)
    assert [d.label for d, _ in cal.fixed] == ["3 seeds", "5 seeds"]  # 10 > the 6 seeds finished
    assert cal.sequential is None  # the budget's max (15) > 6
    assert cal.chaos.same_seed == {"noop": True, "copy": False}
    assert set(cal.chaos.gaps["noop"]) == {0, 4} and not cal.chaos.gaps["noop"][0].any()  # same seed, same start
    lines = markdown(cal)
    table = [line for line in lines if line.startswith(("| 3 seeds, ", "| 5 seeds, "))]
    assert len(table) == 2 and all(line.count(" | ") == 6 for line in table)
    rows = [line for line in lines if line.startswith(("| 3 seeds |", "| 5 seeds |"))]
    assert len(rows) == 4 and all(line.count(" | ") == 4 for line in rows)  # paired / unpaired; p-value levels
    assert cal.chaos.diverged == {"noop": [SPLIT] * 6}  # the copy runs other seeds: not compared
    assert any(f"| {SPLIT} / {SPLIT} / {SPLIT} |" in line for line in lines)
    assert any("\\|Δ\\| at update 4" in line for line in lines)  # pipes escaped inside a table
    text = finding(cal)
    assert text.startswith(FINDING_PREFIX) and cal.fixed[0][1]["family"].text() in text
    again = calibrate(tmp_path / "aa", seed_counts=(3, 5), draws=40)
    assert finding(again) == text  # deterministic


def test_cli_prints_the_calibration_and_refuses_bad_input(tmp_path):
    import subprocess
    import sys

    folder = make_aa_sweep(tmp_path / "aa", seeds=5, tasks=8)

    def harness(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "harness", *args], capture_output=True, text=True, cwd=tmp_path)

    res = harness("calibrate", str(folder), "--seeds", "3", "--draws", "60")
    assert res.returncode == 0, res.stderr
    assert "| 3 seeds, 2 contrasts | 60 |" in res.stdout and FINDING_PREFIX in res.stdout
    bad = harness("calibrate", str(folder), "--seeds", "three")
    assert bad.returncode == 2 and "--seeds 'three'" in bad.stderr


def test_the_results_page_quotes_the_measured_rate_and_keeps_it_with_the_section(tmp_path, monkeypatch):
    import shutil

    from analysis import calibration_text
    from analysis.results_doc import write_results_doc

    monkeypatch.setattr(calibration_text, "PAGE_DRAWS", 60)  # fewer pseudo-sweeps than the page's, same code
    root, sweeps, out = tmp_path / "results", tmp_path / "sweeps", tmp_path / "docs" / "results.md"
    make_aa_sweep(root / "aa_calibration", seeds=6, tasks=8)
    sweeps.mkdir()
    (sweeps / "aa_calibration.yaml").write_text("name: aa_calibration\n")
    text = write_results_doc(root, out, sweeps).read_text()
    findings, section = text.split("\n## Contents\n")[0], text.split("\n## aa_calibration\n")[1]
    quoted = [line for line in findings.splitlines() if line.startswith(FINDING_PREFIX)]
    assert len(quoted) == 1 and quoted[0] in section  # the sentence under the sweep's table, quoted above
    assert "| 3 seeds, 2 contrasts | 60 |" in section and "r (final)" in section
    shutil.rmtree(root / "aa_calibration")
    kept = write_results_doc(root, out, sweeps).read_text()  # the sweep is gone: its section is kept
    assert "_Kept from the previous version" in kept and quoted[0] in kept.split("\n## Contents\n")[0]


def test_too_few_seeds_give_no_rate_but_say_so(tmp_path):
    cal = calibrate(make_aa_sweep(tmp_path / "aa", seeds=2, tasks=4), draws=20)
    assert not cal.fixed and cal.sequential is None
    assert "no measured rate yet" in finding(cal) and any("No pseudo-sweep yet" in line for line in markdown(cal))
