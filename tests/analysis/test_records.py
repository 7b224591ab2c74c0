"""Records packs (`harness records pack`): the packed form reads back as exactly the folder it came from,
for the tables, the curves, the per-task evaluations and `harness diagnose`; its bytes depend on the
records alone; a damaged pack is one clear error."""

from __future__ import annotations

import gzip
import shutil
from pathlib import Path

import pytest
from synthetic import make_clip_sweep
from synthetic_diagnose import make_sweep

from analysis.diagnose import pooled_points
from analysis.load import AnalysisError, load_curves, load_results
from analysis.records import POINT_KEEP, as_folder, pack, pack_path, read_pack
from analysis.render import render
from analysis.table import table_for
from analysis.tasks import load_tasks

REPO = Path(__file__).resolve().parents[2]
COMMITTED = REPO / "results" / "smollm2_learning_sokoban"


@pytest.fixture(autouse=True)
def _cache(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("HARNESS_RECORDS_CACHE", str(tmp_path / "unpacked"))


def _same_reading(folder: Path, packed: Path) -> None:
    assert render(table_for(folder), "markdown") == render(table_for(packed), "markdown")
    a, b = load_results(folder), load_results(packed)
    assert a.drop(columns="problems").equals(b.drop(columns="problems"))
    assert load_curves(folder).equals(load_curves(packed))
    points = list(a["point"])
    ta, tb = load_tasks(folder, points), load_tasks(as_folder(packed), points)
    assert (ta is None and tb is None) or ta.equals(tb)


def test_round_trip_of_a_committed_sweep(tmp_path: Path):
    if not COMMITTED.is_dir():
        pytest.skip("the committed SmolLM2 records are not in this checkout")
    packed = pack(COMMITTED, tmp_path / f"{COMMITTED.name}.records.jsonl.gz")
    _, files = read_pack(packed)
    for rel, text in files.items():  # every kept file verbatim
        assert (COMMITTED / rel).read_text(encoding="utf-8") == text
    kept = {rel.split("/", 1)[1] for rel in files if "/" in rel}
    assert {"config.yaml", "metrics.jsonl", "eval_tasks.jsonl", "summary.json", "status"} <= kept <= set(POINT_KEEP)
    _same_reading(COMMITTED, packed)
    assert pooled_points([COMMITTED]).equals(pooled_points([packed]))


def test_round_trip_of_a_synthetic_sweep_with_a_failed_point(tmp_path: Path):
    folder = make_clip_sweep(tmp_path / "clip")
    _same_reading(folder, pack(folder))


def test_pack_bytes_depend_on_the_records_alone(tmp_path: Path):
    folder = make_sweep(tmp_path, "s0")
    first = pack(folder).read_bytes()
    assert pack(folder).read_bytes() == first
    assert gzip.decompress(first).startswith(b'{"format": "harness-records"')


def test_a_pack_stands_in_for_its_missing_folder(tmp_path: Path):
    folder = make_sweep(tmp_path, "s0")
    before = pooled_points([folder])
    pack(folder)
    shutil.rmtree(folder)
    assert not folder.exists() and pack_path(folder).is_file()
    assert pooled_points([folder]).drop(columns="sweep").equals(before.drop(columns="sweep"))
    assert len(load_results(folder)) == 12


def test_damaged_pack_is_one_error_naming_it(tmp_path: Path):
    bad = tmp_path / "x.records.jsonl.gz"
    bad.write_bytes(gzip.compress(b'{"format": "something else"}\n'))
    with pytest.raises(AnalysisError, match=str(bad)):
        load_results(bad)
    bad.write_bytes(b"not gzip")
    with pytest.raises(AnalysisError, match="not a readable records pack"):
        table_for(bad)


def test_results_page_from_a_pack_alone_is_the_page_from_the_folder(tmp_path: Path):
    from analysis.results_doc import write_results_doc

    root, sweeps = tmp_path / "results", tmp_path / "sweeps"
    folder = make_clip_sweep(root / "clipping")
    sweeps.mkdir()
    (sweeps / "clipping.yaml").write_text("name: clipping\ndescription: Clipping levels.\n")
    page = lambda: write_results_doc(root, tmp_path / "docs" / "results.md", sweeps, keep=False).read_text()  # noqa: E731
    from_folder = page()
    pack(folder)
    shutil.rmtree(folder)
    from_pack = page()
    assert "| clip.level |" in from_pack.split("\n## clipping\n")[1]  # the table, not "Not run yet"
    # the same page, but for the path `harness diagnose` is shown to read (the pack, not the folder)
    assert "harness diagnose results/clipping.records.jsonl.gz --outcome greedy" in from_pack
    assert from_pack.replace("results/clipping.records.jsonl.gz", "clipping") == from_folder
