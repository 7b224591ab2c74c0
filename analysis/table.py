"""The paper table of a sweep: one row per cell (axis values or combination; points of another
base config get rows of their own), columns that show what changed and what it cost.

For the first metric `final/<m>` (default held-out greedy success): start (before RL), final,
gain = final - start, Δ to the baseline of the same config, its verdict, and Δ @ equal episodes
where costs differ (analysis.columns). With per-task results these are over the seeds x tasks
grid, paired by seed and task; without them (older results) over seeds only, and the caption says
so. Further metrics are columns of their own (estimate ± 95% t interval over seeds), followed by
the cost (episodes, generated tokens, wall time). Every interval is analysis.intervals' (one
method, docs/algorithms.md#statistics). Under the table: the minimum detectable effect for the
sweep's seeds and tasks, warnings (below 3 seeds; runs pooled from several CPU kernel paths),
notes, provenance and every missing point.

The verdict column: every Δ of the table (or every gain, in a table without Δ) is one contrast of
a family corrected together by Holm; the rule is analysis.intervals.verdict, the equivalence
margin the sweep's `equivalence_margin` (sweep.json), else DEFAULT_MARGIN. A sweep with a seed
budget (sweep.json's `sequential`) gets the looks of analysis.sequential instead
(analysis.sequential_table): each row's Δ and verdict at the look that decided it.

`build_table` computes once (a `Table`); `analysis.render.render(table, fmt)` prints it.
"""

from __future__ import annotations

import difflib
import math
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from analysis import sequential_table
from analysis.columns import COST, DELTA, FINAL, GAIN, MATCHED, START, VERDICT, Block, add_verdicts, build_block
from analysis.intervals import FAMILY_ALPHA, NEEDED_MAX, Interval, seed_interval
from analysis.load import SUMMARY_PREFIXES, AnalysisError, load_curves, load_results, resolve_metric
from analysis.records import as_folder
from analysis.render import MD, format_entry, render  # noqa: F401 (render is re-exported)
from analysis.sequential_table import add_sequential_verdicts, plan_of
from analysis.table_text import (
    caption,
    keys_and_header,
    legend,
    margin_of,
    notes,
    provenance,
    short_caption,
    summary_lines,
    warnings,
)
from analysis.tasks import (
    EPISODE_KEYS,
    HIGHER_IS_BETTER,
    TOKEN_KEYS,
    cumulative,
    load_tasks,
    seed_scores,
    task_env,
    task_metric,
    task_scores,
)
from harness.store import CORRUPT, FINISHED, SWEEP_MANIFEST

DEFAULT_METRICS = ("final/eval_greedy/success", "collapsed_at", "final/diag/kl_k3")
METRIC_NAMES = {
    "final/eval_greedy/success": "final greedy success",
    "best/eval_greedy/success": "best greedy success",
    "init/eval_greedy/success": "initial greedy success",
    "collapsed_at": "collapse (update)",
    "final/diag/kl_k3": "final KL (k3)",
}
BLOCK_NAMES = {
    START: "start",
    FINAL: "final",
    GAIN: "gain",
    DELTA: "Δ vs baseline",
    VERDICT: "verdict",
    MATCHED: "Δ @ equal episodes",
}
SEQUENTIAL_CAPTION = " Sequential seeds: the verdicts follow the looks in the notes, not one fixed-n Holm family."
COST_NAMES = {"episodes": "episodes", "tokens": "gen. tokens", "wall": "wall"}


@dataclass
class Entry:
    """One table cell before formatting."""

    kind: str  # metric | collapse | delta | baseline | text | empty
    est: Interval | None = None
    decimals: int = 2
    dagger: bool = False  # fewer seeds than requested
    unpaired: bool = False  # delta interval is unpaired
    below_min: bool = False  # fewer than --min-seeds values: no estimate shown
    collapsed: int = 0  # collapse column: runs that collapsed / finished
    finished: int = 0
    text: str = ""  # kind text: shown as is


