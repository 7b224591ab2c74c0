"""analysis.table: golden Markdown / LaTeX tables, baseline differences, partial sweeps.

Regenerate the golden files after an intended change with UPDATE_GOLDEN=1 and read the diff."""

import io
import json
import os
from pathlib import Path

import pandas as pd
import pytest
from synthetic import make_clip_sweep

from analysis.load import AnalysisError
from analysis.table import render, table_for

GOLDEN = Path(__file__).parent / "golden"


def check_golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("UPDATE_GOLDEN"):
        path.write_text(text, encoding="utf-8")
    assert text == path.read_text(encoding="utf-8"), f"{name} differs from the golden file (UPDATE_GOLDEN=1 to accept)"


@pytest.mark.parametrize("fmt,name", [("markdown", "clip_table.md"), ("latex", "clip_table.tex")])
def test_golden_tables(clip_sweep, fmt, name):
    check_golden(name, render(table_for(clip_sweep), fmt))


def test_golden_brackets(clip_sweep):
    t = table_for(clip_sweep, ["final/eval_greedy/success", "init/eval_greedy/success"], interval="bracket")
    check_golden("clip_table_brackets.md", render(t, "markdown"))


def test_delta_is_the_known_shift_and_pairing_is_reported(clip_sweep):
    data = pd.read_csv(io.StringIO(render(table_for(clip_sweep), "csv"))).set_index("clip.level")
    assert data.loc["dual", "delta"] == pytest.approx(0.25)  # dual = ppo + 0.25 on every seed
    assert data.loc["dual", "delta:lo"] == pytest.approx(0.25) and data.loc["dual", "delta:hi"] == pytest.approx(0.25)
    assert bool(data.loc["dual", "delta:paired"]) is True
    assert bool(data.loc["none", "delta:paired"]) is False  # seed 2 failed: seeds differ from the baseline
    assert data.loc["none", "delta"] == pytest.approx((0.125 + 0.25) / 2 - 0.5)
    assert data.loc["ppo", "final"] == pytest.approx(0.5)
    assert data.loc["dual", "gain"] == pytest.approx(0.75) and data.loc["dual", "start"] == 0
    assert data.loc["none", "seeds"] == 2 and data.loc["none", "requested"] == 3
    assert data.loc["none", "collapsed_at"] == pytest.approx(7)


def test_marks_footnotes_and_footer(clip_sweep):
    text = render(table_for(clip_sweep), "markdown")
    none_row = next(line for line in text.splitlines() if line.startswith("| none"))
    assert "†" in none_row and "‡" in none_row and "(2/2)" in none_row
    assert "| 6, 8† (2/2) |" in none_row  # the updates at which the runs collapsed, not a mean ± t interval
    ppo_row = next(line for line in text.splitlines() if line.startswith("| ppo"))
    assert "†" not in ppo_row and "baseline" in ppo_row and "never (0/3)" in ppo_row
    assert "- none seed 2 [clip.level=none__seed2]: failed: CUDA out of memory" in text
    assert "seeds 0, 1, 2" in text and "code 0123456" in text


def test_min_seeds_hides_thin_cells(clip_sweep):
    text = render(table_for(clip_sweep, min_seeds=3), "markdown")
    none_row = next(line for line in text.splitlines() if line.startswith("| none"))
    assert "— (n=2)" in none_row and "0.19" not in none_row
    assert "fewer than 3 seeds (--min-seeds)" in text


def test_partial_sweep_nothing_finished_in_a_cell(tmp_path):
    drop = tuple(f"clip.level=dual__seed{s}" for s in range(3))
    root = make_clip_sweep(tmp_path / "clip", drop=drop)
    (root / "clip.level=ppo__seed0" / "status").write_text("running\n")
    (root / "clip.level=ppo__seed0" / "summary.json").unlink()
    t = table_for(root)
    text = render(t, "markdown")
    dual_row = next(line for line in text.splitlines() if line.startswith("| dual"))
    assert dual_row.startswith("| dual | 0/3 | — | — |")
    assert "clip.level=dual__seed0]: missing" in text and "clip.level=ppo__seed0]: running" in text
    assert len(t.missing) == 5  # 3 missing, 1 running, 1 failed
    for fmt in ("latex", "csv", "html"):
        assert render(t, fmt)


