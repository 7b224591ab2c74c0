"""The paper table of a sweep: rows = axis values (or combinations), columns = metrics, each cell
statistic +- 95% bootstrap CI over seeds, a difference-to-baseline column with a paired interval,
provenance in the caption and a footer naming every point that is not in the table.

`build_table` computes once (a `Table` of estimates); `render(table, fmt)` prints it as Markdown,
LaTeX (booktabs), HTML or CSV.
"""

from __future__ import annotations

import html
import io
import math
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from analysis.integrity import CORRUPT, FINISHED
from analysis.load import format_value, load_curves, load_results, resolve_metric, short_axis_names
from analysis.stats import CONFIDENCE, N_BOOT, Difference, Estimate, bootstrap_ci, paired_difference

DEFAULT_METRICS = ("final/eval_greedy/success", "best/eval_greedy/success", "collapsed_at", "final/diag/kl_k3")
METRIC_NAMES = {
    "final/eval_greedy/success": "final success",
    "best/eval_greedy/success": "best success",
    "init/eval_greedy/success": "initial success",
    "collapsed_at": "collapse (update)",
    "final/diag/kl_k3": "final KL (k3)",
}
FORMATS = ("markdown", "latex", "csv", "html")


@dataclass
class Entry:
    """One table cell before formatting."""

    kind: str  # metric | collapse | delta | baseline | empty
    est: Estimate | Difference | None = None
    decimals: int = 2
    dagger: bool = False  # fewer seeds than requested
    unpaired: bool = False  # delta interval is unpaired
    below_min: bool = False  # fewer than --min-seeds values: no estimate shown
    collapsed: int = 0  # collapse column: runs that collapsed / finished
    finished: int = 0


@dataclass
class Table:
    name: str
    key_header: list[str]  # axis (and setting) columns
    metric_header: list[str]  # metric columns (+ delta)
    rows: list[tuple[list[str], str, list[Entry]]]  # (key texts, seeds text, entries)
    caption: str
    notes: list[str] = field(default_factory=list)
    provenance: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    data: pd.DataFrame = field(default_factory=pd.DataFrame)
    interval: str = "pm"


def metric_name(m: str) -> str:
    return METRIC_NAMES.get(m, m)


def _decimals(values: list[float]) -> int:
    """Decimals for a column: about three significant digits for its largest magnitude."""
    m = max((abs(v) for v in values if not math.isnan(v)), default=0.0)
    return 0 if m >= 100 else 1 if m >= 10 else 2 if m >= 0.1 or m == 0 else 3 if m >= 0.01 else 4


def _by_seed(rows: pd.DataFrame, values: pd.Series) -> dict[int, float]:
    """{seed: value}; a point without a known seed gets a key no other point shares (never paired)."""
    return {-1 - i if pd.isna(s) else int(s): float(values[i]) for i, s in zip(rows.index, rows["seed"])}


def _seed_text(s) -> str:
    return "" if pd.isna(s) else f" seed {int(s)}"


def _recorded_metrics(
    done: pd.DataFrame, values: dict[str, pd.Series], metrics: list[str], explicit: bool, notes: list[str]
) -> list[str]:
    """Drop default metrics no finished point recorded (explicit ones stay, as dashes); note both."""
    kept = []
    for m in metrics:
        recorded = done["collapse_recorded"].any() if m == "collapsed_at" else values[m][done.index].notna().any()
        if recorded or (explicit and m != "collapsed_at"):
            kept.append(m)
        if not recorded and (explicit or m != "collapsed_at"):
            notes.append(f"Not recorded by any finished point: {m}.")
    return kept


def _metric_entry(rows: pd.DataFrame, v: pd.Series, is_collapse: bool, requested: int, min_seeds: int, **boot) -> Entry:
    est = bootstrap_ci(v[rows.index], **boot)
    if is_collapse:  # NaN = did not collapse: the estimate is over the runs that did
        finished = int(rows["collapse_recorded"].sum())
        return Entry(
            "collapse",
            est,
            collapsed=est.n,
            finished=finished,
            dagger=finished < requested,
            below_min=0 < est.n < min_seeds,
        )
    return Entry("metric", est, dagger=est.n < requested, below_min=0 < est.n < min_seeds)


