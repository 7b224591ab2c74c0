"""The transfer table of the results page (analysis.transfer): a contrast on the tiny model beside the
same contrast on a real model, each with its own sweep's verdict, and how the two verdicts relate."""

import json
import math
import shutil

import pytest
from scipy import stats
from synthetic_tasks import make_task_sweep

from analysis.intervals import Interval, independent_difference
from analysis.load import AnalysisError
from analysis.results_doc import write_results_doc
from analysis.transfer import relation, spec


@pytest.mark.parametrize(
    "tiny, real, expected",
    [
        ("worse", "worse", "agree"),
        ("equivalent", "equivalent", "agree"),
        ("better", "worse", "reverse"),
        ("lower", "higher", "reverse"),
        ("equivalent", "worse", "differ"),
        ("better", "equivalent", "differ"),
        ("worse", "undetermined", "undetermined"),
        ("undetermined", "better", "undetermined"),
        ("degenerate", "worse", "undetermined"),
        (None, "worse", "—"),
        ("worse", None, "—"),
    ],
)
def test_relation_of_two_verdicts(tiny, real, expected):
    assert relation(tiny, real) == expected


def _page(tmp_path, rows: str):
    root, sweeps, notes = tmp_path / "results", tmp_path / "sweeps", tmp_path / "docs" / "results_notes"
    make_task_sweep(root / "filters")
    shutil.copytree(root / "filters", root / "filters_real")  # the same contrast "measured on another model"
    manifest = json.loads((root / "filters_real" / "sweep.json").read_text())
    (root / "filters_real" / "sweep.json").write_text(json.dumps({**manifest, "name": "filters_real"}))
    sweeps.mkdir()
    for name in ("filters", "filters_real", "unrun"):
        # a wide equivalence margin gives the synthetic Δ of +0.25 [-0.08, 0.58] a determined verdict
        grid = "grid: {algo.filter.name: [none, dapo]}\nequivalence_margin: 0.9"
        (sweeps / f"{name}.yaml").write_text(f"name: {name}\n{grid}\n")
    notes.mkdir(parents=True)
    (notes / "_limits.md").write_text("Actions of 1-2 tokens.\n")
    (notes / "_transfer.yaml").write_text("model: RealLM\nrows:\n" + rows)
    return root, sweeps, tmp_path / "docs" / "results.md"


ROWS = """\
  - contrast: DAPO vs no filter
    tiny: {sweep: filters, cell: dapo}
    real: {sweep: filters_real, cell: dapo}
    note: its real side ran on another machine
  - contrast: not measured on the real model yet
    tiny: {sweep: filters, cell: ragen_top_p}
    real: {sweep: unrun, cell: dapo}
  - contrast: the real model only
    tiny: null
    real: {sweep: filters_real, cell: ragen_top_p}
"""


def test_transfer_table_sets_each_sweeps_verdict_side_by_side(tmp_path):
    root, sweeps, out = _page(tmp_path, ROWS)
    text = write_results_doc(root, out, sweeps).read_text()
    head, rest = text.split("\n## Transfer to a pretrained model\n")
    assert "\n## Contents\n" in head and "- [Transfer to a pretrained model](#transfer-to-a-pretrained-model)" in head
    table_head = "| contrast | tiny model | RealLM | relation |"
    assert rest.index(table_head) < rest.index("## Limits of the tiny-model regime")
    section = rest.split("\n## ")[0]
    rows = [line for line in section.splitlines() if line.startswith("| ")][2:]  # under the head and the rule
    assert len(rows) == 3
    # each side is its sweep's own findings row: Δ, interval and verdict as the findings table prints them
    finding = next(r for r in head.splitlines() if r.startswith("| [filters](#filters)") and "dapo" in r)
    delta, verdict = (c.strip() for c in finding.strip("|").split("|")[3:5])
    verdict = verdict.strip("*")
    dapo = rows[0].strip("|").split("|")
    assert dapo[0].strip() == "DAPO vs no filter"
    assert dapo[1].strip() == f"{delta} {verdict} ([filters](#filters))"
    assert dapo[2].strip() == f"{delta} {verdict} ([filters_real](#filters_real))"
    assert verdict == "equivalent" and dapo[3].strip() == "agree"
    unrun = rows[1].strip("|").split("|")
    assert unrun[2].strip() == "[unrun](#unrun): not run yet" and unrun[3].strip() == "—"
    only = rows[2].strip("|").split("|")
    assert only[1].strip() == "no such contrast" and only[3].strip() == "—"
    assert "\n- DAPO vs no filter: its real side ran on another machine\n" in section  # a row's note, under the table


X = "  - contrast: x\n"


