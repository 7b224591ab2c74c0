"""Figures of a sweep, one per metric family: held-out evaluation (against updates, episodes and
generated tokens), training rollouts, and diagnostics (KL, entropy, MI estimate, in-group reward
std) with collapse markers; a reward-hacking probe's truth and exploit; for off-policy data (a
stale adapter, a reduced-precision sampler) the sampler-trainer mismatch; for a mixture of
environments, held-out success per environment. `-m METRIC` draws one figure for that metric.

Every figure has fixed panel sizes and the legend in its own column right of the panels
(analysis.layout), names the points by their labels, and says in its title what is drawn: the
split, the decoding, tasks and episodes per evaluation, and what line and band mean. Lines are
the mean over seeds at each update, bands the 95% t interval over the seeds logged there
(analysis.plot_data, the table's interval); against episodes or tokens a point is drawn at the
mean cumulative count of its seeds, and in an SFT/RL split under a budget against the share of
the budget spent (demonstrations first). What keeps a figure readable:
- a panel with more than MAX_BANDS lines shades the baseline's band only (stacked bands hide
  each other); a line whose values equal an earlier one's says "identical to X" in the legend;
- two axes with more than SMALL_MULTIPLES cells: one panel column per value of the first axis
  (lines: the second axis), the baseline in grey in every column;
- at most MAX_COLUMNS panel columns, so that no figure is much wider than a page shows it: more
  panels (or values of the first axis) wrap into further rows;
- no band is drawn to a point where every seed has the same value (before RL every seed starts from
  the same checkpoint): a band pinched to zero width would claim a certainty the seeds cannot give;
  an interval with no neighbour that has a spread is an error bar;
- the training family is a SMOOTH-update moving average of each seed (the band is over the
  smoothed seeds); a KL panel whose largest line peaks TOO_TALL times above the typical one is on a
  symmetric log scale, so that one blow-up does not flatten the rest;
- rate axes span at least half of [0, 1], non-negative quantities start at 0, so that a step of
  one task in eight is not blown up into a cliff.
Colours and markers: analysis.plot_style.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from pathlib import Path

import matplotlib
import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from analysis.cells import format_value, short_axis_names
from analysis.layout import DPI, finish, panels
from analysis.load import AnalysisError, load_curves, load_results
from analysis.plot_axes import X_LABELS, clipped, details, too_tall, x_axis, ylim
from analysis.plot_data import bands, has_budget, identical_to, smooth, x_positions
from analysis.plot_style import BASELINE_GREY, LineStyle, handle, line_styles
from analysis.records import as_folder
from analysis.tasks import EPISODE_KEYS, TOKEN_KEYS, cumulative
from harness.store import CORRUPT

FORMATS = ("png", "svg")
MAX_BANDS = 3  # more lines in a panel: only the baseline's band
SMALL_MULTIPLES = 6  # a two-axis grid with more cells gets one panel column per value of its first axis
# panel columns at most: two panels and the legend stay under about 1,800 px at 150 dpi; more panels wrap
# into further rows (small multiples: the first axis's values in blocks of MAX_COLUMNS, one block under another)
MAX_COLUMNS = 2
SMOOTH = 5  # moving-average window of the training family (updates), when a run logs 3 windows or more
# float32 sampling and recomputation agree to ~1e-11 nats of k3 (the committed sweeps without
# off-policy data); a stale adapter or a bfloat16 sampler gives 1e-5 or more
MISMATCH_FLOOR = 1e-8
ENV_METRIC = re.compile(r"eval_(greedy|sampled)/([^/]+)/success")


@dataclass(frozen=True)
class Family:
    name: str  # file stem
    title: str
    panels: tuple[tuple[str, tuple[str, ...]], ...]  # (panel title, candidate metrics: first logged wins)
    x: tuple[str, ...]  # x axes, one row of panels each: update, episodes (or budget), tokens
    smooth: bool = False  # draw the SMOOTH-update moving average of each seed
    floor: float = 0.0  # > 0: drawn only when some logged value of the first panel's metric exceeds it in size


FAMILIES = (
    Family(
        "evaluation",
        "held-out evaluation",
        (("greedy success", ("eval_greedy/success",)), ("sampled success", ("eval_sampled/success",))),
        ("update", "episodes", "tokens"),
    ),
    Family(  # reward-hacking probes only: the truth the proxy stands for, and the exploit
        "probe",
        "held-out true success and exploit rate of a reward-hacking probe",
        (
            ("true success, sampled", ("eval_sampled/true_success",)),
            ("exploit rate, sampled", ("eval_sampled/exploit_rate",)),
            ("true success, greedy", ("eval_greedy/true_success",)),
            ("exploit rate, greedy", ("eval_greedy/exploit_rate",)),
        ),
        ("update",),
    ),
    Family(  # Sokoban with `deadlock` on only: episodes that end with a box on a dead cell
        "deadlock",
        "held-out deadlock rate, the share of episodes that end with a box on a dead cell",
        (
            ("held-out, sampled", ("eval_sampled/deadlock_rate",)),
            ("held-out, greedy", ("eval_greedy/deadlock_rate",)),
        ),
        ("update",),
    ),
    Family(
        "training",
        "training rollouts",
        (("success", ("env/success",)), ("return", ("env/return",)), ("turns", ("env/turns",))),
        ("update",),
        smooth=True,
    ),
    Family(
        "diagnostics",
        "diagnostics",
        (
            ("KL to reference (k3)", ("diag/kl_k3",)),
            ("entropy", ("diag/entropy", "loss/entropy")),
            ("MI estimate", ("diag/mi_estimate",)),
            ("in-group reward std", ("env/group_reward_std",)),
        ),
        ("update",),
    ),
    Family(  # off-policy data only: a stale adapter, a bfloat16 sampler (docs/algorithms.md#mismatch-diagnostics)
        "mismatch",
        "sampler-trainer mismatch of the sampled tokens' log-probabilities, delta = log p_trainer - log p_sampler",
        (
            ("mismatch k3", ("diag/mismatch_k3",)),
            ("delta, 0.1% quantile", ("diag/mismatch_delta_p0_1",)),
            ("delta, 99.9% quantile", ("diag/mismatch_delta_p99_9",)),
            ("effective sample size of the weights", ("diag/mismatch_ess",)),
        ),
        ("update",),
        floor=MISMATCH_FLOOR,
    ),
)
CURVE_DEFAULTS = ("eval_greedy/success", "env/success")


@dataclass
class Context:
    """What every panel of one figure shares."""

    curves: pd.DataFrame
    results: pd.DataFrame
    styles: dict[str, LineStyle]
    baseline: str | None
    collapses: pd.DataFrame
    window: int = 1  # moving average (updates)
    grey: set[str] = field(default_factory=set)  # labels drawn as the grey baseline reference
    banded: set[str] = field(default_factory=set)  # labels whose band some panel shaded
    many: bool = False  # a panel holds more than MAX_BANDS lines: only the baseline's band
    symlog: bool = False
    flat: set[str] = field(default_factory=set)  # where a shaded line's seeds all agree: "start" (update 0), "later"
    alone: bool = False  # some interval stood alone between such points: drawn as an error bar


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "_", name).strip("_")


def _line(ax, g: pd.DataFrame, st: LineStyle, band: bool, grey: bool, ctx: Context) -> None:
    color = BASELINE_GREY if grey else st.color
    face = "white" if st.hollow else color
    ax.plot(
        g["x"],
        g["mean"],
        color=color,
        linestyle="--" if grey else st.linestyle,
        marker=None if grey else st.marker,
        markersize=4,
        markerfacecolor=face,
        markevery=max(1, len(g) // 10),
        linewidth=1.0 if grey else 1.4,
        zorder=1 if grey else 2,
    )
    if band:
        _band(ax, g, color, ctx)


def _band(ax, g: pd.DataFrame, color, ctx: Context) -> None:
    """The 95% band where the seeds differ: a point whose seeds all have the same value (before RL every
    seed starts from the same checkpoint) has no spread to show, so the band is not drawn to it (it would
    pinch to zero width); an interval with no such neighbour on either side is an error bar."""
    x, mean, lo, hi = (g[k].to_numpy(dtype=float) for k in ("x", "mean", "lo", "hi"))
    wide = np.isfinite(lo) & np.isfinite(hi) & (hi > lo)
    flat = np.isfinite(lo) & (hi == lo)
    ctx.flat |= {"start" if u == 0 else "later" for u in g["update"].to_numpy()[flat]}
    ax.fill_between(x, lo, hi, where=wide, color=color, alpha=0.15, linewidth=0)
    alone = wide & ~np.r_[False, wide[:-1]] & ~np.r_[wide[1:], False]
    if alone.any():
        err = [mean[alone] - lo[alone], hi[alone] - mean[alone]]
        ax.errorbar(x[alone], mean[alone], yerr=err, fmt="none", ecolor=color, alpha=0.5, capsize=3, linewidth=1.2)
        ctx.alone = True


def _panel(ax, data: pd.DataFrame, metric: str, x: str, ctx: Context) -> set[str]:
    """One metric against one x axis; returns the labels drawn."""
    b = clipped(bands(smooth(data, ctx.window)), metric)
    if b.empty:
        ax.text(0.5, 0.5, "not logged", transform=ax.transAxes, ha="center", va="center", color="0.5")
        return set()
    b["x"] = x_positions(b, x, ctx.curves, ctx.results)
    for label, g in b.dropna(subset=["x"]).groupby("label", sort=False):
        band = not ctx.many or label == ctx.baseline
        _line(ax, g, ctx.styles[label], band, label in ctx.grey, ctx)
        if band:
            ctx.banded.add(label)
    shown = set(b["label"])
    for _, r in ctx.collapses[ctx.collapses["label"].isin(shown)].iterrows() if x == "update" else ():
        color = BASELINE_GREY if r["label"] in ctx.grey else ctx.styles[r["label"]].color
        ax.axvline(r["collapsed_at"], color=color, linestyle=":", linewidth=1.2)
    # the y range follows what is drawn: a band that is not shaded (many lines) does not stretch it
    drawn = b.copy()
    if ctx.many:
        unshaded = drawn["label"] != ctx.baseline
        drawn.loc[unshaded, "lo"] = drawn.loc[unshaded, "mean"]
        drawn.loc[unshaded, "hi"] = drawn.loc[unshaded, "mean"]
    if too_tall(metric, b):
        ax.set_yscale("symlog", linthresh=0.01)
        ax.set_ylim(0, float(drawn["hi"].max()) * 2)
        ctx.symlog = True
    else:
        ylim(ax, metric, drawn)
    x_axis(ax, x)
    ax.grid(alpha=0.3, linewidth=0.5)
    return shown


# ----------------------------------------------------------------------------- titles
def _title(family: Family, ctx: Context, n_collapse: int) -> str:
    meta = ctx.results.attrs["sweep"]
    drawn_points = ctx.results[ctx.results["has_metrics"]] if len(ctx.results) else ctx.results
    counts = drawn_points.groupby("label", sort=False)["point"].count() if len(drawn_points) else None
    seeds = int(counts.max()) if counts is not None else 0
    avg = f"{ctx.window}-update moving average of each seed, " if ctx.window > 1 else ""
    # a partly run sweep: name the lines that rest on fewer seeds than the caption's count
    fewer = [f"{label}: {n} seed{'s' if n > 1 else ''}" for label, n in counts.items() if n < seeds] if seeds else []
    over = f"mean over {seeds} seeds" + (f" ({'; '.join(fewer)})" if fewer else "")
    if seeds < 2:
        what = f"Lines: {avg}1 seed (no interval band)"
    elif ctx.many:
        base = f" ({ctx.baseline})" if ctx.baseline in ctx.banded else ""
        what = f"Lines: {avg}{over}; band: the baseline's{base} 95% t interval over seeds only"
    else:
        what = f"Lines: {avg}{over}; bands: 95% t interval over seeds"
    if seeds >= 2 and (ctx.flat or ctx.alone):
        what += _band_words(ctx)
    marks = f"; dotted verticals: collapse detected ({n_collapse} runs)" if n_collapse else ""
    scale = "; KL on a symmetric log scale (linear below 0.01)" if ctx.symlog else ""
    grey = "; grey dashed: the baseline, in every column" if ctx.grey else ""
    budget = (
        " Budget axis: the demonstrations (sft.demos x sft.demo_cost episodes), then RL's episodes, as a share of "
        "sft.budget; each line starts at its demonstrations' share."
        if "budget" in family.x
        else ""
    )
    drawn = details(family.panels[0][1][0], ctx.curves, ctx.results)
    return f"{meta.name}: {family.title} ({drawn}). {what}{marks}{scale}{grey}.{budget}"


def _band_words(ctx: Context) -> str:
    flat = "no band where every seed has the same value"
    if ctx.flat == {"start"}:
        flat += ", as at update 0, where every seed starts from the same checkpoint"
    alone = "an error bar where an interval has no neighbour with a spread"
    return " (" + "; ".join(w for w, on in ((flat, ctx.flat), (alone, ctx.alone)) if on) + ")"


# ----------------------------------------------------------------------------- figures
def _shape(family: Family, n_panels: int) -> tuple[int, int]:
    if len(family.x) > 1:
        return len(family.x), n_panels
    cols = min(n_panels, MAX_COLUMNS)
    return -(-n_panels // cols), cols


def _chosen(family: Family, curves: pd.DataFrame) -> list[tuple[str, str]]:
    logged = set(curves["metric"].unique())
    return [(t, next(m for m in c if m in logged)) for t, c in family.panels if any(m in logged for m in c)]


def _context(family: Family, curves, results, styles) -> Context:
    base = results.loc[results["is_baseline"], "label"]
    collapses = results.dropna(subset=["collapsed_at"]) if family.name == "diagnostics" else results.iloc[:0]
    per_point = curves[curves["metric"].isin([m for _, c in family.panels for m in c])].groupby("point")["update"]
    longest = int(per_point.nunique().max()) if len(per_point.size()) else 0
    window = SMOOTH if family.smooth and longest >= 3 * SMOOTH else 1
    many = results["label"].nunique() > MAX_BANDS
    return Context(curves, results, styles, base.iloc[0] if len(base) else None, collapses, window, many=many)


def _legend_title(results: pd.DataFrame) -> str | None:
    """The axis name when the labels are its values (one axis)."""
    meta = results.attrs["sweep"]
    if len(meta.axes) != 1:
        return None
    by_value = all(lab.split(" [")[0] == format_value(v) for lab, v in zip(results["label"], results[meta.axes[0]]))
    return short_axis_names(meta.axes)[meta.axes[0]] if by_value else None


def family_figure(family: Family, curves: pd.DataFrame, results: pd.DataFrame) -> Figure | None:
    """The family's panels that some point logged, one row per x axis with data; None if none."""
    chosen = _chosen(family, curves)
    if not chosen:
        return None
    xs = [x for x in family.x if x == "update" or cumulative(curves, EPISODE_KEYS if x != "tokens" else TOKEN_KEYS)]
    if "episodes" in xs and has_budget(results):  # an SFT/RL split: the budget's share, demonstrations included
        xs[xs.index("episodes")] = "budget"
    fam = replace(family, x=tuple(xs))
    rows, cols = _shape(fam, len(chosen))
    fig, axes = panels(rows, cols)
    ctx = _context(fam, curves, results, line_styles(results))
    drawn: set[str] = set()
    flat = [ax for row in axes for ax in row]
    for i, (title, metric) in enumerate(chosen):
        for j, x in enumerate(xs):
            ax = axes[j][i] if len(xs) > 1 else flat[i]
            drawn |= _panel(ax, curves[curves["metric"] == metric], metric, x, ctx)
            ax.set_title(f"{title} vs {X_LABELS[x]}" if len(xs) > 1 else title, fontsize=10)
            ax.set_ylabel(metric + (" (symlog)" if ax.get_yscale() == "symlog" else ""), fontsize=9)
    for ax in flat[len(chosen) * (1 if len(xs) == 1 else len(xs)) :]:
        ax.set_visible(False)
    labels = [lab for lab in ctx.styles if lab in drawn]
    same = identical_to(curves, [m for _, m in chosen], labels)
    texts = [f"{lab} (identical to {same[lab]})" if lab in same else lab for lab in labels]
    handles = [handle(ctx.styles[lab]) for lab in labels]
    return finish(fig, axes, handles, texts, _title(fam, ctx, len(ctx.collapses)), _legend_title(results))


