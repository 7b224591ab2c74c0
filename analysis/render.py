"""Print a `Table` (analysis.table) as Markdown, LaTeX (booktabs), HTML or CSV.

Under the table, in this order: the summary lines (minimum detectable effect, warnings), the
notes (marks, definitions), and, in Markdown with `footer`, provenance and missing points.
"""

from __future__ import annotations

import html
import io
import math
from dataclasses import dataclass

FORMATS = ("markdown", "latex", "csv", "html")


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
        "×": r"$\times$",
        "σ": r"$\sigma$",
        "≈": r"$\approx$",
        "α": r"$\alpha$",
    }
    return "".join(repl.get(ch, ch) for ch in s)


MD = Style()
LATEX = Style(pm=r" \pm ", dagger=r"^{\dagger}", ddagger=r"^{\ddagger}", dash="---", math="$", escape=latex_escape)


def format_entry(e, style: Style = MD, interval: str = "pm") -> str:
    """One cell: estimate ± half-width (or [lo, hi]; differences always [lo, hi]) with marks; an
    estimate without spread says "(degenerate)" instead of a zero-width interval."""
    if e.kind == "baseline":
        return "baseline"
    if e.kind == "text":
        return style.escape(e.text) if e.text else style.dash
    est = e.est
    marks = (style.dagger if e.dagger else "") + (style.ddagger if e.unpaired else "")
    if est is None or est.n == 0:
        if e.kind == "collapse" and e.finished:
            return "never" + (f"{style.math}{marks}{style.math}" if marks else "") + f" (0/{e.finished})"
        return style.dash
    if e.kind == "collapse":
        return f"{style.math}{style.escape(e.text)}{marks}{style.math} ({e.collapsed}/{e.finished})"
    if e.below_min:
        return f"{style.dash} (n={est.n})"
    dec = e.decimals
    while not est.degenerate and dec < 4 and 0 < est.half_width < 0.5 * 10**-dec:  # a narrow interval never
        dec += 1  # reads as "[0.00, 0.00]": one more decimal until its width shows
    f = (lambda x: f"{x:+.{dec}f}") if e.kind == "delta" else (lambda x: f"{x:.{dec}f}")
    core = f(est.value)
    if est.degenerate:  # no spread: the value alone, flagged, never an interval of zero width
        core += " (degenerate)"
    elif not math.isnan(est.lo):
        g = lambda x: f"{x:.{dec}f}"  # noqa: E731
        core += (
            f" [{g(est.lo)}, {g(est.hi)}]"
            if e.kind == "delta" or interval == "bracket"
            else f"{style.pm}{g(est.half_width)}"
        )
    text = f"{style.math}{core}{marks}{style.math}"
    return text + (f" ({e.collapsed}/{e.finished})" if e.kind == "collapse" else "")


def _cells(table, style: Style) -> tuple[list[str], list[list[str]]]:
    header = [style.escape(h) for h in table.key_header + ["seeds"] + table.metric_header]
    body = [
        [style.escape(k) for k in keys] + [seeds] + [format_entry(e, style, table.interval) for e in es]
        for keys, seeds, es in table.rows
    ]
    return header, body


def to_markdown(table, footer: bool = True, shared_legend: bool = False) -> str:
    """Pandoc-style caption, the pipe table, summary lines, notes; with `footer`, provenance and
    missing points too. `shared_legend`: the page states `table.legend` once (docs/results.md), so
    the caption is the short one and the notes leave out what the legend says."""
    header, body = _cells(table, MD)
    esc = lambda s: s.replace("|", r"\|")  # noqa: E731
    nk = len(table.key_header)
    lines = [
        f"Table: {table.short_caption if shared_legend else table.caption}",
        "",
        "| " + " | ".join(map(esc, header)) + " |",
        "| " + " | ".join([":--"] * nk + ["--:"] * (len(header) - nk)) + " |",
    ]
    lines += ["| " + " | ".join(map(esc, row)) + " |" for row in body]
    if table.summary:
        lines += [""] + table.summary
    notes = [n for n in table.notes if not shared_legend or n not in table.legend]
    sections = [("Notes", notes)]
    if footer:
        sections += [("Provenance", table.provenance), (f"Missing or unfinished ({len(table.missing)})", table.missing)]
    for title, items in sections:
        if items:
            lines += ["", f"{title}:"] + [f"- {i}" for i in items]
    return "\n".join(lines) + "\n"


def to_latex(table) -> str:
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
    foot = [latex_escape(n) for n in table.summary + table.notes]
    if table.missing:
        foot.append(latex_escape(f"Not in the table: {'; '.join(table.missing)}."))
    if foot:
        out += [r"  \par\smallskip", r"  {\footnotesize " + r" \\ ".join(foot) + "}"]
    out.append(r"\end{table}")
    return "\n".join(out) + "\n"


def to_html(table) -> str:
    header, body = _cells(table, MD)
    e = html.escape
    rows = "".join("<tr>" + "".join(f"<td>{e(c)}</td>" for c in r) + "</tr>\n" for r in body)
    notes = "".join(f"<p class='note'>{e(n)}</p>\n" for n in table.summary + table.notes)
    return (
        f"<table>\n<caption>{e(table.caption)}</caption>\n<thead><tr>"
        + "".join(f"<th>{e(h)}</th>" for h in header)
        + f"</tr></thead>\n<tbody>\n{rows}</tbody>\n</table>\n"
        + notes
    )


def to_csv(table) -> str:
    buf = io.StringIO()
    table.data.to_csv(buf, index=False, lineterminator="\n")
    return buf.getvalue()


def render(table, fmt: str = "markdown") -> str:
    fmt = {"md": "markdown", "tex": "latex"}.get(fmt, fmt)
    renderers = {"markdown": to_markdown, "latex": to_latex, "csv": to_csv, "html": to_html}
    if fmt not in renderers:
        raise ValueError(f"table format {fmt!r}: expected one of {', '.join(FORMATS)}")
    return renderers[fmt](table)