def build_table(
    results: pd.DataFrame,
    curves: pd.DataFrame | None = None,
    metrics: list[str] | None = None,
    statistic: str = "mean",
    interval: str = "pm",
    min_seeds: int = 1,
    n_boot: int = N_BOOT,
    seed: int = 0,
) -> Table:
    """Estimates for every cell x metric, the delta of the first metric to the baseline, notes."""
    meta = results.attrs["sweep"]
    done = results[results["status"].isin(FINISHED)]
    cells = list(dict.fromkeys(results["cell"]))
    requested = len(meta.seeds) or max((int((results["cell"] == c).sum()) for c in cells), default=0)
    notes: list[str] = []
    wanted = list(metrics or DEFAULT_METRICS)
    values = {m: resolve_metric(results, curves, m) for m in wanted}
    metrics = _recorded_metrics(done, values, wanted, bool(metrics), notes)
    boot = dict(statistic=statistic, n_boot=n_boot, confidence=CONFIDENCE, seed=seed)
    grid: dict[str, dict[str, Entry]] = {c: {} for c in cells}
    for m in metrics:
        for c in cells:
            grid[c][m] = _metric_entry(
                done[done["cell"] == c], values[m], m == "collapsed_at", requested, min_seeds, **boot
            )
        decimals = _decimals([grid[c][m].est.value for c in cells])
        for c in cells:  # an update index needs no more than one decimal
            grid[c][m].decimals = min(decimals, 1) if m == "collapsed_at" else decimals
    columns = list(metrics)
    base = results.loc[results["is_baseline"], "cell"]
    if metrics and len(base):
        columns.append("Δ")
        v, base_rows = values[metrics[0]], done[done["cell"] == base.iloc[0]]
        for c in cells:
            rows = done[done["cell"] == c]
            d = paired_difference(_by_seed(rows, v), _by_seed(base_rows, v), **boot)
            grid[c]["Δ"] = (
                Entry("baseline")
                if c == base.iloc[0]
                else Entry(
                    "delta",
                    d,
                    decimals=grid[c][metrics[0]].decimals,
                    unpaired=d.n > 0 and not d.paired,
                    below_min=0 < d.n < min_seeds,
                )
            )
    return _assemble(results, meta, cells, columns, grid, statistic, interval, min_seeds, requested, n_boot, notes)


def _assemble(results, meta, cells, columns, grid, statistic, interval, min_seeds, requested, n_boot, notes) -> Table:
    """Row texts (axis values, seeds), the CSV frame, notes and caption."""
    short = short_axis_names(meta.axes)
    first = {c: results[results["cell"] == c].iloc[0] for c in cells}
    auto = {
        c: (
            ", ".join(f"{short[a]}={format_value(first[c][a])}" for a in meta.axes)
            if len(meta.axes) > 1
            else format_value(first[c][meta.axes[0]])
            if meta.axes
            else "all"
        )
        for c in cells
    }
    with_setting = not meta.axes or any(first[c]["label"] != auto[c] for c in cells)  # the sweep named its cells
    key_header = (["setting"] if with_setting else []) + [short[a] for a in meta.axes]
    done = results[results["status"].isin(FINISHED)]
    any_corrupt = bool((results["status"] == CORRUPT).any())
    rows, data = [], []
    for c in cells:
        keys = ([first[c]["label"]] if with_setting else []) + [format_value(first[c][a]) for a in meta.axes]
        n_done = int((done["cell"] == c).sum())
        n_corrupt = int(((results["cell"] == c) & (results["status"] == CORRUPT)).sum())
        seeds = f"{n_done}/{requested}" + (f" ({n_corrupt} corrupt)" if n_corrupt else "")
        rows.append((keys, seeds, [grid[c][col] for col in columns]))
        rec = dict(zip(key_header, keys), seeds=n_done, requested=requested, baseline=bool(first[c]["is_baseline"]))
        if any_corrupt:
            rec["corrupt"] = n_corrupt
        for col in columns:
            est, name = grid[c][col].est, "delta" if col == "Δ" else col
            rec.update(
                {
                    name: getattr(est, "value", math.nan),
                    f"{name}:lo": getattr(est, "lo", math.nan),
                    f"{name}:hi": getattr(est, "hi", math.nan),
                    f"{name}:n": getattr(est, "n", 0),
                }
            )
            if col == "Δ":
                rec["delta:paired"] = getattr(est, "paired", None)
        data.append(rec)
    notes = _notes(rows, done, columns, requested, min_seeds, interval, notes)
    caption = _caption(meta, columns, first[cells[0]]["label"] if cells else "?", done, statistic, interval, n_boot)
    header = [metric_name(m) for m in columns if m != "Δ"] + (
        [f"Δ {metric_name(columns[0])}"] if "Δ" in columns else []
    )
    return Table(
        meta.name,
        key_header,
        header,
        rows,
        caption,
        notes,
        _provenance(results, meta),
        missing_lines(results),
        pd.DataFrame(data),
        interval,
    )