@dataclass
class Table:
    name: str
    key_header: list[str]  # axis (and setting) columns
    metric_header: list[str]  # metric, difference and cost columns
    rows: list[tuple[list[str], str, list[Entry]]]  # (key texts, seeds text, entries)
    caption: str
    notes: list[str] = field(default_factory=list)
    provenance: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    data: pd.DataFrame = field(default_factory=pd.DataFrame)
    interval: str = "pm"
    summary: list[str] = field(default_factory=list)  # MDE and warnings, right under the table
    warnings: list[str] = field(default_factory=list)  # also in summary; the CLI repeats them on stderr
    short_caption: str = ""  # the caption without what `legend` says (docs/results.md)
    legend: list[str] = field(default_factory=list)  # the definitions every table of a page shares
    findings: list[dict] = field(default_factory=list)  # per contrast: cell, baseline, interval, verdict


def metric_name(m: str) -> str:
    return METRIC_NAMES.get(m, m)


def decimals_for(values: list[float]) -> int:
    """Decimals for a column: about three significant digits for its largest magnitude."""
    m = max((abs(v) for v in values if not math.isnan(v)), default=0.0)
    return 0 if m >= 100 else 1 if m >= 10 else 2 if m >= 0.1 or m == 0 else 3 if m >= 0.01 else 4


def requested_seeds(results: pd.DataFrame, cells: list[str]) -> dict[str, int]:
    """Seeds asked for per cell: the sweep's seeds for its own config, else the most any cell of
    that config group has."""
    meta = results.attrs["sweep"]
    counts = results.groupby("cell")["point"].count()
    group = results.groupby("cell")["config_group"].first()
    most = {g: int(counts[group == g].max()) for g in set(group)}
    return {c: (len(meta.seeds) or most.get("", 0)) if not group[c] else most[group[c]] for c in cells}


# ----------------------------------------------------------------------------- per-seed metric columns
def _recorded(done: pd.DataFrame, values: dict[str, pd.Series], metrics: list[str], explicit: bool, out: list[str]):
    """Drop default metrics no finished point recorded (explicit ones stay, as dashes); note both."""
    kept = []
    for m in metrics:
        recorded = done["collapse_recorded"].any() if m == "collapsed_at" else values[m][done.index].notna().any()
        if recorded or (explicit and m != "collapsed_at"):
            kept.append(m)
        if not recorded and (explicit or m != "collapsed_at"):
            out.append(f"Not recorded by any finished point: {m}.")
    return kept


def _metric_entry(rows: pd.DataFrame, v: pd.Series, is_collapse: bool, requested: int, min_seeds: int) -> Entry:
    est = seed_interval(v[rows.index])
    below = 0 < est.n < min_seeds
    if is_collapse:  # NaN = did not collapse: the estimate is over the runs that did
        finished = int(rows["collapse_recorded"].sum())
        # the updates themselves: a mean and t interval of two or three of them reads as "23.5 ± 44.5"
        at = ", ".join(f"{u:g}" for u in sorted(v[rows.index].dropna()))
        return Entry("collapse", est, collapsed=est.n, finished=finished, dagger=finished < requested, text=at)
    return Entry("metric", est, dagger=est.n < requested, below_min=below)


def _metric_columns(done, values, metrics, cells, requested, min_seeds) -> dict[str, dict[str, Entry]]:
    grid: dict[str, dict[str, Entry]] = {c: {} for c in cells}
    for m in metrics:
        for c in cells:
            rows = done[done["cell"] == c]
            grid[c][m] = _metric_entry(rows, values[m], m == "collapsed_at", requested[c], min_seeds)
        decimals = decimals_for([grid[c][m].est.value for c in cells])
        for c in cells:  # an update index needs no more than one decimal
            grid[c][m].decimals = min(decimals, 1) if m == "collapsed_at" else decimals
    return grid


# ----------------------------------------------------------------------------- the paired block
def _scores(primary: str, results: pd.DataFrame, curves: pd.DataFrame, tasks: pd.DataFrame | None):
    """Per-task scores when every finished point has them for this metric, else per-seed ones."""
    done = results[results["status"].isin(FINISHED)]
    spec = task_metric(primary)
    missing = len(done)
    if spec and spec[0] == "final" and tasks is not None and len(tasks):
        scores = task_scores(tasks, spec[1], spec[2], task_env(primary))
        missing = sum(not scores.has(p) for p in done["point"])
        if not missing:
            return scores
    base = primary.partition("/")[2]
    start = dict(zip(results["point"], resolve_metric(results, curves, f"init/{base}")))
    final = dict(zip(results["point"], resolve_metric(results, curves, primary)))
    scores = seed_scores(curves, base, start if primary.startswith("final/") else {}, final)
    scores.note = (
        f"Per-task results (eval_tasks.jsonl) are missing for {missing} of {len(done)} finished points: "
        if 0 < missing < len(done)
        else "No per-task results (eval_tasks.jsonl): "
    ) + "intervals are over seeds only."
    return scores