def test_unknown_metric_is_an_error_with_a_did_you_mean(clip_sweep):
    with pytest.raises(AnalysisError, match="did you mean final/eval_greedy/success"):
        table_for(clip_sweep, ["final/eval_greedy/sucess"])
    with pytest.raises(AnalysisError, match="'final/diag/nope' .* not recorded by any point"):
        table_for(clip_sweep, ["final/eval_greedy/success", "final/diag/nope"])
    assert table_for(clip_sweep, ["best/diag/kl_k3"])  # derived from metrics.jsonl: known


def test_a_metrics_jsonl_key_means_its_final_value_as_in_a_sweep_file(clip_sweep):
    bare, final = (
        render(table_for(clip_sweep, [m]), "markdown") for m in ("eval_greedy/success", "final/eval_greedy/success")
    )
    assert bare == final
    with pytest.raises(AnalysisError, match="did you mean final/eval_greedy/success"):
        table_for(clip_sweep, ["eval_greedy/sucess"])


def test_no_sweep_json_still_builds(tmp_path):
    root = make_clip_sweep(tmp_path / "old", with_sweep_json=False)
    text = render(table_for(root), "markdown")
    assert "(inferred)" in text and "| dual | 3/3 |" in text


def test_unknown_format_names_the_choices(clip_sweep):
    with pytest.raises(ValueError, match="markdown, latex, csv, html"):
        render(table_for(clip_sweep), "docx")


def test_diverged_runs_are_results_and_said_so(clip_sweep):
    d = clip_sweep / "clip.level=dual__seed1"
    (d / "status").write_text("diverged\n")
    summary = json.loads((d / "summary.json").read_text())
    (d / "summary.json").write_text(json.dumps({**summary, "status": "diverged"}))
    text = render(table_for(clip_sweep), "markdown")
    assert "| dual | 3/3 | 0.00 (degenerate) | 0.75 ± 0.62 |" in text
    assert "Diverged runs count as results, with the metrics they had when stopped: dual seed 1." in text


def test_stray_point_without_seed_or_config_is_listed(clip_sweep):
    (clip_sweep / "stray").mkdir()
    (clip_sweep / "stray" / "status").write_text("running\n")
    t = table_for(clip_sweep)
    assert any(m.endswith("[stray]: running (no config.yaml; no summary.json)") for m in t.missing)
    assert "| ppo | 3/3 | 0.00 (degenerate) | 0.50 ± 0.62 |" in render(t, "markdown")


def test_corrupt_points_are_never_counted_and_the_seeds_column_says_so(clip_sweep):
    (clip_sweep / "clip.level=ppo__seed1" / "summary.json").write_text("\x00garbage{")
    with open(clip_sweep / "clip.level=ppo__seed2" / "metrics.jsonl", "a") as f:
        f.write('{"update": 11, "env/succ')  # cut mid-line on a finished point
    (clip_sweep / "clip.level=dual__seed0" / "status").write_bytes(os.urandom(64) + b"\xff\xfe")
    t = table_for(clip_sweep)
    text = render(t, "markdown")
    assert "| ppo | 1/3 (2 corrupt) | 0.00† | 0.25† |" in text
    assert "| dual | 2/3 (1 corrupt) | 0.00 (degenerate)† | 0.88" in text
    assert "(k corrupt): seeds whose result files are damaged are not counted" in text
    corrupt = {m.split("[")[1].split("]")[0]: m for m in t.missing if ": corrupt" in m}
    assert set(corrupt) == {"clip.level=ppo__seed1", "clip.level=ppo__seed2", "clip.level=dual__seed0"}
    assert "summary.json is not valid JSON" in corrupt["clip.level=ppo__seed1"]
    assert "metrics.jsonl line 12 of 12 is not a JSON row" in corrupt["clip.level=ppo__seed2"]
    assert "status is not text" in corrupt["clip.level=dual__seed0"]
    assert t.data.set_index("clip.level").loc["ppo", "corrupt"] == 2


def test_points_from_different_cpu_code_paths_are_flagged(clip_sweep):
    for i, d in enumerate(sorted(p for p in clip_sweep.iterdir() if p.is_dir())):
        summary = json.loads((d / "summary.json").read_text())
        cpu = {"model": "x", "torch_kernels": "AVX512" if i == 0 else "AVX2", "blas": "mkl"}
        (d / "summary.json").write_text(json.dumps({**summary, "cpu": cpu}))
    assert "points ran on 2 different CPU code paths" in " ".join(table_for(clip_sweep).provenance)
