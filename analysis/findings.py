"""The findings of a results page: one row per contrast of every sweep's lead table (sweep | question
| answer | Δ [CI] | verdict | the page-wide Holm p of its difference and equivalence tests | verdict,
page), and which sweeps share one baseline run (their errors are correlated).

A sweep's question is its line in `<notes>/_questions.yaml` ({sweep: question}), else the first
sentence of its description. The answer is the verdict in words (analysis.intervals.verdict); the
verdicts are the table's, Holm-corrected across the contrasts of that table; the last three columns
correct every published contrast together (analysis.family). A row kept from the previous page is
its first five cells verbatim, its contrast read back from them (or from its section's hidden line).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import yaml

from analysis.columns import DELTA, TOST_ALPHA
from analysis.family import Contrast, design_df, from_text, p_text, read_exact, seeds_of
from analysis.intervals import DIRECTIONS, FAMILY_ALPHA, NEEDED_MAX, Interval, seeds_for_interval
from analysis.load import AnalysisError
from harness.store import FINISHED

QUESTIONS = "_questions.yaml"
SUPERSEDED = "_superseded.yaml"
QUESTION_CHARS = 140
# what must agree between a sweep and the one that replaces it: the same question, asked of the same arms
SAME_QUESTION = ("base", "baseline", "metric")


def questions(notes_dir: Path) -> dict[str, str]:
    """{sweep: question} from `<notes>/_questions.yaml`; a file that is not such a mapping is an error."""
    path = notes_dir / QUESTIONS
    if not path.is_file():
        return {}
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as e:
        raise AnalysisError(f"{path}: not valid YAML ({e}).") from None
    if not isinstance(raw, dict) or not all(isinstance(v, str) for v in raw.values()):
        raise AnalysisError(f"{path}: expected a mapping of sweep name -> question (text), e.g. clipping: Does ...?")
    return {str(k): " ".join(v.split()) for k, v in raw.items()}


def superseded(notes_dir: Path, files: dict[str, Path]) -> dict[str, str]:
    """{old sweep: the sweep that replaces it} from `<notes>/_superseded.yaml`. A sweep is replaced only
    by one that asks its question again (the same base config, baseline, metric, and every point of the
    old file, label and settings, also a point of the new one), e.g. a fixed-seed sweep re-run under a
    seed budget; anything else is an error naming the file, the key and what differs. `files`: {sweep
    name: its file}."""
    path = notes_dir / SUPERSEDED
    if not path.is_file():
        return {}
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as e:
        raise AnalysisError(f"{path}: not valid YAML ({e}).") from None
    if not isinstance(raw, dict) or not all(isinstance(v, str) for v in raw.values()):
        raise AnalysisError(
            f"{path}: expected a mapping of sweep -> the sweep that replaces it, e.g. clipping: clipping_sequential"
        )
    out = {}
    for old, new in raw.items():
        old = str(old)
        for name in (old, new):
            if name not in files:
                raise AnalysisError(f"{path}: {name!r} is not a sweep file; allowed: {', '.join(sorted(files))}.")
        if old == new or new in raw:
            raise AnalysisError(f"{path}: {old}: {new}: a sweep is replaced by another that is not itself replaced.")
        a, b = (yaml.safe_load(files[n].read_text(encoding="utf-8")) for n in (old, new))
        for key in SAME_QUESTION:
            if a.get(key) != b.get(key):
                raise AnalysisError(
                    f"{path}: {old}: {new}: their {key} differs ({a.get(key)!r} vs {b.get(key)!r}); only a sweep "
                    "asking the same question of the same arms replaces another."
                )
        points_b = b.get("points") or []
        missing = [p.get("label") for p in a.get("points") or [] if p not in points_b]
        if missing:
            raise AnalysisError(
                f"{path}: {old}: {new}: point(s) {', '.join(map(str, missing))} of {old} are not points of {new} "
                "with the same settings; only a sweep asking the same question of the same arms replaces another."
            )
        out[old] = new
    return out


def superseded_line(old: str, new: str) -> str:
    """The sentence under the findings on a sweep whose rows are shown but not counted."""
    return (
        f"The rows of [{old}](#{old}) are shown as they ran but are not verdicts of this page, nor in its "
        f"page-wide correction: [{new}](#{new}) asks the same question of the same arms from the same base "
        f"config under a seed budget and replaces them ({SUPERSEDED})."
    )


def question_of(name: str, description: str, asked: dict[str, str]) -> str:
    """The sweep's question, else the first sentence of its description (cut to QUESTION_CHARS)."""
    if name in asked:
        return asked[name]
    first = description.split(". ")[0].strip().rstrip(".")
    return first if len(first) <= QUESTION_CHARS else first[: QUESTION_CHARS - 1].rstrip() + "…"


