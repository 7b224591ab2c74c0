"""`harness diagnose`: the statistics on hand-computed cases, a planted signal found and noise not, the
clustered bootstrap and leave-one-sweep-out on a signal that holds everywhere and on one that does
not, the claims' verdicts, the stop-rule check, and the command on small records folders."""

from __future__ import annotations

import math
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from synthetic_diagnose import make_sweep

from analysis.diagnose import DIAGNOSTICS, pooled_points
from analysis.diagnose_table import (
    CONTRADICTED,
    SUPPORTED,
    UNDETERMINED,
    claims,
    score,
    stop_candidates,
    stop_lines,
)
from analysis.load import AnalysisError
from analysis.predictive import auroc, cluster_bootstrap, leave_one_out, ranks, spearman, spearman_within

REPS = 300
KL = next(d for d in DIAGNOSTICS if d.name == "KL k3")
ENTROPY = next(d for d in DIAGNOSTICS if d.name == "entropy")


# ----------------------------------------------------------------------------- the statistics
def test_ranks_average_ties_and_auroc_counts_half():
    assert ranks(np.array([3.0, 1.0, 3.0, 2.0])).tolist() == [3.5, 1.0, 3.5, 2.0]
    # positives 0.9, 0.5; negatives 0.5, 0.1: pairs (0.9>0.5, 0.9>0.1, 0.5=0.5, 0.5>0.1) = 3.5 / 4
    assert auroc(np.array([0.9, 0.5, 0.5, 0.1]), np.array([1, 1, 0, 0])) == pytest.approx(0.875)
    assert math.isnan(auroc(np.array([0.1, 0.2]), np.array([0, 0])))  # no positive: undefined


def test_spearman_within_ignores_differences_between_sweeps():
    # inside each sweep x and y rise together; across sweeps the sweep with the larger x has the smaller y
    x = np.array([1.0, 2, 3, 11, 12, 13])
    y = np.array([11.0, 12, 13, 1, 2, 3])
    clusters = np.array(["a"] * 3 + ["b"] * 3)
    assert spearman(x, y) < 0
    assert spearman_within(x, y, clusters) == pytest.approx(1.0)


def test_cluster_bootstrap_is_wider_when_sweeps_differ():
    """Points of a sweep share a shift: resampling sweeps must show more spread than resampling points."""
    rng = np.random.default_rng(0)
    shifts = np.repeat(rng.normal(0, 1, 6), 10)
    y = shifts + rng.normal(0, 0.1, 60)
    mean = lambda i: float(y[i].mean())  # noqa: E731
    by_sweep = cluster_bootstrap(mean, np.repeat(np.arange(6), 10), reps=500)
    by_point = cluster_bootstrap(mean, np.arange(60), reps=500)
    assert by_sweep.high - by_sweep.low > 2 * (by_point.high - by_point.low)  # about sqrt(10) in theory


def test_leave_one_out_orients_by_the_other_sweeps():
    clusters = np.array(["a"] * 4 + ["b"] * 4 + ["c"] * 4)
    pos = np.array([1, 1, 0, 0] * 3, dtype=bool)
    same = np.array([0.9, 0.8, 0.1, 0.2] * 3)  # high = collapse in every sweep
    auc = lambda x: lambda i: auroc(x[i], pos[i])  # noqa: E731
    held = leave_one_out(auc(same), auc(same), clusters, 0.5)
    assert (held.value, held.folds, held.agree) == (1.0, 3, 3)
    flipped = same.copy()
    flipped[8:] = 1 - flipped[8:]  # sweep c: low = collapse
    held = leave_one_out(auc(flipped), auc(flipped), clusters, 0.5)
    assert held.agree < held.folds and held.value < 0.75


# ----------------------------------------------------------------------------- the planted signal
@pytest.fixture
def three_sweeps(tmp_path: Path) -> list[Path]:
    return [make_sweep(tmp_path, f"s{i}", seed=i, echo_before=True) for i in range(3)]


def test_planted_diagnostic_predicts_collapse_and_noise_does_not(three_sweeps):
    df = pooled_points(three_sweeps)
    assert len(df) == 36 and int(df["collapsed"].sum()) == 15
    kl = score(df, KL, 0.25, reps=REPS)
    assert kl.auc.value == 1.0 and kl.auc.low > 0.9
    assert kl.rho.value < -0.5  # high early KL, low final success
    assert kl.auc_loso.folds == 3 and kl.auc_loso.agree == 3
    noise = score(df, ENTROPY, 0.25, reps=REPS)
    assert noise.auc.low < 0.5 < noise.auc.high
    assert [s.diagnostic.name for s in stop_candidates([kl, noise])] == ["KL k3"]
    text = "\n".join(stop_lines(df, [kl, noise]))
    assert "stops 15 of 15 collapses and 0 of 21 healthy runs" in text


def test_signal_inside_one_sweep_only_fails_leave_one_sweep_out(tmp_path: Path):
    sweeps = [make_sweep(tmp_path, "s0", seed=0), make_sweep(tmp_path, "s1", seed=1)]
    sweeps.append(make_sweep(tmp_path, "s2", seed=2, flip=True))  # the signal points the other way here
    df = pooled_points(sweeps)
    kl = score(df, KL, 0.25, reps=REPS)
    assert kl.auc_loso.agree < kl.auc_loso.folds
    assert stop_candidates([kl]) == []
    assert "No early-stop rule" in "\n".join(stop_lines(df, [kl]))


