"""One page per sweep (Markdown or HTML): status of every point, the table, the figures (relative
links), provenance and what is missing. Written next to the results by default:
<results>/report.md (or .html) with figures under <results>/plots/.
"""

from __future__ import annotations

import html
import os
from pathlib import Path

import pandas as pd

from analysis.load import AnalysisError, load_results
from analysis.plot import make_plots
from analysis.render import to_html, to_markdown
from analysis.table import Table, table_for
from harness.store import CORRUPT, FINISHED

REPORT_FORMATS = ("md", "html")


def _counts(rows: pd.DataFrame) -> tuple[int, str]:
    counts = rows["status"].value_counts()
    done = int(counts[counts.index.isin(FINISHED)].sum())
    known = [*FINISHED, "running", "failed", "pruned", CORRUPT, "missing", "partial"]
    order = sorted(counts.index, key=lambda s: (known.index(s) if s in known else len(known), s))
    return done, ", ".join(f"{counts[s]} {s}" for s in order)


def status_line(results: pd.DataFrame) -> str:
    """How many of the sweep's points finished; points of other base configs are counted apart."""
    own = results[results["config_group"] == ""]
    done, parts = _counts(own)
    line = f"{done} of {len(own)} points finished ({parts})."
    others = results[results["config_group"] != ""]
    if len(others):
        groups = "; ".join(f"{g}: {_counts(rows)[1]}" for g, rows in others.groupby("config_group", sort=False))
        line = (
            f"{done} of {len(own)} points of this sweep's config finished ({parts}). The folder also holds "
            f"{len(others)} points of other base configs ({groups}); they have rows of their own and are never "
            f"pooled with the sweep's points."
        )
    return line


def _sections(
    path: Path, out: Path, table: Table, figures: dict[str, list[Path]] | str, results: pd.DataFrame, fmt: str
) -> list[tuple[str, str, list[str], list[tuple[str, str]]]]:
    """(title, body in the page's format, list items, figures as (name, relative PNG path)) per section.
    `figures` is a reason string when there are none."""
    meta = results.attrs["sweep"]
    table_text = to_markdown(table, footer=False) if fmt == "md" else to_html(table)
    images = (
        []
        if isinstance(figures, str)
        else [(name, Path(os.path.relpath(paths[0], out.parent)).as_posix()) for name, paths in figures.items()]
    )
    pkgs = results.loc[results["status"].isin(FINISHED), "packages"].dropna().unique()
    packages = (
        [f"packages: {pkgs[0]}"]
        if len(pkgs) == 1
        else [f"packages: {len(pkgs)} distinct sets across points"]
        if len(pkgs)
        else []
    )
    return [
        ("Status", status_line(results), [], []),
        ("Table", table_text, [], []),
        ("Figures", figures if isinstance(figures, str) else "", [], images),
        (
            "Provenance",
            f"Results folder: {path}. Sweep definition from {meta.source}.",
            table.provenance + packages,
            [],
        ),
        (
            "Missing or unfinished",
            "" if table.missing else "Nothing: every requested point finished.",
            table.missing,
            [],
        ),
    ]


def _markdown(title: str, sections) -> str:
    lines = [f"# {title}", ""]
    for name, body, items, figures in sections:
        lines += [f"## {name}", ""]
        if body:
            lines += [body.rstrip(), ""]
        for fig, rel in figures:
            lines += [f"![{fig}]({rel})", f"([SVG]({Path(rel).with_suffix('.svg').as_posix()}))", ""]
        lines += [f"- {it}" for it in items] + ([""] if items else [])
    return "\n".join(lines).rstrip() + "\n"


def _html(title: str, sections) -> str:
    e = html.escape
    parts = [
        f"<!doctype html>\n<html><head><meta charset='utf-8'><title>{e(title)}</title>",
        "<style>body{font-family:sans-serif;max-width:1100px;margin:auto}table{border-collapse:collapse}"
        "td,th{padding:2px 8px;border-bottom:1px solid #ccc;text-align:right}"
        "td:first-child,th:first-child{text-align:left}caption{caption-side:bottom;text-align:left;"
        "font-size:small}img{max-width:100%}</style></head><body>",
        f"<h1>{e(title)}</h1>",
    ]
    for name, body, items, figures in sections:
        parts.append(f"<h2>{e(name)}</h2>")
        if body:
            parts.append(body if body.lstrip().startswith("<table") else f"<p>{e(body)}</p>")
        for fig, rel in figures:
            parts.append(
                f"<figure><img src='{e(rel)}' alt='{e(fig)}'><figcaption>{e(fig)} "
                f"(<a href='{e(Path(rel).with_suffix('.svg').as_posix())}'>SVG</a>)</figcaption></figure>"
            )
        if items:
            parts.append("<ul>" + "".join(f"<li>{e(it)}</li>" for it in items) + "</ul>")
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def write_report(
    path: str | Path, fmt: str = "md", out: str | Path | None = None, metrics: list[str] | None = None, **table_kw
) -> Path:
    """Write the report page (default <results>/report.<fmt>) and its figures (<page dir>/plots/)."""
    if fmt not in REPORT_FORMATS:
        raise ValueError(f"report format {fmt!r}: expected one of {', '.join(REPORT_FORMATS)}")
    path = Path(path)
    out = Path(out) if out else path / f"report.{fmt}"
    results = load_results(path)
    table = table_for(path, metrics, **table_kw)
    try:
        figures: dict[str, list[Path]] | str = make_plots(path, out_dir=out.parent / "plots")
    except AnalysisError as e:  # nothing logged yet: the page still reports status and what is missing
        figures = f"No figures: {e}"
    title = f"Sweep {results.attrs['sweep'].name}: report"
    sections = _sections(path, out, table, figures, results, fmt)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(_markdown(title, sections) if fmt == "md" else _html(title, sections), encoding="utf-8")
    return out