def _totals(results: pd.DataFrame, curves: pd.DataFrame) -> dict[str, dict[str, float]]:
    """Per point: total episodes, generated tokens and wall seconds (summary, else the curves)."""
    eps, toks = cumulative(curves, EPISODE_KEYS), cumulative(curves, TOKEN_KEYS)
    out: dict[str, dict[str, float]] = {name: {} for name in COST}
    for _, r in results.iterrows():
        for name, key in COST.items():
            v = r.get(key)
            curve = {"episodes": eps, "tokens": toks}.get(name, {}).get(r["point"])
            if not isinstance(v, (int, float)) or math.isnan(v):
                v = float(curve.iloc[-1]) if curve is not None and len(curve) else math.nan
            out[name][r["point"]] = float(v)
    return out


def _block_entries(block: Block, cells: list[str], requested, min_seeds) -> dict[str, dict[str, Entry]]:
    values = [e.value for c in cells for k, e in block.est.get(c, {}).items() if e is not None and k in (START, FINAL)]
    dec = decimals_for(values)
    grid: dict[str, dict[str, Entry]] = {c: {} for c in cells}
    for c in cells:
        for col in block.columns:
            e = block.est.get(c, {}).get(col)
            if col in (DELTA, MATCHED) and c in block.base_cells:
                grid[c][col] = Entry("baseline")
                continue
            if col == MATCHED and c not in block.budget:
                grid[c][col] = Entry("text", text="same cost" if c in block.paired else "")
                continue
            if col == VERDICT:
                grid[c][col] = Entry("text", text=block.verdicts.get(c, ("", 0.0))[0])
                continue
            kind = "delta" if col in (GAIN, DELTA, MATCHED) else "metric"
            n = e.n if e is not None else 0
            grid[c][col] = Entry(
                kind,
                e,
                decimals=dec,
                dagger=kind == "metric" and 0 < n < requested[c],
                unpaired=col in (DELTA, MATCHED) and n > 0 and not block.paired.get(c, True),
                below_min=0 < n < min_seeds,
            )
    return grid


def _cost_text(v: float, name: str, ratio: float) -> str:
    if math.isnan(v):
        return ""
    if name == "wall":
        text = f"{v / 3600:.1f} h" if v >= 3600 else f"{v / 60:.1f} min" if v >= 60 else f"{v:.0f} s"
    else:
        text = f"{v / 1e6:.2f}M" if v >= 1e6 else f"{v / 1e3:.1f}k" if v >= 1e4 else f"{v:,.0f}"
    return text + (f" (×{ratio:.2f})" if not math.isnan(ratio) and abs(ratio - 1) > 0.05 else "")


def _cost_entries(block: Block, cells: list[str], base_of: dict[str, str | None]) -> tuple[list[str], dict]:
    shown = [n for n in COST if any(not math.isnan(block.cost[c][n]) for c in cells)]
    grid = {c: {} for c in cells}
    for c in cells:
        base = base_of.get(c)
        for n in shown:
            ref = block.cost[base][n] if base in block.cost and base != c else math.nan
            grid[c][n] = Entry(
                "text", text=_cost_text(block.cost[c][n], n, block.cost[c][n] / ref if ref else math.nan)
            )
    return shown, grid


# ----------------------------------------------------------------------------- the table
@dataclass(frozen=True)
class Options:
    interval: str = "pm"
    min_seeds: int = 1
    margin: float | None = None  # equivalence margin; None: the sweep's (sweep.json), else DEFAULT_MARGIN


def _looks_plan(raw: dict, margin: float, primary: str | None):
    """The seed budget's plan where this table's metric is the one its looks were decided on, else None:
    another metric of the same points gets the fixed-n rule (its cells may then have other seeds than
    their baseline: unpaired, marked ‡), and no note about the looks."""
    return plan_of(raw, margin) if raw.get("metric") == primary else None


