"""The real-model sweeps' records committed under results/smollm2_*/ (an hour a point on a CPU, so
docs/results.md is regenerated from them on any clone): every point intact, and the published
section's table is the one these records give."""

from __future__ import annotations

from pathlib import Path

import pytest

from analysis.render import render
from analysis.table import table_for
from harness.store.integrity import check_sweep

REPO = Path(__file__).resolve().parents[2]
COMMITTED = sorted(p for p in (REPO / "results").glob("smollm2_*") if (p / "sweep.json").is_file())


def test_there_are_committed_records():
    assert COMMITTED, "results/smollm2_learning_frozenlake/ should be committed (see .gitignore)"


@pytest.mark.parametrize("folder", COMMITTED, ids=lambda p: p.name)
def test_committed_points_are_intact_and_published(folder):
    assert check_sweep(folder) == []  # status, summary, config hash and metrics of every point agree
    page = (REPO / "docs" / "results.md").read_text()
    section = page.split(f"\n## {folder.name}\n")[1].split("\n### Notes\n")[0]
    rows = [line for line in render(table_for(folder), "markdown").splitlines() if line.startswith("| ")]
    assert rows and all(row in section for row in rows)