def small_multiples(family: Family, curves: pd.DataFrame, results: pd.DataFrame) -> Figure | None:
    """A two-axis grid with many cells: rows = the family's metrics against updates, one column per
    value of the first axis (MAX_COLUMNS columns, further values in blocks of rows below); lines = the
    second axis's values; the baseline grey in every column."""
    chosen = _chosen(family, curves)
    if not chosen:
        return None
    meta = results.attrs["sweep"]
    first, second = meta.axes
    short = short_axis_names(meta.axes)
    values = list(dict.fromkeys(format_value(v) for v in results[first]))
    fam = replace(family, x=("update",))
    cols = min(len(values), MAX_COLUMNS)
    blocks = -(-len(values) // cols)  # the values in blocks of `cols` columns, one block of metric rows each
    fig, axes = panels(len(chosen) * blocks, cols)
    at = lambda i, j: axes[(j // cols) * len(chosen) + i][j % cols]  # noqa: E731  metric i, value j
    styles = line_styles(results, by=1)
    ctx = _context(fam, curves, results, styles)
    ctx.many = results[second].nunique() + 1 > MAX_BANDS  # a column's lines and the grey baseline
    label_of = results.drop_duplicates("label").set_index("label")
    for j, v in enumerate(values):
        own = [lab for lab in styles if format_value(label_of.loc[lab, first]) == v]
        ctx.grey = {ctx.baseline} - set(own) if ctx.baseline else set()
        for i, (title, metric) in enumerate(chosen):
            sub = curves[(curves["metric"] == metric) & curves["label"].isin(own + sorted(ctx.grey))]
            _panel(at(i, j), sub, metric, "update", ctx)
            at(i, j).set_title(f"{title} · {short[first]}={v}", fontsize=10)
            at(i, j).set_ylabel(metric if j % cols == 0 else "", fontsize=9)
    for j in range(len(values), blocks * cols):  # the last block's empty places
        for i in range(len(chosen)):
            at(i, j).set_visible(False)
    for i in range(len(chosen)):  # one metric: the same y range in every column, so columns compare
        row = [at(i, j) for j in range(len(values))]
        if all(ax.get_yscale() == "linear" for ax in row):
            lims = [ax.get_ylim() for ax in row]
            for ax in row:
                ax.set_ylim(min(lo for lo, _ in lims), max(hi for _, hi in lims))
    by_value = {}
    for lab, st in styles.items():
        by_value.setdefault(format_value(label_of.loc[lab, second]), replace(st, hollow=False, linestyle="-"))
    handles = [handle(st) for st in by_value.values()]
    texts = list(by_value)
    if ctx.baseline:
        handles.append(Line2D([], [], color=BASELINE_GREY, linestyle="--"))
        texts.append(f"baseline: {ctx.baseline}")
    ctx.grey = {ctx.baseline} if ctx.baseline else set()
    return finish(fig, axes, handles, texts, _title(fam, ctx, len(ctx.collapses)), short[second])


def environments_family(curves: pd.DataFrame) -> Family | None:
    """A mixture's held-out success per environment: sampled, then greedy, one panel per environment."""
    envs = sorted({m.group(2) for m in map(ENV_METRIC.fullmatch, curves["metric"].unique()) if m})
    if not envs:
        return None
    panels_ = tuple(
        (f"{env}, {mode}", (f"eval_{mode}/{env}/success",)) for mode in ("sampled", "greedy") for env in envs
    )
    return Family("environments", "held-out success per environment of the mixture", panels_, ("update",))


def curve_metric(curves: pd.DataFrame, metric: str | None) -> str:
    """The learning-curve metric: the requested one (an error naming the logged ones if absent),
    else held-out greedy success, else training success."""
    logged = sorted(curves["metric"].unique())
    if metric:
        if metric not in logged:
            raise AnalysisError(
                f"metric {metric!r} is not in any metrics.jsonl of this sweep; logged metrics: "
                f"{', '.join(logged) or 'none'}."
            )
        return metric
    for m in CURVE_DEFAULTS:
        if m in logged:
            return m
    if not logged:
        raise AnalysisError("no point of this sweep has logged metrics (metrics.jsonl) yet: nothing to plot.")
    return logged[0]


def figures(path: str | Path, metrics: list[str] | None = None) -> dict[str, Figure]:
    """Every figure of a results folder (failed and corrupt points left out): one per family, or with
    `metrics` one per requested metric (`curves_<metric>`, against updates, episodes, tokens)."""
    results = load_results(path)
    # failed runs stop early for reasons unrelated to the method, corrupt ones hold damaged rows: left out
    results = results[~results["status"].isin(("failed", CORRUPT))]
    curves = load_curves(path, results)
    if metrics:
        fams = [Family(f"curves_{_safe(m)}", m, ((m, (curve_metric(curves, m),)),), FAMILIES[0].x) for m in metrics]
    else:
        curve_metric(curves, None)  # nothing logged at all: one clear error
        # a mixture's probe member logs the probe figure's metrics for its own tasks, while the
        # caption would name the whole mixture's split: no probe figure for a mixture
        mixture = "env.name" in results and (results["env.name"] == "mixture").any()
        fams = [f for f in FAMILIES if not (mixture and f.name == "probe")]
        envs = environments_family(curves) if mixture else None
        fams = fams[:1] + ([envs] if envs else []) + fams[1:]
    meta = results.attrs["sweep"]
    split = len(meta.axes) == 2 and results["label"].nunique() > SMALL_MULTIPLES
    out = {}
    for fam in fams:
        if fam.floor and not _above_floor(fam, curves):
            continue
        fig = small_multiples(fam, curves, results) if split else family_figure(fam, curves, results)
        if fig is not None:
            out[fam.name] = fig
    return out


def _above_floor(family: Family, curves: pd.DataFrame) -> bool:
    """Whether some point logs a value of the family's first metric larger in size than its floor."""
    values = curves.loc[curves["metric"] == family.panels[0][1][0], "value"]
    return bool((values.abs() > family.floor).any())


def save(fig: Figure, out_dir: Path, stem: str, formats: tuple[str, ...] = FORMATS) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    with matplotlib.rc_context({"svg.hashsalt": "harness", "svg.fonttype": "none"}):
        for fmt in formats:
            p = out_dir / f"{stem}.{fmt}"
            fig.savefig(p, format=fmt, dpi=DPI, metadata={"Date": None} if fmt == "svg" else {"Software": None})
            paths.append(p)
    return paths


def make_plots(
    path: str | Path,
    metrics: list[str] | None = None,
    out_dir: str | Path | None = None,
    formats: tuple[str, ...] = FORMATS,
) -> dict[str, list[Path]]:
    """Write every figure of a results folder (default into <results>/plots).
    Returns {"evaluation": [png, svg], "training": [...], "diagnostics": [...]} (or curves_<metric>),
    and "probe" for a reward-hacking probe's held-out truth and exploit."""
    path = as_folder(path)  # a records pack: its figures go into the unpacked folder unless out_dir says
    out = Path(out_dir) if out_dir else Path(path) / "plots"
    return {name: save(fig, out, name, formats) for name, fig in figures(path, metrics).items()}
