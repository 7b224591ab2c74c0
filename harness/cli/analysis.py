"""`harness table`, `plot`, `report`: a results folder -> paper table, figures, page;
`harness results-doc`: a results root -> docs/results.md;
`harness check`: which points of a results folder hold damaged files;
`harness diagnose`: which diagnostics predict the outcome, over any number of results folders;
`harness calibrate`: the false-verdict rate of the table's rule, measured on an A/A sweep;
`harness records pack`: a sweep's records in one compact file that every command above reads.

Plain functions plus `register(app)`, which `harness.cli.main` calls.
`analysis` (pandas, seaborn) is imported inside the commands, keeping `harness --help` fast.
Bad input (not a results folder, unknown metric or format) is one paragraph on stderr, exit 2.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from enum import Enum
from functools import wraps
from pathlib import Path
from typing import Annotated, Any

import typer


class TableFormat(str, Enum):
    markdown = "markdown"
    latex = "latex"
    csv = "csv"
    html = "html"


class Interval(str, Enum):
    pm = "pm"
    bracket = "bracket"


class ReportFormat(str, Enum):
    md = "md"
    html = "html"


ResultsArg = Annotated[Path, typer.Argument(help="Results folder of one sweep, e.g. results/clipping.")]
MetricOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--metric",
        "-m",
        help="Metric to show; repeatable. Summary metrics (final/…, best/…, init/…, collapsed_at) "
        "or final/<m>, best/<m>, init/<m> of any metric in metrics.jsonl (in `table`, a bare metrics.jsonl key "
        "means final/<key>, as in a sweep file's metric:); the table's first metric gets the "
        "start, final, gain and Δ columns. Table default: final/eval_greedy/success, collapsed_at, "
        "final/diag/kl_k3; plot default: one figure per metric family.",
    ),
]


def _friendly(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Turn an AnalysisError (bad folder, unknown metric) into one paragraph on stderr, exit status 2."""

    @wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from analysis.load import AnalysisError

        try:
            return fn(*args, **kwargs)
        except AnalysisError as e:
            print(f"error: {e}", file=sys.stderr)
            raise typer.Exit(2) from None

    return wrapper


def _positive(value: float | None) -> float | None:
    if value is not None and not value > 0:
        raise typer.BadParameter(f"{value:g} is not a margin: give a positive number in the metric's units, e.g. 0.05")
    return value


