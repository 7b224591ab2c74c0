"""analysis.plot / analysis.report and the CLI commands: files written, non-empty, partial sweeps."""

import subprocess
import sys

import pandas as pd
import pytest
import typer
from synthetic import make_clip_sweep
from typer.testing import CliRunner

from analysis.load import AnalysisError
from analysis.plot import make_plots
from analysis.plot_data import bands
from analysis.report import write_report
from harness.cli.analysis import register

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def cli():
    app = typer.Typer()
    register(app)
    return lambda *args: CliRunner().invoke(app, [str(a) for a in args])


def test_plot_command_writes_png_and_svg(cli, clip_sweep, tmp_path):
    r = cli("plot", clip_sweep, "--out", tmp_path / "figs")
    assert r.exit_code == 0, r.output
    figs = {p.name for p in (tmp_path / "figs").iterdir()}
    stems = ("evaluation", "training", "diagnostics")
    assert figs == {f"{stem}.{ext}" for stem in stems for ext in ("png", "svg")}
    for stem in stems:
        png, svg = tmp_path / "figs" / f"{stem}.png", tmp_path / "figs" / f"{stem}.svg"
        assert png.read_bytes()[:8] == PNG and png.stat().st_size > 1000
        assert svg.stat().st_size > 1000 and b"<svg" in svg.read_bytes()[:1000]
    # collapse markers: one dotted line per collapsed run (2) in each of the four diagnostic panels
    assert (tmp_path / "figs" / "diagnostics.svg").read_text().count("stroke-dasharray") >= 2 * 4


def test_bands_are_the_t_interval_over_seeds():
    data = pd.DataFrame({"label": ["a"] * 4, "update": [0, 0, 1, 1], "value": [0.0, 1.0, 0.5, 0.5]})
    b = bands(data).set_index("update")
    half = 12.706204736 * 0.5  # t(0.975, 1 df) x SE of [0, 1] (sd 0.707 / sqrt 2)
    assert (b.loc[0, "mean"], b.loc[0, "lo"], b.loc[0, "hi"]) == pytest.approx((0.5, 0.5 - half, 0.5 + half))
    assert b.loc[1, "lo"] == b.loc[1, "hi"] == 0.5


def test_plot_unknown_metric_names_the_logged_ones(clip_sweep):
    with pytest.raises(AnalysisError, match="logged metrics: diag/kl_k3"):
        make_plots(clip_sweep, ["nope"])


def test_report_markdown_links_existing_figures(tmp_path):
    root = make_clip_sweep(tmp_path / "clip", drop=("clip.level=dual__seed2",))
    md = write_report(root)
    text = md.read_text(encoding="utf-8")
    assert md == root / "report.md"
    assert "7 of 9 points finished (7 done, 1 failed, 1 missing)." in text
    assert "| ppo | 3/3 |" in text and "![diagnostics](plots/diagnostics.png)" in text
    assert "clip.level=dual__seed2]: missing" in text and "packages: " in text
    assert (root / "plots" / "diagnostics.png").stat().st_size > 0


def test_report_before_any_metrics_is_still_a_page(tmp_path):
    root = make_clip_sweep(tmp_path / "clip")
    for p in root.glob("*/metrics.jsonl"):
        p.unlink()
    text = write_report(root).read_text(encoding="utf-8")
    assert "No figures:" in text and "## Missing or unfinished" in text


def test_table_and_report_commands(cli, clip_sweep, tmp_path):
    r = cli("table", clip_sweep, "--format", "latex", "--out", tmp_path / "t.tex")
    assert r.exit_code == 0, r.output
    assert (tmp_path / "t.tex").read_text(encoding="utf-8").count(r"\toprule") == 1
    r = cli("table", clip_sweep, "-m", "final/eval_greedy/success", "--margin", "0.3", "--min-seeds", "2")
    assert r.exit_code == 0 and "| dual | 3/3 | 0.00 (degenerate) | 0.75" in r.output and "±0.3 " in r.output
    r = cli("table", clip_sweep, "--margin", "0")
    assert r.exit_code == 2 and "not a margin" in r.output and "Traceback" not in r.output
    r = cli("report", clip_sweep, "--format", "html", "--out", tmp_path / "site" / "index.html")
    assert r.exit_code == 0, r.output
    html = (tmp_path / "site" / "index.html").read_text(encoding="utf-8")
    assert "<table>" in html and "src='plots/evaluation.png'" in html
    assert (tmp_path / "site" / "plots" / "evaluation.svg").exists()


def test_cli_bad_input_is_one_paragraph_exit_2(cli, tmp_path):
    r = cli("table", tmp_path / "nope")
    assert r.exit_code == 2 and "not a results folder" in r.output and "Traceback" not in r.output
    r = cli("table", tmp_path, "--format", "docx")
    assert r.exit_code == 2


def test_analysis_never_imports_torch_or_the_trainer():
    code = (
        "import sys, analysis, analysis.table, analysis.plot, analysis.report, analysis.results_doc, "
        "harness.cli.analysis; "
        "bad = [m for m in sys.modules if m == 'torch' or m.startswith(('torch.', 'harness.rl.trainer'))]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_code_versions_counts_points_per_version():
    from analysis.table_text import code_versions

    one = pd.DataFrame({"code_version": ["abc1234", "abc1234"]})
    assert code_versions(one) == "abc1234"
    mixed = pd.DataFrame({"code_version": ["abc1234", "abc1234", "def5678", None]})
    assert code_versions(mixed) == "abc1234 (2 points), def5678 (1 point)"
    assert code_versions(pd.DataFrame({"code_version": [None]})) == "unknown"