def ci_text(iv: Interval, decimals: int = 2) -> str:
    """'+0.08 [0.04, 0.13]'; a contrast without spread: '+0.25 (degenerate)'; one seed: the value."""
    value = f"{iv.value:+.{decimals}f}"
    if iv.degenerate:
        return value + " (degenerate)"
    if math.isnan(iv.lo):
        return value
    return f"{value} [{iv.lo:.{decimals}f}, {iv.hi:.{decimals}f}]"


def _holm_note(f: dict) -> str:
    """For an undetermined contrast whose unadjusted 95% interval excludes 0: why it is not a finding."""
    iv = f["interval"]
    if f["verdict"] != "undetermined" or iv.degenerate or not (iv.lo > 0 or iv.hi < 0):
        return ""
    if f.get("sequential"):  # a seed budget: each look tests at its share of the spent error rate
        return "its 95% interval excludes 0, but not at the share of the error rate its last look may spend"
    return "its 95% interval excludes 0, but not after Holm's correction across the sweep's contrasts"


NEEDED_TAIL = "seeds at the observed Δ and variance"


def needed_note(need: int | None, lower_bound: bool = False) -> str:
    """The seeds a verdict would need (analysis.columns.add_needed, analysis.sequential.seeds_needed)."""
    if need is None:
        return f"no verdict below {NEEDED_MAX} {NEEDED_TAIL}"
    return f"a verdict would need {'at least' if lower_bound else 'about'} {need} {NEEDED_TAIL}"


def answer(f: dict, margin: float) -> str:
    """The verdict of one contrast in words; for an undetermined one, why it is not a finding and the
    seeds a verdict would need."""
    notes = [_holm_note(f)]
    if "open_look" in f:  # a seed budget whose next looks have not run
        look, looks, seeds = f["open_look"]
        notes.append(f"still open after look {look} of {looks} ({seeds} seeds): the sweep's next looks add seeds")
    if f["verdict"] == "undetermined" and "needed" in f:
        notes.append(needed_note(f["needed"], f.get("needed_from_interval", False)))
    notes = [n for n in notes if n]
    return _answer(f, margin) + (f" ({'; '.join(notes)})" if notes else "")


def _answer(f: dict, margin: float) -> str:
    cell, base, v = f["cell"], f["baseline"], f["verdict"]
    if f["column"] != DELTA:  # a table without Δ: the gain of RL, final - start
        return {
            "better": f"RL improves {cell}",
            "worse": f"RL makes {cell} worse",
            "higher": f"RL raises it ({cell})",
            "lower": f"RL lowers it ({cell})",
            "equivalent": f"RL leaves {cell} unchanged within ±{margin:g}",
            "degenerate": f"{cell}: no spread across seeds and tasks; nothing to test",
        }.get(v, f"cannot tell whether RL changes {cell}")
    if f.get("other_tasks") and v in ("higher", "lower"):  # ‡: two task distributions, not two methods
        return f"{cell} ends {v} than {base} on its own held-out tasks (other tasks than the baseline's)"
    return {
        "better": f"{cell} is better than {base}",
        "worse": f"{cell} is worse than {base}",
        "higher": f"{cell} is higher than {base}",
        "lower": f"{cell} is lower than {base}",
        "equivalent": f"{cell} matches {base} within ±{margin:g}",
        "degenerate": f"{cell} vs {base}: no spread across seeds and tasks; nothing to test",
    }.get(v, f"cannot tell {cell} from {base}")


@dataclass
class Row:
    """One row of the findings table: its first five cells (sweep | question | answer | Δ [95% CI] |
    verdict) and its contrast (None for a sweep without one); `cell` the contrast's label, when known."""

    sweep: str
    cells: list[str]
    contrast: Contrast | None = None
    cell: str | None = None
    replaced_by: str | None = None  # the sweep that replaces this one (`superseded`): a row shown, not counted


def _bold(verdict: str) -> str:
    return f"**{verdict}**" if verdict in DIRECTIONS else verdict


def rows(name: str, question: str, table, margin: float) -> list[Row]:
    """The findings rows of one sweep (its question on the first row only); none when it has no contrast."""
    out = []
    for i, f in enumerate(table.findings):
        what = "Δ" if f["column"] == DELTA else "gain"
        link = f"[{name}](#{name})"
        cells = [link, question if i == 0 else "", answer(f, margin), f"{what} {ci_text(f['interval'])}"]
        contrast = Contrast(f["interval"], f["verdict"], margin)
        out.append(Row(name, cells + [_bold(f["verdict"])], contrast, f["cell"]))
    return out