def _notes(
    rows, done: pd.DataFrame, columns: list[str], requested: int, min_seeds: int, interval: str, notes: list[str]
) -> list[str]:
    """Footnotes for the marks actually shown, diverged runs, and the collapse column's definition."""
    shown = " ".join(format_entry(e, MD, interval) for _, _, es in rows for e in es)
    head = [f"† fewer than the {requested} requested seeds (see the seeds column)."] if "†" in shown else []
    if "‡" in shown:
        head.append("‡ unpaired interval: the cell's seeds differ from the baseline's.")
    if "(n=" in shown:
        head.append(f"— (n=k): fewer than {min_seeds} seeds (--min-seeds); no estimate shown.")
    if any("corrupt" in seeds for _, seeds, _ in rows):
        head.append(
            "(k corrupt): seeds whose result files are damaged are not counted; `harness check` lists them "
            "and `harness sweep --retry-failed` runs them again."
        )
    diverged = done[done["status"] == "diverged"]
    if len(diverged):
        runs = ", ".join(f"{r['label']}{_seed_text(r['seed'])}" for _, r in diverged.iterrows())
        head.append(f"Diverged runs count as results, with the metrics they had when stopped: {runs}.")
    if "collapsed_at" in columns:
        head.append(
            "collapse (update): mean update at which the collapse detector fired, over the runs "
            "that collapsed (collapsed/finished); never = no run collapsed."
        )
    return head + notes


def _caption(
    meta, columns: list[str], baseline: str, done: pd.DataFrame, statistic: str, interval: str, n_boot: int
) -> str:
    stat = "mean" if statistic == "mean" else "IQM (interquartile mean, rliable)"
    form = "± half-width" if interval == "pm" else "[lo, hi]"
    caption = (
        f"Sweep {meta.name}: {stat} over seeds with a {CONFIDENCE:.0%} percentile bootstrap CI "
        f"({n_boot:,} resamples{', stratified' if statistic == 'iqm' else ''}), shown as {form}."
    )
    if "Δ" in columns:
        caption += (
            f" Δ = difference in {metric_name(columns[0])} to the baseline ({baseline}), paired bootstrap over seeds."
        )
    seeds = ", ".join(str(s) for s in meta.seeds) or "unknown"
    return caption + f" Seeds {seeds}. Code {_code_versions(done)}."


def _code_versions(done: pd.DataFrame) -> str:
    counts = done["code_version"].dropna().value_counts(sort=False)
    if counts.empty:
        return "unknown"
    return ", ".join(f"{v}" if len(counts) == 1 else f"{v} ({n} points)" for v, n in counts.items())


