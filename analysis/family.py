"""One family for the whole results page: every published contrast's tests, Holm-corrected together.

A table's verdicts are corrected within the table (analysis.intervals.verdicts: Holm across its
difference tests; the equivalence tests uncorrected). The page states many tables' verdicts at once,
so it also shows each verdict under one correction across everything it publishes:

- the family: for every contrast of the findings table (a Δ or a gain), its difference test
  (two-sided p of Δ = 0) and its equivalence test (TOST: p = the larger of the two one-sided p's of
  Δ <= -margin and Δ >= margin, the test whose 5% level is the 90% interval inside ±margin), and for
  every row of the transfer table its size test (two-sided p of the two models' Δs being equal);
- the correction: Holm (1979) at family-wise error 0.05, like the tables. Holm holds under any
  dependence between the tests, and these are dependent (sweeps share baseline runs; a contrast's
  difference and equivalence tests use the same interval); Benjamini-Hochberg's false-discovery
  control needs positive dependence, which two-sided and equivalence tests of one contrast lack;
- the page-level verdict: the table's verdict where the test behind it (the difference test for
  better / worse / higher / lower, the equivalence test for equivalent) survives the page-wide
  correction, else undetermined. Holm's adjusted p-values only grow with the family, so a verdict can
  only weaken.

A contrast is read from its interval (value, se, df). A section kept from the previous page
(analysis.results_doc) has only its printed text, Δ [95% CI] rounded to 0.01, unless its section
holds the exact numbers in a hidden line (`EXACT`, written with every table since); from the text
the interval is approximate (`from_text`), and so are its p-values, marked ≈ on the page.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, replace

from scipy import stats

from analysis.intervals import DIRECTIONS, FAMILY_ALPHA, Interval, holm_adjusted

# A hidden line in every section with results: its contrasts' cells and exact (value, se, df, seeds), in the
# order of its findings rows, so that a kept section still enters the page-wide correction with exact p-values.
EXACT = "<!-- contrasts (cell, value, se, df, seeds) for the page-wide correction: {} -->"
_EXACT = re.compile(r"^<!-- contrasts \(cell, value, se, df, seeds\) for the page-wide correction: (.+) -->$")
# "Δ -0.05 [-0.17, 0.07]", "gain +0.06 [-0.05, 0.17]", "+0.01 [-0.11, 0.12]" (the transfer size column)
# a kept contrast whose verdict survives the page-wide correction with some of the df it may have had, not all
UNRESOLVED = "unresolved"
_CI = re.compile(r"^(?:(?:Δ|gain) )?([+-]?\d+\.\d+) \[(-?\d+\.\d+), (-?\d+\.\d+)\]")


@dataclass
class Contrast:
    """One published contrast and its tests; `margin` None: no equivalence test (a size difference)."""

    interval: Interval | None
    verdict: str  # the table's verdict
    margin: float | None
    approximate: bool = False  # read from rounded text (from_text)
    df_hi: float = math.nan  # approximate: the most df it may have had (its sweep's design df), for the range
    p_diff: float = math.nan
    p_equiv: float = math.nan
    adj_diff: float = math.nan  # Holm-adjusted across the page's family (approximate: the largest)
    adj_equiv: float = math.nan
    adj_diff_lo: float = math.nan  # the smallest they can be (approximate contrasts), else the same
    adj_equiv_lo: float = math.nan
    page: str = ""  # the page-level verdict


def tost_p(iv: Interval, margin: float) -> float:
    """The p-value of the two one-sided tests of |Δ| >= margin (Schuirmann 1987): the larger of
    P(T >= (v + margin) / se) and P(T >= (margin - v) / se), T ~ t(df). Below 0.05 exactly when the
    90% interval lies inside (-margin, margin)."""
    if iv.n < 2 or not math.isfinite(iv.se) or not math.isfinite(iv.value) or iv.se == 0.0:
        return math.nan
    lower = stats.t.sf((iv.value + margin) / iv.se, iv.df)  # H0: Δ <= -margin
    upper = stats.t.sf((margin - iv.value) / iv.se, iv.df)  # H0: Δ >= +margin
    return float(max(lower, upper))


def from_text(text: str, n: int) -> Interval | None:
    """The interval behind a printed 'Δ v [lo, hi]' (95%, rounded to 0.01), approximately: the value is
    the mean of the printed value and the bounds' midpoint (each rounded), se = half-width / t(.975, df)
    with df = n - 1 (the df of the intervals while the seed term dominates; a contrast whose task term
    dominated had more, so its p-value here is too large where the interval excludes 0). None for a
    text without an interval (degenerate, one seed)."""
    m = _CI.match(text.strip())
    if m is None or n < 2:
        return None
    value, lo, hi = (float(g) for g in m.groups())
    df = n - 1
    se = (hi - lo) / 2 / float(stats.t.ppf(0.975, df))
    return Interval((value + (lo + hi) / 2) / 2, se, df, n, 1)


def exact_line(cells: list[tuple[str, Interval]]) -> str:
    """The hidden line of a section's exact contrasts (EXACT): each its cell's label and interval."""
    return EXACT.format(json.dumps([[c, iv.value, iv.se, iv.df, iv.n] for c, iv in cells], ensure_ascii=False))


def read_exact(lines: list[str], n_rows: int) -> list[tuple[str, Interval]] | None:
    """The labelled exact intervals of a kept section's hidden line, when it has one per findings row."""
    for line in lines:
        if m := _EXACT.match(line):
            raw = json.loads(m[1])
            if len(raw) == n_rows:
                return [(c, Interval(v, se, df, n, 1)) for c, v, se, df, n in raw]
    return None


