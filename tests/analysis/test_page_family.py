"""The page-wide correction of the results page (analysis.family): every published contrast's
difference and equivalence tests Holm-corrected together, beside each table's own verdict."""

import math
import shutil

import pytest
from scipy import stats
from synthetic_tasks import make_task_sweep

from analysis.family import UNRESOLVED, Contrast, correct, from_text, p_text, tost_p
from analysis.intervals import EQUIVALENCE_CONFIDENCE, Interval
from analysis.results_doc import write_results_doc


def _t2_sf(t: float) -> float:
    """P(T >= t) for T ~ t(2), in closed form: (1 - t / sqrt(t^2 + 2)) / 2."""
    return (1 - t / math.sqrt(t * t + 2)) / 2


def test_tost_p_is_the_larger_one_sided_p_hand_computed():
    iv = Interval(0.01, 0.02, 2, 3, 1)
    # H0 Δ <= -0.05: t = 0.06 / 0.02 = 3; H0 Δ >= 0.05: t = 0.04 / 0.02 = 2 (the larger p)
    assert tost_p(iv, 0.05) == pytest.approx(_t2_sf(2.0)) == pytest.approx(0.0917517, abs=1e-6)
    assert _t2_sf(3.0) < tost_p(iv, 0.05)
    # below 0.05 exactly when the 90% interval lies inside the margin
    for margin in (0.03, 0.05, 0.0683, 0.0685, 0.1):
        lo, hi = iv.bounds(EQUIVALENCE_CONFIDENCE)
        assert (tost_p(iv, margin) < 0.05) == (-margin < lo and hi < margin)
    assert math.isnan(tost_p(Interval(0.0, 0.0, 2, 3, 1), 0.05))  # degenerate: no test


def test_one_holm_family_over_difference_and_equivalence_tests_hand_computed():
    better = Contrast(Interval(0.2, 0.01, 2, 3, 1), "better", 0.05)  # t = 20
    same = Contrast(Interval(0.0, 0.01, 2, 3, 1), "equivalent", 0.05)  # TOST t = 5 on both sides
    none = Contrast(None, "degenerate", 0.05)  # no test: not in the family
    correct([better, same, none])
    p_better = 2 * _t2_sf(20.0)  # 0.0024907
    p_same_equiv = _t2_sf(5.0)  # 0.018875
    assert better.p_diff == pytest.approx(p_better) and same.p_equiv == pytest.approx(p_same_equiv)
    # four p-values: 0.0024907 x 4, then 0.018875 x 3, then 0.99779 x 2 (capped at 1), then 1
    assert better.adj_diff == pytest.approx(4 * p_better) == pytest.approx(0.0099627, abs=1e-6)
    assert same.adj_equiv == pytest.approx(3 * p_same_equiv) == pytest.approx(0.056625, abs=1e-6)
    assert better.adj_equiv == 1.0 and same.adj_diff == 1.0
    assert better.page == "better"  # survives the page's family
    assert same.page == "undetermined"  # its 90% interval lies inside ±0.05, but not after the page's Holm
    assert none.page == "degenerate" and math.isnan(none.adj_diff)


def test_a_kept_row_is_read_from_its_rounded_interval_and_can_stay_unresolved():
    iv = from_text("Δ -0.05 [-0.17, 0.07]", 3)
    assert iv.value == pytest.approx(-0.05) and iv.df == 2
    assert iv.se == pytest.approx(0.12 / stats.t.ppf(0.975, 2))
    assert from_text("Δ +0.00 (degenerate)", 3) is None and from_text("+0.19 [0.10, 0.28]", 3).value > 0
    # 2 df: p about 0.013 x 4 tests does not survive; with the sweep's design df of 100 it would
    wide = Contrast(from_text("Δ -0.20 [-0.30, -0.10]", 3), "worse", 0.05, approximate=True, df_hi=100)
    other = Contrast(Interval(0.0, 0.5, 2, 3, 1), "undetermined", 0.05)
    correct([wide, other])
    assert wide.adj_diff > 0.05 >= wide.adj_diff_lo and wide.page == UNRESOLVED
    assert p_text(wide.adj_diff, True, wide.adj_diff_lo).startswith("≈") and " to " in p_text(wide.adj_diff, True, 0)
    firm = Contrast(from_text("Δ -0.20 [-0.30, -0.10]", 3), "worse", 0.05, approximate=True, df_hi=2)
    correct([firm, other])
    assert firm.page == "undetermined"  # no df it may have had lets it survive