@_friendly
def table(
    results: ResultsArg,
    metric: MetricOpt = None,
    format: Annotated[TableFormat, typer.Option("--format", "-f", help="Output format.")] = TableFormat.markdown,
    out: Annotated[Path | None, typer.Option("--out", "-o", help="Write to this file instead of stdout.")] = None,
    min_seeds: Annotated[
        int,
        typer.Option("--min-seeds", min=1, help="Cells with fewer finished seeds show no estimate, only their count."),
    ] = 1,
    interval: Annotated[
        Interval,
        typer.Option("--interval", help="pm: mean ± CI half-width; bracket: mean followed by the interval's two ends."),
    ] = Interval.pm,
    margin: Annotated[
        float | None,
        typer.Option(
            "--margin",
            callback=_positive,
            help="Equivalence margin of the verdict column, in the metric's units (default: the sweep file's "
            "equivalence_margin, else 0.05).",
        ),
    ] = None,
    components: Annotated[
        bool,
        typer.Option(
            "--components",
            help="Under a markdown table: each paired Δ's variance components (seed, task, residual), the "
            "half-width at twice the seeds or tasks, and the Δ's interval without pairing by task or by seed.",
        ),
    ] = False,
) -> None:
    """Paper table: start, final, gain, Δ to the baseline (paired over seeds x tasks) and its verdict
    (Holm across the table's contrasts, equivalence within a margin), cost, MDE."""
    from analysis.table import render, table_for

    if components and format is not TableFormat.markdown:
        raise typer.BadParameter(f"--components prints a markdown section; drop --format {format.value} or it")
    t = table_for(results, metric or None, interval=interval.value, min_seeds=min_seeds, margin=margin)
    text = render(t, format.value)
    if components:
        from analysis.components import contrasts, report_lines

        lead, found = contrasts(results, (metric or [None])[0])
        text += "\n" + "\n".join(report_lines(found, lead)) + "\n"
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text, encoding="utf-8")
        print(f"wrote {out}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    if out or format is not TableFormat.markdown:  # else the lines under the table on stdout already say it
        for w in t.warnings:
            print(w, file=sys.stderr)
    if t.missing and (out or format is TableFormat.csv):  # else the footer on stdout already says it
        print("not in the table:\n  " + "\n  ".join(t.missing), file=sys.stderr)


@_friendly
def plot(
    results: ResultsArg,
    metric: MetricOpt = None,
    out: Annotated[
        Path | None, typer.Option("--out", "-o", help="Folder for the figures (default <results>/plots).")
    ] = None,
) -> None:
    """One figure per metric family (evaluation vs updates, episodes, tokens; training; diagnostics)."""
    from analysis.plot import make_plots

    for paths in make_plots(results, metric or None, out).values():
        for p in paths:
            print(p)


@_friendly
def report(
    results: ResultsArg,
    format: Annotated[ReportFormat, typer.Option("--format", "-f", help="Page format.")] = ReportFormat.md,
    out: Annotated[
        Path | None,
        typer.Option(
            "--out", "-o", help="Page path (default <results>/report.md or .html); figures go next to it in plots/."
        ),
    ] = None,
    metric: MetricOpt = None,
) -> None:
    """One page: status of every point, the table, the figures, provenance and what is missing."""
    from analysis.report import write_report

    print(write_report(results, format.value, out, metric or None))


@_friendly
def results_doc(
    results: Annotated[Path, typer.Argument(help="Results root holding one folder per sweep, e.g. results.")],
    out: Annotated[Path, typer.Option("--out", "-o", help="The page to write.")] = Path("docs/results.md"),
    sweeps: Annotated[Path, typer.Option("--sweeps", help="Folder of the shipped sweep files.")] = Path("sweeps"),
    figures: Annotated[
        Path | None, typer.Option("--figures", help="Folder for the PNGs (default <out dir>/figures/<sweep>/).")
    ] = None,
    notes: Annotated[
        Path | None,
        typer.Option("--notes", help="Hand-written notes, <sweep>.md each (default <out dir>/results_notes/)."),
    ] = None,
    keep: Annotated[
        bool,
        typer.Option(
            "--keep/--no-keep",
            help="A sweep with no folder under RESULTS keeps its section (and findings rows) of the page being "
            "replaced, marked as kept, so sweeps can be re-run one at a time; --no-keep writes 'Not run yet'.",
        ),
    ] = True,
) -> None:
    """Regenerate docs/results.md: every shipped sweep's table, figures, command, seeds and code
    version, with its hand-written notes included verbatim."""
    from analysis.results_doc import write_results_doc

    print(write_results_doc(results, out, sweeps, figures, notes, keep))


def check(
    results: Annotated[
        Path, typer.Argument(help="A sweep's results folder (results/clipping) or a results root holding several.")
    ],
) -> None:
    """List the points whose result files are damaged; exit 1 when there are any, else 0.

    A damaged point (unreadable status, garbage summary.json or config.yaml, a cut or garbage
    metrics.jsonl line, a row count that differs from what summary.json records) is never counted
    by table, plot or report; `harness sweep FILE --retry-failed` runs it again."""
    from analysis.integrity import check_sweep, point_dirs, sweep_folders

    if not results.is_dir():
        print(
            f"error: {results} is not a results folder: expected a directory written by `harness sweep`.",
            file=sys.stderr,
        )
        raise typer.Exit(2)
    folders, damaged = sweep_folders(results), 0
    if not folders:
        print(f"error: {results} holds no sweep folders and no point folders.", file=sys.stderr)
        raise typer.Exit(2)
    for folder in folders:
        corrupt = check_sweep(folder)
        damaged += len(corrupt)
        print(f"{folder}: {len(point_dirs(folder))} points, {len(corrupt) or 'none'} corrupt")
        for c in corrupt:
            print(f"  {c.path.name}: {'; '.join(c.problems)}")
    if damaged:
        print("Tables, plots and reports leave these out; `harness sweep FILE --retry-failed` runs them again.")
        raise typer.Exit(1)


class Outcome(str, Enum):
    sampled = "sampled"
    greedy = "greedy"


@_friendly
def diagnose(
    results: Annotated[
        list[Path],
        typer.Argument(help="Results folders of sweeps or records packs (<sweep>.records.jsonl.gz), any number."),
    ],
    outcome: Annotated[
        Outcome, typer.Option("--outcome", help="Held-out success of which decoding: the outcome and the collapse.")
    ] = Outcome.sampled,
    figure: Annotated[
        Path, typer.Option("--figure", help="Where to draw the figure (ρ and AUROC per diagnostic with intervals).")
    ] = Path("diagnose.png"),
    reps: Annotated[int, typer.Option("--reps", min=100, help="Bootstrap draws.")] = 1000,
) -> None:
    """Which logged diagnostics, read over the first 25% and 10% of updates, predict the final held-out
    success (Spearman ρ, R² added beside the start) and a collapse (AUROC), with 95% intervals from a
    bootstrap clustered by sweep and a leave-one-sweep-out check; the papers' claims as verdict rows."""
    from analysis.diagnose_page import diagnose as run
    from analysis.diagnose_page import save_figure, text_lines

    dx = run(results, outcome.value, reps)
    sys.stdout.write("\n".join(text_lines(dx)) + "\n")
    print(f"wrote {save_figure(dx, figure)}", file=sys.stderr)


@_friendly
def calibrate(
    results: Annotated[Path, typer.Argument(help="Results folder of an A/A sweep, e.g. results/aa_calibration.")],
    seeds: Annotated[
        str,
        typer.Option("--seeds", help="Seeds per arm of the pseudo-sweeps, comma-separated (those <= the seeds run)."),
    ] = "3,5,10",
    draws: Annotated[int, typer.Option("--draws", min=50, help="Pseudo-sweeps per seed count.")] = 2000,
    seed: Annotated[int, typer.Option("--seed", min=0, help="Seed of the draws (the output is deterministic).")] = 0,
    metric: Annotated[
        str | None, typer.Option("--metric", "-m", help="A final held-out metric (default: the sweep's own).")
    ] = None,
) -> None:
    """The harness's false better / worse rate on a sweep whose arms change nothing (sweeps/aa_calibration.yaml):
    pseudo-sweeps of k seeds drawn from its runs through the table's verdict code and the seed budget's looks,
    with 95% intervals over the runs, and the spread that float rounding alone induces between runs of one seed."""
    from analysis.calibration import calibrate as run
    from analysis.calibration_text import finding, markdown
    from analysis.load import AnalysisError

    try:
        counts = tuple(int(x) for x in seeds.split(",") if x.strip())
    except ValueError:
        raise AnalysisError(f"--seeds {seeds!r}: give whole numbers separated by commas, e.g. 3,5,10.") from None
    if metric is not None and not metric.startswith("final/"):  # a metrics.jsonl key means its final value
        metric = f"final/{metric}"
    cal = run(results, counts, draws, seed, metric)
    sys.stdout.write("\n".join(markdown(cal) + [finding(cal)]) + "\n")


records_app = typer.Typer(no_args_is_help=True, help="A sweep's per-point records in one compact file.")


@records_app.command("pack")
@_friendly
def pack(
    results: Annotated[list[Path], typer.Argument(help="Results folders of sweeps, e.g. results/clipping.")],
    out: Annotated[
        Path | None, typer.Option("--out", "-o", help="The pack (one folder only; default <folder>.records.jsonl.gz).")
    ] = None,
) -> None:
    """Write <sweep>.records.jsonl.gz beside each folder: the files that tables, figures, docs/results.md and
    `harness diagnose` read (configs, per-update metrics, per-task evaluations, summaries), which all of
    them then read in place of the folder. Checkpoints, adapters and sampled episode texts stay out."""
    from analysis.load import AnalysisError
    from analysis.records import pack as write

    if out is not None and len(results) != 1:
        raise AnalysisError("--out names one pack: give one results folder with it.")
    for folder in results:
        print(write(folder, out))


def register(app: typer.Typer) -> None:
    """Add `table`, `plot`, `report`, `results-doc`, `check`, `diagnose`, `calibrate` and `records` to the CLI."""
    app.command("table")(table)
    app.command("plot")(plot)
    app.command("report")(report)
    app.command("results-doc")(results_doc)
    app.command("check")(check)
    app.command("diagnose")(diagnose)
    app.command("calibrate")(calibrate)
    app.add_typer(records_app, name="records")