def _provenance(results: pd.DataFrame, meta) -> list[str]:
    done = results[results["status"].isin(FINISHED)]
    lines = [
        f"sweep: {meta.name} ({meta.source}); axes: {', '.join(meta.axes) or 'none'}; "
        f"baseline: {', '.join(f'{k}={format_value(v)}' for k, v in meta.baseline.items()) or 'first point'}"
    ]
    hashes = []
    for label, g in done.groupby("label", sort=False):
        hs = [
            f"{h}" + (f" ({_seed_text(s).strip()})" if _seed_text(s) else "")
            for h, s in zip(g["config_hash"].fillna("?"), g["seed"])
        ]
        hashes.append(f"{label}: {', '.join(hs)}")
    if hashes:
        lines.append("config hashes: " + "; ".join(hashes))
    lines.append(f"code versions: {_code_versions(done)}")
    pkgs = done["packages"].dropna().unique()
    if len(pkgs) > 1:
        lines.append(f"package versions differ across points ({len(pkgs)} distinct sets)")
    cpus = done["cpu"].dropna().unique() if "cpu" in done else []
    if len(cpus) > 1:  # other kernels give other floating-point bits (README, determinism)
        lines.append(f"points ran on {len(cpus)} different CPU code paths: their runs are not bit-comparable")
    return lines


def missing_lines(results: pd.DataFrame) -> list[str]:
    """Every point not in the table, with its status and why, plus sweep-level problems."""
    meta = results.attrs["sweep"]
    out = [f"sweep: {p}" for p in meta.problems]
    for _, r in results[~results["status"].isin(FINISHED)].iterrows():
        why = f": {str(r['error']).splitlines()[0][:120]}" if isinstance(r.get("error"), str) and r["error"] else ""
        probs = f" ({r['problems']})" if r["problems"] else ""
        out.append(f"{r['label']}{_seed_text(r['seed'])} [{r['point']}]: {r['status']}{why}{probs}")
    return out


# ----------------------------------------------------------------------------- formatting
@dataclass(frozen=True)
class Style:
    pm: str = " ± "
    dagger: str = "†"
    ddagger: str = "‡"
    dash: str = "—"
    math: str = ""  # delimiter around numbers ("$" in LaTeX)
    escape: object = staticmethod(lambda s: s)


def latex_escape(s: str) -> str:
    repl = {
        "\\": r"\textbackslash{}",
        "&": r"\&",
        "%": r"\%",
        "$": r"\$",
        "#": r"\#",
        "_": r"\_",
        "{": r"\{",
        "}": r"\}",
        "~": r"\textasciitilde{}",
        "^": r"\textasciicircum{}",
        "Δ": r"$\Delta$",
        "—": "---",
        "±": r"$\pm$",
        "†": r"$^\dagger$",
        "‡": r"$^\ddagger$",
    }
    return "".join(repl.get(ch, ch) for ch in s)


MD = Style()
LATEX = Style(pm=r" \pm ", dagger=r"^{\dagger}", ddagger=r"^{\ddagger}", dash="---", math="$", escape=latex_escape)


def format_entry(e: Entry, style: Style = MD, interval: str = "pm") -> str:
    if e.kind == "baseline":
        return "baseline"
    est = e.est
    marks = (style.dagger if e.dagger else "") + (style.ddagger if e.unpaired else "")
    if est is None or est.n == 0:
        if e.kind == "collapse" and e.finished:
            return "never" + (f"{style.math}{marks}{style.math}" if marks else "") + f" (0/{e.finished})"
        return style.dash
    if e.below_min:
        return f"{style.dash} (n={est.n})"
    f = (lambda x: f"{x:+.{e.decimals}f}") if e.kind == "delta" else (lambda x: f"{x:.{e.decimals}f}")
    core = f(est.value)
    if not math.isnan(est.lo):
        g = lambda x: f"{x:.{e.decimals}f}"  # noqa: E731
        core += (
            f" [{g(est.lo)}, {g(est.hi)}]"
            if e.kind == "delta" or interval == "bracket"
            else f"{style.pm}{g(est.half_width)}"
        )
    text = f"{style.math}{core}{marks}{style.math}"
    return text + (f" ({e.collapsed}/{e.finished})" if e.kind == "collapse" else "")