def _page(tmp_path):
    root, sweeps, notes = tmp_path / "results", tmp_path / "sweeps", tmp_path / "docs" / "results_notes"
    make_task_sweep(root / "filters")
    sweeps.mkdir()
    (sweeps / "filters.yaml").write_text("name: filters\ngrid: {algo.filter.name: [none, dapo]}\n")
    notes.mkdir(parents=True)
    return root, sweeps, tmp_path / "docs" / "results.md"


def _findings(text: str) -> list[str]:
    part = text.split("## Findings")[1].split("## Contents")[0]
    return [line for line in part.splitlines() if line.startswith("| ")]


def test_the_page_shows_the_table_and_the_page_level_verdicts_side_by_side(tmp_path):
    root, sweeps, out = _page(tmp_path)
    text = write_results_doc(root, out, sweeps).read_text()
    rows = _findings(text)
    assert rows[0] == (
        "| sweep | question | answer | Δ [95% CI] | verdict | Holm p, page: Δ ≠ 0 | Holm p, page: within ±m "
        "| verdict, page |"
    )
    body = [[c.strip() for c in r.strip("|").split("|")] for r in rows[2:]]
    assert body and all(len(r) == 8 for r in body)
    assert all(not r[5].startswith("≈") for r in body)  # computed from the results: exact
    assert "across the " in text and " tests with a p-value that the page publishes" in text
    assert "Holm, not Benjamini-Hochberg" in text.split("## How to read the tables")[1]
    assert "<!-- contrasts (cell, value, se, df, seeds) for the page-wide correction: [[" in text
    # regenerated without its results, the kept section reads its exact intervals back: the same rows
    shutil.rmtree(root / "filters")
    again = write_results_doc(root, out, sweeps).read_text()
    assert "_Kept from the previous version of this page" in again and _findings(again) == rows
    # a page older than the hidden line: the p-values are read from the printed interval (≈)
    out.write_text("\n".join(line for line in again.splitlines() if "page-wide correction: [[" not in line))
    old = [
        [c.strip() for c in r.strip("|").split("|")]
        for r in _findings(write_results_doc(root, out, sweeps).read_text())[2:]
    ]
    assert [r[:5] for r in old] == [r[:5] for r in body] and all(r[5].startswith("≈") for r in old)


def test_a_kept_undetermined_row_of_an_older_page_gets_the_seeds_a_verdict_would_need_once(tmp_path):
    """A row kept from a page older than the seeds-needed note gets it, projected from its interval alone
    (a lower bound: 'at least'); a kept row that already says it, and a second regeneration, keep the text."""
    import re

    root, sweeps, out = _page(tmp_path)
    text = write_results_doc(root, out, sweeps).read_text()
    live = [r for r in _findings(text)[2:] if "cannot tell" in r]
    assert live and all("a verdict would need about " in r or "no verdict below" in r for r in live)
    shutil.rmtree(root / "filters")
    note = r" \((a verdict would need about|no verdict below) \d+ seeds at the observed Δ and variance\)"
    older = re.sub(note, "", text)
    assert older != text
    out.write_text(older)
    kept = write_results_doc(root, out, sweeps).read_text()
    rows = [r for r in _findings(kept)[2:] if "would need" in r or "no verdict below" in r]
    # from the interval alone every variance is seed variance, which more seeds shrink: a finite lower bound
    assert len(rows) == len(live) and all(re.search(r"would need at least \d+ seeds", r) for r in rows)
    assert write_results_doc(root, out, sweeps).read_text() == kept