def _primary_block(results, curves, tasks, cells, primary: str | None, margin: float):
    """(the start/final/gain/Δ/verdict block with the cost of every cell, the scores it was built on,
    the sequential looks of a sweep with a seed budget or None)."""
    done = results[results["status"].isin(FINISHED)]
    totals = _totals(results, curves)
    if primary is None:  # no block: the cost only
        block = build_block(done, cells, seed_scores(curves, "", {}, {}), totals)
        block.columns = []
        return block, None, None
    scores = _scores(primary, results, curves, tasks)
    scores.episodes = cumulative(curves, EPISODE_KEYS)
    block = build_block(done, cells, scores, totals)
    spec = task_metric(primary)
    higher = HIGHER_IS_BETTER.get(spec[2]) if spec else None
    raw = results.attrs["sweep"].raw
    plan = _looks_plan(raw, margin, primary)
    looks = add_sequential_verdicts(block, done, scores, plan, higher) if plan is not None else None
    if looks is not None:
        looks.capped = sequential_table.capped_of(raw)
    if looks is None:
        add_verdicts(block, margin, higher)
    return block, scores, looks


def _record(c: str, keys, key_header, seeds: tuple[int, int], entries: dict[str, Entry], block: Block, first) -> dict:
    """The CSV row of a cell: keys, seeds, value/lo/hi/n of every estimate, the verdict."""
    rec = dict(zip(key_header, keys), seeds=seeds[0], requested=seeds[1], baseline=bool(first["is_baseline"]))
    rec["config_group"] = first["config_group"]
    for col, e in entries.items():
        name = {DELTA: "delta", MATCHED: "delta@equal_episodes"}.get(col, col)
        if col == VERDICT:
            rec["verdict"], rec["verdict:p_holm"] = block.verdicts.get(c, (None, math.nan))
            continue
        if e.kind == "text":
            rec[name] = block.cost.get(c, {}).get(col, math.nan) if col in COST else math.nan
            continue
        for suffix, attr, empty in (("", "value", math.nan), (":lo", "lo", math.nan), (":hi", "hi", math.nan)):
            rec[name + suffix] = getattr(e.est, attr, empty)
        rec[f"{name}:n"] = getattr(e.est, "n", 0)
    if DELTA in entries:
        rec["delta:paired"] = block.paired.get(c)
    if c in block.budget:
        rec["equal_episodes_budget"] = block.budget[c]
    return rec


def needed_lines(block: Block, labels: dict[str, str]) -> list[str]:
    """Under a fixed-seed table with undetermined contrasts: the seeds each would need for a verdict
    (analysis.columns.add_needed). A sequential table says it in its looks line instead."""
    if block.sequential or not block.needed:
        return []
    family = len(block.verdicts)
    parts = []
    for c, need in block.needed.items():
        if need is None:
            parts.append(f"{labels.get(c, c)}: none below {NEEDED_MAX} seeds")
        else:
            parts.append(
                f"{labels.get(c, c)}: {'at least' if c in block.needed_from_interval else 'about'} {need} seeds"
            )
    lower = (
        " ('at least': projected from the interval alone where the arms do not pair, a lower bound)"
        if block.needed_from_interval
        else ""
    )
    return [
        "Seeds a verdict would need, at the observed Δ and variance, were this table's rule run once at that many "
        f"seeds (Holm's strictest level {FAMILY_ALPHA:g}/{family} for a difference, the 90% TOST against "
        f"±m for equivalence; docs/algorithms.md#statistics): {'; '.join(parts)}{lower}."
    ]


def _needed(block: Block, looks, c: str) -> dict:
    """The seeds an undetermined contrast would need for a verdict, and whether that is projected
    from its interval alone (a lower bound); a seed budget's from its looks."""
    if looks is not None:
        return sequential_table.finding(looks, c)
    if c not in block.needed:
        return {}
    return {"needed": block.needed[c], "needed_from_interval": c in block.needed_from_interval}