@pytest.mark.parametrize(
    "rows, message",
    [
        (X + "    tiny: {sweep: nope, cell: dapo}\n    real: null\n", "rows[0].tiny.sweep = 'nope' is not a sweep"),
        (X + "    tiny: {sweep: filters}\n    real: null\n", "rows[0].tiny = {'sweep': 'filters'}: expected"),
        (X + "    tiny: null\n", "rows[0] = ['contrast', 'tiny']: expected the keys contrast"),
        (X + "    tiny: null\n    real: null\n    note: [a]\n", "optionally note (text)"),
        (X + "    tiny: null\n    real: [filters, dapo]\n", "rows[0].real = ['filters', 'dapo']: expected"),
        ("  - nope\n", "rows[0] = 'nope': expected the keys contrast"),
    ],
)
def test_a_malformed_transfer_file_is_one_message_naming_the_key(tmp_path, rows, message):
    root, sweeps, out = _page(tmp_path, rows)
    with pytest.raises(AnalysisError, match="_transfer.yaml: ") as e:
        write_results_doc(root, out, sweeps)
    assert message in str(e.value)
    assert not out.exists()  # nothing written


def test_no_transfer_file_no_section(tmp_path):
    root, sweeps, out = _page(tmp_path, ROWS)
    (out.parent / "results_notes" / "_transfer.yaml").unlink()
    assert spec(out.parent / "results_notes") is None
    assert "Transfer to a pretrained model" not in write_results_doc(root, out, sweeps).read_text()


def test_size_difference_is_welch_satterthwaite():
    tiny, real = Interval(-0.25, 0.02, 4, 5, 256), Interval(-0.06, 0.03, 2, 3, 128)
    d = independent_difference(real, tiny)
    assert d.value == pytest.approx(0.19) and d.se == pytest.approx(math.sqrt(0.02**2 + 0.03**2))
    assert d.df == pytest.approx((0.02**2 + 0.03**2) ** 2 / (0.02**4 / 4 + 0.03**4 / 2))  # 3.80
    assert d.lo == pytest.approx(0.19 - stats.t.ppf(0.975, d.df) * d.se) and d.lo > 0  # sizes differ
    normal = independent_difference(Interval(0.0, 0.01, math.inf, 3, 10), Interval(0.0, 0.01, math.inf, 3, 10))
    assert normal.df == math.inf and normal.se == pytest.approx(math.sqrt(2) * 0.01)


def test_transfer_table_compares_sizes_of_the_same_kind_only(tmp_path):
    root, sweeps, out = _page(tmp_path, ROWS)
    section = write_results_doc(root, out, sweeps).read_text().split("\n## Transfer to a pretrained model\n")[1]
    rows = [line.strip("|").split("|") for line in section.split("\n## ")[0].splitlines() if line.startswith("| ")]
    assert rows[0][4].strip() == "RealLM − tiny" and rows[0][5].strip() == "relation, page"
    same = rows[2]  # the same sweep on both sides: d = 0 with an interval wider than either side's
    side = [float(x) for x in same[1].split("[")[1].split("]")[0].split(",")]
    d = [float(x) for x in same[4].split("[")[1].split("]")[0].split(",")]
    assert same[4].strip().startswith("+0.00 [") and d[0] == pytest.approx(-d[1], abs=0.011)
    assert d[1] - d[0] > side[1] - side[0]  # two independent errors add
    assert rows[3][4].strip() == "—" and rows[4][4].strip() == "—"  # a side without a verdict / no such contrast


def _transfer_rows(text: str) -> list[list[str]]:
    section = text.split("\n## Transfer to a pretrained model\n")[1].split("\n## ")[0]
    return [[c.strip() for c in line.strip("|").split("|")] for line in section.splitlines() if line.startswith("| ")]


def test_a_kept_side_keeps_its_row_when_the_page_is_regenerated_without_its_results(tmp_path):
    root, sweeps, out = _page(tmp_path, ROWS)
    before = _transfer_rows(write_results_doc(root, out, sweeps).read_text())
    shutil.rmtree(root / "filters")  # a clone without the tiny sweep's results: its section is kept
    text = write_results_doc(root, out, sweeps).read_text()
    assert "_Kept from the previous version of this page: `" in text
    after = _transfer_rows(text)
    assert after == before  # verdicts, relation and the size column, unchanged
    assert after[2][3] == "agree" and after[2][4].startswith("+0.00 [")
    # the other side changed since: the verdicts still relate, the size cannot be recomputed
    page = out.read_text().replace("([filters_real](#filters_real)) | agree |", "([filters_real](#x)) | agree |", 1)
    out.write_text(page)
    changed = _transfer_rows(write_results_doc(root, out, sweeps).read_text())[2]
    assert changed[1] == before[2][1] and changed[2] == before[2][2]
    assert changed[3] == "agree" and changed[4] == "— (a side kept from the previous page)"
    # a previous cell from another sweep (the row was edited since) is not taken for this one
    out.write_text(out.read_text().replace("equivalent ([filters](#filters)) |", "equivalent ([other](#other)) |", 1))
    edited = _transfer_rows(write_results_doc(root, out, sweeps).read_text())[2]
    assert edited[1].startswith("[filters](#filters): table kept") and edited[3] == "—"
    # no previous page: nothing to keep, the sweep without results is "not run yet"
    out.unlink()
    bare = _transfer_rows(write_results_doc(root, out, sweeps).read_text())[2]
    assert bare[1] == "[filters](#filters): not run yet" and bare[3] == "—"