def _cells(table: Table, style: Style) -> tuple[list[str], list[list[str]]]:
    header = [style.escape(h) for h in table.key_header + ["seeds"] + table.metric_header]
    body = [
        [style.escape(k) for k in keys] + [seeds] + [format_entry(e, style, table.interval) for e in es]
        for keys, seeds, es in table.rows
    ]
    return header, body


def to_markdown(table: Table, footer: bool = True) -> str:
    """Pandoc-style caption, the pipe table, notes; with `footer`, provenance and missing points too."""
    header, body = _cells(table, MD)
    esc = lambda s: s.replace("|", r"\|")  # noqa: E731
    nk = len(table.key_header)
    lines = [
        f"Table: {table.caption}",
        "",
        "| " + " | ".join(map(esc, header)) + " |",
        "| " + " | ".join([":--"] * nk + ["--:"] * (len(header) - nk)) + " |",
    ]
    lines += ["| " + " | ".join(map(esc, row)) + " |" for row in body]
    sections = [("Notes", table.notes)]
    if footer:
        sections += [("Provenance", table.provenance), (f"Missing or unfinished ({len(table.missing)})", table.missing)]
    for title, items in sections:
        if items:
            lines += ["", f"{title}:"] + [f"- {i}" for i in items]
    return "\n".join(lines) + "\n"


def to_latex(table: Table) -> str:
    header, body = _cells(table, LATEX)
    nk = len(table.key_header)
    label = "".join(ch if ch.isalnum() else "-" for ch in table.name)
    out = [f"% harness table: sweep {table.name}"] + [f"% {p}" for p in table.provenance]
    out += [
        r"\begin{table}[t]",
        r"  \centering",
        rf"  \caption{{{latex_escape(table.caption)}}}",
        rf"  \label{{tab:{label}}}",
        rf"  \begin{{tabular}}{{{'l' * nk}{'r' * (len(header) - nk)}}}",
        r"    \toprule",
        "    " + " & ".join(header) + r" \\",
        r"    \midrule",
    ]
    out += ["    " + " & ".join(row) + r" \\" for row in body]
    out += [r"    \bottomrule", r"  \end{tabular}"]
    foot = [latex_escape(n) for n in table.notes]
    if table.missing:
        foot.append(latex_escape(f"Not in the table: {'; '.join(table.missing)}."))
    if foot:
        out += [r"  \par\smallskip", r"  {\footnotesize " + r" \\ ".join(foot) + "}"]
    out.append(r"\end{table}")
    return "\n".join(out) + "\n"


def to_html(table: Table) -> str:
    header, body = _cells(table, MD)
    e = html.escape
    rows = "".join("<tr>" + "".join(f"<td>{e(c)}</td>" for c in r) + "</tr>\n" for r in body)
    notes = "".join(f"<p class='note'>{e(n)}</p>\n" for n in table.notes)
    return (
        f"<table>\n<caption>{e(table.caption)}</caption>\n<thead><tr>"
        + "".join(f"<th>{e(h)}</th>" for h in header)
        + f"</tr></thead>\n<tbody>\n{rows}</tbody>\n</table>\n"
        + notes
    )


def to_csv(table: Table) -> str:
    buf = io.StringIO()
    table.data.to_csv(buf, index=False, lineterminator="\n")
    return buf.getvalue()


def render(table: Table, fmt: str = "markdown") -> str:
    fmt = {"md": "markdown", "tex": "latex"}.get(fmt, fmt)
    renderers = {"markdown": to_markdown, "latex": to_latex, "csv": to_csv, "html": to_html}
    if fmt not in renderers:
        raise ValueError(f"table format {fmt!r}: expected one of {', '.join(FORMATS)}")
    return renderers[fmt](table)


def table_for(path: str | Path, metrics: list[str] | None = None, **kw) -> Table:
    """Load a results folder and build its table (curves are read only when a metric needs them)."""
    results = load_results(path)
    wanted = list(metrics or DEFAULT_METRICS)
    curves = None
    if any(m not in results.columns for m in wanted):
        bases = [m.partition("/")[2] for m in wanted if m not in results.columns]
        curves = load_curves(path, results, metrics=[b for b in bases if b])
    return build_table(results, curves, metrics, **kw)