def _findings(results: pd.DataFrame, block: Block, looks=None) -> list[dict]:
    """Every tested contrast of the table: the cell's and its baseline's labels, the interval, the verdict."""
    label = dict(zip(results["cell"], results["label"]))
    base = dict(zip(results["cell"], results["baseline_cell"]))
    return [
        {
            "cell": label[c],
            "baseline": label.get(base.get(c)) if block.tested == DELTA else None,
            "column": block.tested,
            "interval": block.est[c][block.tested],
            "verdict": v,
            "p_holm": p,
            # evaluated on other held-out tasks than its baseline's: Δ compares two task distributions
            "other_tasks": block.tested == DELTA and c in block.other_tasks,
            "sequential": block.sequential,
            **_needed(block, looks, c),
        }
        for c, (v, p) in block.verdicts.items()
    ]


def build_table(
    results: pd.DataFrame,
    curves: pd.DataFrame | None = None,
    metrics: list[str] | None = None,
    tasks: pd.DataFrame | None = None,
    **options,
) -> Table:
    """Estimates for every cell: the paired block of the first metric (a final/ or another summary
    metric) with its verdicts, the further metrics, the cost; the caption and the lines under the
    table. `options`: interval (pm | bracket), min_seeds, margin (Options)."""
    opts = Options(**options)
    meta = results.attrs["sweep"]
    margin = opts.margin if opts.margin is not None else margin_of(meta.raw, f"{meta.name}/sweep.json")
    curves = curves if curves is not None else pd.DataFrame(columns=["point", "metric", "update", "value"])
    done = results[results["status"].isin(FINISHED)]
    cells = list(dict.fromkeys(results["cell"]))
    wanted = list(metrics or default_metrics(results))
    primary = wanted[0] if wanted[0] != "collapsed_at" else None
    block, scores, looks = _primary_block(results, curves, tasks, cells, primary, margin)
    # a sweep with a seed budget asked each cell for the seeds its looks scheduled
    requested = sequential_table.requested(results, cells) if looks else requested_seeds(results, cells)
    extra_notes: list[str] = []
    if looks:
        extra_notes.append(sequential_table.decided_line(looks, block.verdicts))
        extra_notes += sequential_table.notes(looks, dict(zip(results["cell"], results["label"])))
    elif _looks_plan(meta.raw, margin, primary) is not None:
        extra_notes += sequential_table.capped_early(meta.raw)
    extra_notes += needed_lines(block, dict(zip(results["cell"], results["label"])))
    rest = wanted[1:] if primary else wanted
    values = {m: resolve_metric(results, curves, m) for m in rest}
    rest = _recorded(done, values, rest, bool(metrics), extra_notes)
    grid = _block_entries(block, cells, requested, opts.min_seeds)
    for c, entries in _metric_columns(done, values, rest, cells, requested, opts.min_seeds).items():
        grid[c].update(entries)
    cost_cols, cost_grid = _cost_entries(block, cells, dict(zip(results["cell"], results["baseline_cell"])))
    columns = block.columns + rest + cost_cols
    header = [BLOCK_NAMES[c] if c in BLOCK_NAMES else COST_NAMES.get(c) or metric_name(c) for c in columns]
    if block.columns and block.columns[0] == FINAL:  # a summary metric without a start
        header[0] = metric_name(primary)
    key_header, keys = keys_and_header(results, cells)
    rows, data = [], []
    any_corrupt = bool((results["status"] == CORRUPT).any())
    for c in cells:
        entries = {**grid[c], **cost_grid[c]}
        n_done = int((done["cell"] == c).sum())
        n_corrupt = int(((results["cell"] == c) & (results["status"] == CORRUPT)).sum())
        seeds = f"{n_done}/{requested[c]}" + (f" ({n_corrupt} corrupt)" if n_corrupt else "")
        rows.append((keys[c], seeds, [entries[col] for col in columns]))
        first = results[results["cell"] == c].iloc[0]
        data.append(_record(c, keys[c], key_header, (n_done, requested[c]), entries, block, first))
        if any_corrupt:
            data[-1]["corrupt"] = n_corrupt
        if looks:
            data[-1].update(sequential_table.record(looks, c))
    shown = " ".join(format_entry(e, MD, opts.interval) for _, _, es in rows for e in es)
    warned = warnings(results)
    return Table(
        meta.name,
        key_header,
        header,
        rows,
        caption(results, block, scores, primary, opts.interval, margin) + (SEQUENTIAL_CAPTION if looks else ""),
        notes(results, block, columns, requested, opts.min_seeds, shown, [seeds for _, seeds, _ in rows]) + extra_notes,
        provenance(results),
        missing_lines(results),
        pd.DataFrame(data),
        opts.interval,
        summary_lines(results, block, scores) + warned,
        warned,
        short_caption(results, block, scores, primary),
        legend(opts.interval),
        _findings(results, block, looks),
    )