def kept_rows(name: str, texts: list[str], section: list[str], margin: float) -> list[Row]:
    """A kept section's findings rows (markdown, from the previous page): the first five cells verbatim,
    the contrast from the section's hidden line of exact intervals, else from the printed Δ [95% CI]
    with the seeds of its '- Seeds:' line (analysis.family.from_text: approximate)."""
    cells = [split_row(t)[:5] for t in texts]
    exact = read_exact(section, len(cells))
    out = []
    for i, c in enumerate(cells):
        label, iv = exact[i] if exact else (None, from_text(c[3], seeds_of(section)))
        contrast = Contrast(iv, c[4].strip("*"), margin, approximate=exact is None, df_hi=design_df(section))
        if contrast.verdict == "undetermined":
            c[2] = _with_needed(c[2], iv, len(cells), margin)
        out.append(Row(name, c, contrast, label))
    return out


def _with_needed(text: str, iv: Interval | None, family: int, margin: float) -> str:
    """A kept undetermined row's answer with the seeds a verdict would need, projected from its interval
    alone (the page keeps no grid: a lower bound, analysis.intervals.seeds_for_interval); a text that
    already says it is left as it is."""
    if NEEDED_TAIL in text or iv is None or iv.n < 2:
        return text
    note = needed_note(seeds_for_interval(iv, FAMILY_ALPHA / family, TOST_ALPHA, margin), lower_bound=True)
    if text.endswith(")") and " (its 95% interval" in text:
        return f"{text[:-1]}; {note})"
    return f"{text} ({note})"


def split_row(row: str) -> list[str]:
    """The cells of a markdown table row, with escaped bars restored."""
    return [c.strip().replace(r"\|", "|") for c in re.split(r"(?<!\\)\|", row.strip())[1:-1]]


HEAD = (
    "| sweep | question | answer | Δ [95% CI] | verdict | Holm p, page: Δ ≠ 0 | Holm p, page: within ±m "
    "| verdict, page |"
)


def page_cells(c: Contrast | None) -> list[str]:
    """The page-level cells of a row: the page-wide Holm p of its two tests and its page verdict."""
    if c is None:
        return ["—", "—", "—"]
    diff, equiv = p_text(c.adj_diff, c.approximate, c.adj_diff_lo), p_text(c.adj_equiv, c.approximate, c.adj_equiv_lo)
    return [diff, equiv, _bold(c.page)]


def markdown(table_rows: list[Row]) -> list[str]:
    """The findings table (the contrasts already corrected: analysis.family.correct)."""
    esc = lambda s: s.replace("|", r"\|")  # noqa: E731
    head = [HEAD, "| :-- | :-- | :-- | --: | :-- | --: | --: | :-- |"]
    return head + ["| " + " | ".join(esc(c) for c in r.cells + _page(r)) + " |" for r in table_rows]


def _page(r: Row) -> list[str]:
    if r.replaced_by:
        return ["—", "—", f"replaced by [{r.replaced_by}](#{r.replaced_by})"]
    return page_cells(r.contrast)


def baseline_runs(results: pd.DataFrame) -> frozenset[str]:
    """The config hashes of the finished points of a sweep's baseline cell: its baseline run."""
    done = results[results["status"].isin(FINISHED) & results["is_baseline"]]
    return frozenset(str(h) for h in done["config_hash"].dropna())


def shared_baselines(runs: dict[str, frozenset[str]]) -> list[str]:
    """One sentence per group of sweeps whose baseline runs overlap (the same config hashes: the same
    points; a sweep run at fewer seeds shares a subset)."""
    groups: list[tuple[set[str], list[str]]] = []
    for name, run in runs.items():
        if not run:
            continue
        hit = [g for g in groups if g[0] & run]
        merged = (set(run), [name])
        for g in hit:  # this run joins every group it overlaps
            merged[0].update(g[0])
            merged[1].extend(g[1])
            groups.remove(g)
        groups.append(merged)
    out, order = [], list(runs)
    for _, names in groups:
        if len(names) > 1:
            names = sorted(names, key=order.index)
            sizes = sorted({len(runs[n]) for n in names})
            what = (
                f"one {sizes[0]}-seed baseline run (the same configs and seeds"
                if len(sizes) == 1
                else f"baseline runs ({sizes[0]} to {sizes[-1]} seeds each, the same configs and seeds where they "
                "overlap"
            )
            out.append(
                f"The sweeps {', '.join(names[:-1])} and {names[-1]} share {what}, so the same points where they ran "
                "on one CPU kernel path, reused or reproduced bit for bit at each code version; on another path the "
                "same config and seed is another run, see aa_calibration): their errors are correlated, and a "
                "baseline that landed high or low by chance moves every Δ of these sweeps together."
            )
    return out