_DESIGN_DF = re.compile(r"^Minimum detectable effect .*\(t, ([0-9.e+]+) df\)")


def design_df(lines: list[str]) -> float:
    """The df of a section's first minimum-detectable-effect line (its lead table's design), else NaN."""
    for line in lines:
        if m := _DESIGN_DF.match(line):
            return float(m[1])
    return math.nan


def seeds_of(lines: list[str]) -> int:
    """The number of seeds a section's '- Seeds: 0, 1, 2' line names (0 when absent)."""
    line = next((x for x in lines if x.startswith("- Seeds: ")), "")
    return len([s for s in line[len("- Seeds: ") :].split(",") if s.strip().isdigit()])


def _tests(iv: Interval | None, margin: float | None) -> tuple[float, float]:
    """(difference p, equivalence p) of one interval; NaN where there is no test."""
    if iv is None or iv.degenerate:
        return math.nan, math.nan
    return iv.p_value(), tost_p(iv, margin) if margin is not None else math.nan


def _bounds(c: Contrast) -> tuple[tuple[float, float], tuple[float, float]]:
    """For an approximate contrast: the (smallest, largest) difference and equivalence p over the df it
    may have had, from its own (seeds - 1, the fewest the intervals use) to its sweep's design df."""
    iv = c.interval
    a = _tests(iv, c.margin)
    wider = iv is not None and math.isfinite(c.df_hi) and c.df_hi > iv.df
    b = _tests(replace(iv, df=c.df_hi), c.margin) if wider else a
    return tuple((min(x, y), max(x, y)) for x, y in zip(a, b))  # type: ignore[return-value]


def correct(contrasts: list[Contrast], alpha: float = FAMILY_ALPHA) -> None:
    """Fill every contrast's p-values, their Holm adjustment across all of them, and its page verdict.
    An approximate contrast enters twice over: with its largest p-values (the adjusted ones shown) and
    with its smallest; Holm's adjusted p-values grow with every p, so the two passes bound the truth."""
    for c in contrasts:
        c.p_diff, c.p_equiv = _tests(c.interval, c.margin)
    if any(c.approximate for c in contrasts):
        bounds = [_bounds(c) if c.approximate else None for c in contrasts]
        hi = holm_adjusted([p for c, b in zip(contrasts, bounds) for p in (_pick(c, b, 1))])
        lo = holm_adjusted([p for c, b in zip(contrasts, bounds) for p in (_pick(c, b, 0))])
    else:
        hi = lo = holm_adjusted([p for c in contrasts for p in (c.p_diff, c.p_equiv)])
    for i, c in enumerate(contrasts):
        c.adj_diff, c.adj_equiv = hi[2 * i], hi[2 * i + 1]
        c.adj_diff_lo, c.adj_equiv_lo = lo[2 * i], lo[2 * i + 1]
        worst = page_verdict(c.verdict, c.adj_diff, c.adj_equiv, alpha)
        best = page_verdict(c.verdict, c.adj_diff_lo, c.adj_equiv_lo, alpha)
        c.page = worst if worst == best else UNRESOLVED


def _pick(c: Contrast, b, side: int) -> tuple[float, float]:
    return (c.p_diff, c.p_equiv) if b is None else (b[0][side], b[1][side])


def page_verdict(verdict: str, adj_diff: float, adj_equiv: float, alpha: float = FAMILY_ALPHA) -> str:
    """The table's verdict where its test survives the page-wide correction, else undetermined."""
    if verdict in DIRECTIONS:
        return verdict if adj_diff <= alpha else "undetermined"
    if verdict == "equivalent":
        return verdict if adj_equiv <= alpha else "undetermined"
    return verdict


def p_text(p: float, approximate: bool = False, lo: float | None = None) -> str:
    """An adjusted p-value as the page prints it: two significant digits, 1 at the cap; approximate:
    ≈, and the range down to `lo` where it reaches across 0.05."""
    if not math.isfinite(p):
        return "—"
    fmt = lambda x: "1" if x >= 1 else f"{x:.2g}" if x >= 1e-4 else f"{x:.0e}"  # noqa: E731
    if not approximate:
        return fmt(p)
    if lo is not None and lo <= FAMILY_ALPHA < p:
        return f"≈{fmt(lo)} to {fmt(p)}"
    return "≈" + fmt(p)


def family_size(contrasts: list[Contrast]) -> int:
    """The number of tests with a p-value in the family."""
    return sum(math.isfinite(p) for c in contrasts for p in (c.p_diff, c.p_equiv))