def missing_lines(results: pd.DataFrame) -> list[str]:
    """Every point not in the table, with its status and why, plus sweep-level problems."""
    meta = results.attrs["sweep"]
    out = [f"sweep: {p}" for p in meta.problems]
    for _, r in results[~results["status"].isin(FINISHED)].iterrows():
        why = f": {str(r['error']).splitlines()[0][:120]}" if isinstance(r.get("error"), str) and r["error"] else ""
        probs = f" ({r['problems']})" if r["problems"] else ""
        seed = "" if pd.isna(r["seed"]) else f" seed {int(r['seed'])}"
        out.append(f"{r['label']}{seed} [{r['point']}]: {r['status']}{why}{probs}")
    return out


# ----------------------------------------------------------------------------- entry point
def known_metrics(results: pd.DataFrame, curves: pd.DataFrame) -> list[str]:
    """Every metric name the table accepts for this folder: summary metrics any point recorded,
    and final/, best/, init/ of every metric in any metrics.jsonl."""
    skip = {"seed", "collapse_recorded", "collapsed_reason", "has_metrics"}
    summary = [c for c in results.columns if ("/" in c or c == "collapsed_at") and c not in skip]
    summary = [c for c in summary if c == "collapsed_at" or pd.to_numeric(results[c], errors="coerce").notna().any()]
    derived = [f"{p}/{m}" for m in sorted(curves["metric"].unique()) for p in SUMMARY_PREFIXES]
    return list(dict.fromkeys(summary + derived))


def check_metrics(wanted: list[str], known: list[str], where: Path) -> None:
    """An unknown metric is an error naming the closest known ones (one paragraph)."""
    for m in wanted:
        if m in known:
            continue
        prefixed = m.split("/")[0] in SUMMARY_PREFIXES or m == "collapsed_at"
        close = difflib.get_close_matches(m if prefixed else f"final/{m}", known, n=3, cutoff=0.5)
        hint = f"did you mean {' or '.join(close)}? " if close else ""
        finals = [k for k in known if k.startswith("final/")]
        examples = ", ".join(finals[:12]) + (f" and {len(finals) - 12} more" if len(finals) > 12 else "") or "none"
        raise AnalysisError(
            f"metric {m!r} (--metric) is not recorded by any point of {where}; {hint}Summary metrics are "
            f"final/<m>, best/<m>, init/<m> of a metric in metrics.jsonl, or collapsed_at; this sweep has: {examples}."
        )


def default_metrics(results: pd.DataFrame) -> tuple[str, ...]:
    """The sweep's own leading metric (`metric:` of the sweep file, in sweep.json), then the defaults."""
    lead = results.attrs["sweep"].raw.get("metric") if "sweep" in results.attrs else None
    return (lead, *[m for m in DEFAULT_METRICS if m != lead]) if lead else DEFAULT_METRICS


def table_for(path: str | Path, metrics: list[str] | None = None, **kw) -> Table:
    """Load a results folder or a records pack (points, curves, per-task results) and build its table."""
    path = as_folder(path)
    results = load_results(path)
    done = results[results["status"].isin(FINISHED)]
    curves = load_curves(path, results)
    if metrics:
        known = known_metrics(results, curves)
        # a metrics.jsonl key means its final value, as in a sweep file's `metric:`
        metrics = [m if m in known or f"final/{m}" not in known else f"final/{m}" for m in metrics]
        check_metrics(metrics, known, Path(path))
    wanted = list(metrics or default_metrics(results))
    tasks = load_tasks(Path(path), list(done["point"])) if wanted[0].startswith("final/eval_") else None
    if kw.get("margin") is None:  # the sweep's, named by its file when it is bad
        kw["margin"] = margin_of(results.attrs["sweep"].raw, (Path(path) / SWEEP_MANIFEST).as_posix())
    return build_table(results, curves, metrics, tasks=tasks, **kw)