def test_claims_verdicts(three_sweeps):
    found = {c.source: c for c in claims(pooled_points(three_sweeps), reps=REPS)}
    assert found["RAGEN-2"].verdict == UNDETERMINED and "logged in 0 of 36" in found["RAGEN-2"].evidence
    assert found["RAGEN"].verdict == SUPPORTED  # the echo flag fires at update 10 in every collapsing run
    assert "hits 15/15, false alarms 0/21" in found["RAGEN"].evidence
    assert found["ARLArena"].verdict == CONTRADICTED  # no spike in any run: never precedes a collapse


def test_mi_claim_reads_the_first_mi_when_it_comes_after_the_cut_off(tmp_path: Path):
    # MI every 10 of 20 updates: nothing in the first 25% (updates 1-5), its first reading at update 10
    sweeps = [make_sweep(tmp_path, f"s{i}", seed=i, mi_every=10) for i in range(3)]
    claim = claims(pooled_points(sweeps), reps=REPS)[0]
    assert "MI at its first reading, update 10-10" in claim.claim
    assert claim.verdict == SUPPORTED  # the planted MI follows the final success; entropy is noise


def test_a_run_in_two_sweeps_counts_once(tmp_path: Path):
    a = make_sweep(tmp_path, "a", seed=0)
    b = tmp_path / "b"
    b.mkdir()
    shutil.copytree(a / "run00__seed=0", b / "run00__seed=0")
    assert len(pooled_points([a, b])) == 12


# ----------------------------------------------------------------------------- the command
def _harness(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness", *args], capture_output=True, text=True, cwd=cwd)


def test_cli_prints_the_table_and_draws_the_figure(three_sweeps, tmp_path: Path):
    pack = _harness("records", "pack", str(three_sweeps[2]), cwd=tmp_path)
    assert pack.returncode == 0, pack.stderr
    args = [str(three_sweeps[0]), str(three_sweeps[1]), pack.stdout.strip()]
    res = _harness("diagnose", *args, "--figure", str(tmp_path / "fig.png"), "--reps", "200", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert "Runs: 36 from 3 sweep(s)" in res.stdout
    assert "| KL k3 | mean of first 25% | 36 |" in res.stdout
    assert "| the echo-trap flag precedes collapse | RAGEN |" in res.stdout
    assert (tmp_path / "fig.png").stat().st_size > 10_000


def test_cli_bad_input_is_one_message_naming_the_path(tmp_path: Path):
    empty = tmp_path / "empty"
    empty.mkdir()
    quiet = make_sweep(tmp_path, "quiet", keys=("diag/none",))  # runs, but not one diag/ metric
    for folder, words in ((empty, "holds no points"), (quiet, "no per-update diagnostics")):
        res = _harness("diagnose", str(folder), "--figure", str(tmp_path / "f.png"), cwd=tmp_path)
        assert res.returncode == 2 and "Traceback" not in res.stderr
        assert str(folder) in res.stderr and words in res.stderr
    with pytest.raises(AnalysisError, match="no results given"):
        pooled_points([])


def test_page_section_pools_folders_and_packs_under_the_root(tmp_path: Path):
    from analysis.diagnose_page import TITLE, section
    from analysis.records import pack

    root = tmp_path / "results"
    make_sweep(root, "a", seed=0)
    shutil.rmtree(pack(make_sweep(root, "b", seed=1)).with_name("b"))  # only its pack is left
    (root / "empty").mkdir()  # no runs: left out of the section, not an error
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "_diagnostics.md").write_text("Hand-written.")
    figures, out = tmp_path / "docs" / "figures", tmp_path / "docs" / "results.md"
    text = "\n".join(section(root, out, figures, notes, lambda p: Path(p).name))
    assert text.startswith(f"## {TITLE}") and "`harness diagnose a b.records.jsonl.gz --outcome sampled`" in text
    assert "Runs: 24 from 2 sweep(s)" in text and text.rstrip().endswith("Hand-written.")
    assert (figures / "diagnose" / "which_diagnostics_sampled.png").is_file()
    # these runs were evaluated with sampled decoding only: the greedy part says so, naming no machine path
    assert "Nothing to score: no run of a, b.records.jsonl.gz records final/eval_greedy/success" in text


def test_a_dip_the_run_recovers_from_is_no_collapse(tmp_path):
    """The outcome is the final evaluation: a run whose success fell at update 10 and came back by the end
    did not collapse; one that is still down at the end collapsed at the first evaluation that fell."""
    import json

    from analysis.diagnose import collapse_onset

    def write(successes: dict[int, float]) -> None:
        rows = [
            {"update": u, "mode": "greedy", "task": t, "sample": 0, "success": float(t % 100 < 100 * p)}
            for u, p in successes.items()
            for t in range(200)
        ]
        (tmp_path / "eval_tasks.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))

    write({0: 0.8, 10: 0.5, 20: 0.7, 30: 0.8})
    assert math.isnan(collapse_onset(tmp_path, "greedy", 0.8, 0.8, 200))
    write({0: 0.8, 10: 0.5, 20: 0.8, 30: 0.5})
    assert collapse_onset(tmp_path, "greedy", 0.8, 0.5, 200) == 10.0
