"""docs/results.md as a reader meets it: the findings table first (sweep | question | answer | Δ [CI] |
verdict), then the contents, the limits and the legend, stated once; short captions under it;
the sentence on sweeps that share a baseline run; no path of the machine that built it."""

from __future__ import annotations

import re

from synthetic_tasks import make_task_sweep

from analysis.results_doc import write_results_doc


def _page(tmp_path, shared: bool = True) -> str:
    root, sweeps, notes = tmp_path / "results", tmp_path / "sweeps", tmp_path / "docs" / "results_notes"
    make_task_sweep(root / "filters")
    if shared:  # a second sweep whose baseline points are the same runs (same config hashes)
        make_task_sweep(root / "filters_again")
    sweeps.mkdir()
    (sweeps / "filters.yaml").write_text("name: filters\ndescription: Dynamic filtering. DAPO against none.\n")
    (sweeps / "filters_again.yaml").write_text("name: filters_again\ndescription: The same again.\n")
    notes.mkdir(parents=True)
    (notes / "_limits.md").write_text("Actions of 1-2 tokens; about 6 steps; 30 updates; no collapse.\n")
    (notes / "_intro.md").write_text("Run on 2 CPU cores.\n")
    (notes / "_questions.yaml").write_text("filters: Does dynamic filtering help?\n")
    out = write_results_doc(root, tmp_path / "docs" / "results.md", sweeps)
    return out.read_text(encoding="utf-8")


def test_the_page_opens_with_the_findings_then_the_contents_then_the_limits(tmp_path):
    text = _page(tmp_path)
    headings = re.findall(r"^## (.+)$", text, flags=re.M)
    assert headings[:5] == [
        "Findings",
        "Contents",
        "Limits of the tiny-model regime",
        "Setup",
        "How to read the tables",
    ]
    findings = text.split("## Findings")[1].split("## Contents")[0]
    assert "| sweep | question | answer | Δ [95% CI] | verdict |" in findings
    rows = [line for line in findings.splitlines() if line.startswith("| [filters](#filters)")]
    assert rows[0].startswith(
        "| [filters](#filters) | Does dynamic filtering help? | cannot tell ragen_top_p from none (no verdict below "
        "1000 seeds at the observed Δ and variance) |"
    )
    assert rows[0].endswith("| undetermined |") and "Δ +0.25 [" in rows[0]
    assert rows[1].startswith("| [filters](#filters) |  | cannot tell dapo from none (")  # the question once
    again = next(line for line in findings.splitlines() if line.startswith("| [filters_again]"))
    assert "| The same again |" in again  # no question listed: the description's first sentence
    contents = text.split("## Contents")[1].split("\n## ")[0]
    assert "- [filters](#filters)" in contents and "- [Limits of the tiny-model regime](#limits" in contents
    assert "Actions of 1-2 tokens" in text.split("## Limits of the tiny-model regime")[1].split("\n## ")[0]


def test_the_legend_is_stated_once_and_the_captions_are_short(tmp_path):
    text = _page(tmp_path)
    legend = "95% t interval from the two-way model of seeds and tasks"
    assert text.count(legend) == 1 and legend in text.split("## How to read the tables")[1].split("\n## ")[0]
    assert text.count("Holm's correction") == 1
    assert text.count("collapse (update): the update at which the collapse detector fired") == 1
    captions = [line for line in text.splitlines() if line.startswith("Table: ")]
    assert len(captions) == 2 and all(len(c) < 300 for c in captions)
    assert "| filter.name | seeds | start | final | gain | Δ vs baseline | verdict |" in text


def test_sweeps_that_share_a_baseline_run_are_named_and_no_build_path_is_printed(tmp_path):
    text = _page(tmp_path)
    findings = text.split("## Contents")[0]
    assert "The sweeps filters and filters_again share one 3-seed baseline run" in findings
    assert "their errors are correlated" in findings
    assert str(tmp_path) not in text and "/tmp/" not in text
    assert "share one" not in _page(tmp_path / "alone", shared=False)


def test_sweeps_whose_baseline_runs_overlap_are_named_together():
    """A sweep run at 3 seeds shares a subset of the 5-seed baseline of the others; a sweep with its own
    baseline is not named; sets joined only through a third sweep still form one group."""
    from analysis.findings import shared_baselines

    runs = {"agg": frozenset("abc"), "clip": frozenset("abcde"), "mask": frozenset("abcde"), "hack": frozenset("z")}
    (line,) = shared_baselines(runs)
    assert (
        line.startswith("The sweeps agg, clip and mask share baseline runs (3 to 5 seeds each") and "hack" not in line
    )
    (line,) = shared_baselines({"a": frozenset("x"), "b": frozenset("y"), "c": frozenset("xy")})
    assert line.startswith("The sweeps a, b and c share baseline runs (1 to 2 seeds each")
    assert shared_baselines({"a": frozenset("x"), "b": frozenset("y")}) == []


def test_a_kept_sweep_stays_in_the_sentence_on_shared_baseline_runs(tmp_path):
    """Regenerating from a root that lacks one of two sweeps sharing a baseline run: the kept section's
    hidden line of config hashes keeps it in the sentence. A page older than those lines keeps its
    sentence verbatim while every sweep it names is kept, and recomputes it once one is re-run."""
    import shutil

    text = _page(tmp_path)
    out = tmp_path / "docs" / "results.md"
    sentence = next(line for line in text.splitlines() if line.startswith("The sweeps filters and filters_again"))
    assert text.count("<!-- baseline run (config hashes): ") == 2
    sweeps, part = tmp_path / "sweeps", tmp_path / "part"
    make_task_sweep(part / "filters")  # filters_again is kept from the page
    write_results_doc(part, out, sweeps)
    after = out.read_text(encoding="utf-8")
    assert "_Kept from the previous version of this page: `part/filters_again`" in after
    assert sentence in after.split("## Contents")[0]

    # the page as written before the hidden lines: both sweeps kept, the sentence survives as it was
    old = "\n".join(line for line in text.splitlines() if not line.startswith("<!-- baseline run")) + "\n"
    out.write_text(old, encoding="utf-8")
    empty = tmp_path / "empty"
    empty.mkdir()
    write_results_doc(empty, out, sweeps)
    assert sentence in out.read_text(encoding="utf-8").split("## Contents")[0]
    # one of them re-run: the sentence is recomputed, and the kept one without hashes is not in it
    out.write_text(old, encoding="utf-8")
    write_results_doc(part, out, sweeps)
    assert "The sweeps " not in out.read_text(encoding="utf-8").split("## Contents")[0]
    # and with the hidden lines nothing is lost even when every sweep is kept
    shutil.rmtree(part)
    part.mkdir()
    out.write_text(text, encoding="utf-8")
    write_results_doc(part, out, sweeps)
    assert sentence in out.read_text(encoding="utf-8").split("## Contents")[0]
