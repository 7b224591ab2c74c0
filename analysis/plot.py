"""Figures of a sweep, one per metric family: held-out evaluation (against updates, episodes and
generated tokens), training rollouts, and diagnostics (KL, entropy, MI estimate, in-group reward
std) with collapse markers. `-m METRIC` draws one figure for that metric instead.

Every figure has fixed panel sizes and the legend in its own column right of the panels
(analysis.layout), names the points by their labels, and says in its title what is drawn: the
split, the decoding, tasks and episodes per evaluation, and what line and band mean. Lines are
the mean over seeds at each update, bands the 95% percentile-bootstrap CI over the seeds logged
there (analysis.stats, fixed seed: reproducible); against episodes or tokens a point is drawn
at the mean cumulative count of its seeds. Rate axes span at least half of [0, 1], non-negative
quantities start at 0, so that a step of one task in eight is not blown up into a cliff. With two axes, colour
encodes the first axis and line style and marker the second; points of another base config
have hollow markers.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import matplotlib
import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import FuncFormatter, MaxNLocator

from analysis.cells import short_axis_names
from analysis.layout import DPI, finish, panels
from analysis.load import AnalysisError, load_curves, load_results
from analysis.stats import bootstrap_ci
from analysis.tasks import EPISODE_KEYS, TOKEN_KEYS, cumulative
from harness.store import CORRUPT

FORMATS = ("png", "svg")
N_BOOT = 1000
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "<", ">")
LINESTYLES = ("-", "--", "-.", ":")
X_LABELS = {"update": "update", "episodes": "episodes generated", "tokens": "generated tokens"}
RATE = re.compile(r"(success|_rate|_frac|constrained_mass)$")
RATE_SPAN = 0.5  # the least height of a rate axis: a step of 1/8 is a quarter of the panel at most
NONNEGATIVE = re.compile(r"(kl_k3|kl_k2|entropy|_std|tokens|episodes|turns|mi_estimate|rounds)$")


@dataclass(frozen=True)
class Family:
    name: str  # file stem
    title: str
    panels: tuple[tuple[str, tuple[str, ...]], ...]  # (panel title, candidate metrics: first logged wins)
    x: tuple[str, ...]  # x axes, one row of panels each: update, episodes, tokens


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
)
CURVE_DEFAULTS = ("eval_greedy/success", "env/success")


@dataclass(frozen=True)
class LineStyle:
    color: tuple
    linestyle: str
    marker: str
    hollow: bool


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "_", name).strip("_")


def bands(data: pd.DataFrame, n_boot: int = N_BOOT) -> pd.DataFrame:
    """Mean and 95% percentile-bootstrap CI over seeds per (label, update): the table's definition
    (analysis.stats), vectorized per point."""
    rows = []
    for label, g in data.groupby("label", sort=False):
        order = np.argsort(g["update"].to_numpy(), kind="stable")
        updates, values = g["update"].to_numpy()[order], g["value"].to_numpy()[order]
        keys, starts = np.unique(updates, return_index=True)
        for update, chunk in zip(keys, np.split(values, starts[1:])):
            e = bootstrap_ci(chunk, n_boot=n_boot)
            rows.append((label, update, e.value, e.lo, e.hi))
    return pd.DataFrame(rows, columns=["label", "update", "mean", "lo", "hi"])


def line_styles(results: pd.DataFrame) -> dict[str, LineStyle]:
    """Per label: colour, line style, marker. Two axes: colour = first axis, style and marker =
    second; otherwise one colour and marker per cell. Other base configs: hollow markers."""
    meta = results.attrs["sweep"]
    first = results.drop_duplicates("label")
    grid = len(meta.axes) == 2
    if grid:
        v0 = list(dict.fromkeys(str(v) for v in first[meta.axes[0]]))
        v1 = list(dict.fromkeys(str(v) for v in first[meta.axes[1]]))
    n_colors = len(v0) if grid else len(first)
    palette = sns.color_palette("colorblind" if n_colors <= 10 else "husl", n_colors=max(n_colors, 1))
    out = {}
    for i, (_, r) in enumerate(first.iterrows()):
        foreign = bool(r["group_label"])
        if grid:
            j = v1.index(str(r[meta.axes[1]]))
            c, ls, mk = palette[v0.index(str(r[meta.axes[0]]))], LINESTYLES[j % 4], MARKERS[j % len(MARKERS)]
        else:
            c, ls, mk = palette[i], ":" if foreign else "-", MARKERS[i % len(MARKERS)]
        out[r["label"]] = LineStyle(tuple(c), ls, mk, foreign)
    return out


def _handle(st: LineStyle) -> Line2D:
    face = "white" if st.hollow else st.color
    return Line2D([], [], color=st.color, linestyle=st.linestyle, marker=st.marker, markerfacecolor=face)


def _x_positions(b: pd.DataFrame, x: str, curves: pd.DataFrame, results: pd.DataFrame) -> pd.Series:
    """The x value of every (label, update) band row: the update, or the mean cumulative count
    (episodes or tokens) of the label's seeds at that update."""
    if x == "update":
        return b["update"].astype(float)
    totals = cumulative(curves, EPISODE_KEYS if x == "episodes" else TOKEN_KEYS)
    label_of = dict(zip(results["point"], results["label"]))
    rows = [(label_of.get(p), u, v) for p, s in totals.items() for u, v in s.items()]
    mean = pd.DataFrame(rows, columns=["label", "update", "x"]).groupby(["label", "update"])["x"].mean()
    return pd.Series([mean.get((lab, u), np.nan) for lab, u in zip(b["label"], b["update"])], index=b.index)


def _ylim(ax, metric: str, b: pd.DataFrame) -> None:
    """Rates: whole tenths around the data, at least RATE_SPAN tall, within [0, 1]; non-negative
    quantities from 0; others the data with a margin. A small step never fills the panel."""
    vals = pd.concat([b["mean"], b["lo"], b["hi"]]).dropna()
    if vals.empty:
        return
    lo, hi = float(vals.min()), float(vals.max())
    if RATE.search(metric):
        lo, hi = max(0.0, np.floor(lo * 10) / 10), min(1.0, np.ceil(hi * 10) / 10)
        if hi - lo < RATE_SPAN:  # widen around the data's middle, staying inside [0, 1]
            lo = min(max(0.0, (lo + hi - RATE_SPAN) / 2), 1.0 - RATE_SPAN)
            hi = lo + RATE_SPAN
        ax.set_ylim(lo - 0.03, hi + 0.03)
        return
    if NONNEGATIVE.search(metric) and lo >= 0:
        lo = 0.0
    span = hi - lo if hi > lo else max(abs(hi) * 0.1, 0.05)
    ax.set_ylim(lo - 0.05 * span, hi + 0.1 * span)


def _count(v: float, _pos=None) -> str:
    return f"{v / 1e6:g}M" if abs(v) >= 1e6 else f"{v / 1e3:g}k" if abs(v) >= 1e3 else f"{v:g}"


def _panel(ax, data, metric, x, styles, curves, results, collapses) -> set[str]:
    """One metric against one x axis; returns the labels drawn."""
    b = bands(data)
    if b.empty:
        ax.text(0.5, 0.5, "not logged", transform=ax.transAxes, ha="center", va="center", color="0.5")
        return set()
    b["x"] = _x_positions(b, x, curves, results)
    for label, g in b.dropna(subset=["x"]).groupby("label", sort=False):
        st = styles[label]
        face = "white" if st.hollow else st.color
        every = max(1, len(g) // 10)
        ax.plot(
            g["x"],
            g["mean"],
            color=st.color,
            linestyle=st.linestyle,
            marker=st.marker,
            markersize=4,
            markerfacecolor=face,
            markevery=every,
            linewidth=1.4,
        )
        ax.fill_between(g["x"], g["lo"], g["hi"], color=st.color, alpha=0.15, linewidth=0)
    for _, r in collapses.iterrows() if x == "update" else ():
        ax.axvline(r["collapsed_at"], color=styles[r["label"]].color, linestyle=":", linewidth=1.2)
    _ylim(ax, metric, b)
    ax.set_xlabel(X_LABELS[x])
    if x == "update":
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    else:
        ax.xaxis.set_major_formatter(FuncFormatter(_count))
        ax.xaxis.set_major_locator(MaxNLocator(nbins=5))
    ax.grid(alpha=0.3, linewidth=0.5)
    return set(b["label"])


# ----------------------------------------------------------------------------- titles
def _median(curves: pd.DataFrame, metric: str) -> float | None:
    v = curves.loc[curves["metric"] == metric, "value"]
    return float(v.median()) if len(v) else None


def _config(results: pd.DataFrame, key: str) -> str | None:
    vals = pd.to_numeric(results.get(key, pd.Series(dtype=float)), errors="coerce").dropna().unique()
    return "/".join(f"{v:g}" for v in sorted(vals)) if len(vals) else None


def _details(family: Family, curves: pd.DataFrame, results: pd.DataFrame) -> str:
    """What the figure's numbers are: split, tasks, decoding, episodes per evaluation or update."""
    first = family.panels[0][1][0]
    if first.startswith("eval_"):
        eps = _median(curves, "eval_greedy/episodes") or _median(curves, "eval_sampled/episodes")
        eps_text = f"{eps:g}" if eps else _config(results, "train.eval_episodes")
        tasks, every = _config(results, "env.heldout_tasks"), _config(results, "train.eval_every")
        parts = [f"held-out split of {tasks} tasks" if tasks else "held-out split"]
        parts.append(f"{eps_text} episodes per evaluation, greedy and sampled decoding" if eps_text else "")
        parts.append(f"evaluated every {every} updates and at the end" if every and every != "0" else "")
        return ", ".join(p for p in parts if p)
    if first.startswith("env/"):
        eps = _median(curves, "perf/episodes") or _median(curves, "env/episodes")
        return f"{eps:g} episodes per update, sampled decoding" if eps else "sampled decoding"
    return "per update, from the training batches"


def _title(family: Family, curves, results, n_collapse: int) -> str:
    meta = results.attrs["sweep"]
    seeds = int(results.groupby("label")["point"].count().max()) if len(results) else 0
    what = (
        f"Lines: mean over {seeds} seeds; bands: 95% bootstrap CI over seeds"
        if seeds > 1
        else "Lines: 1 seed (no CI band)"
    )
    marks = f"; dotted verticals: collapse detected ({n_collapse} runs)" if n_collapse else ""
    return f"{meta.name}: {family.title} ({_details(family, curves, results)}). {what}{marks}."


# ----------------------------------------------------------------------------- figures
def _shape(family: Family, n_panels: int) -> tuple[int, int]:
    if len(family.x) > 1:
        return len(family.x), n_panels
    cols = 2 if n_panels == 4 else min(n_panels, 3)
    return -(-n_panels // cols), cols


def family_figure(family: Family, curves: pd.DataFrame, results: pd.DataFrame) -> Figure | None:
    """The family's panels that some point logged, one row per x axis with data; None if none."""
    logged = set(curves["metric"].unique())
    chosen = [(t, next(m for m in c if m in logged)) for t, c in family.panels if any(m in logged for m in c)]
    if not chosen:
        return None
    xs = [x for x in family.x if x == "update" or cumulative(curves, EPISODE_KEYS if x == "episodes" else TOKEN_KEYS)]
    fam = Family(family.name, family.title, family.panels, tuple(xs))
    rows, cols = _shape(fam, len(chosen))
    fig, axes = panels(rows, cols)
    styles = line_styles(results)
    collapses = results.dropna(subset=["collapsed_at"]) if family.name == "diagnostics" else results.iloc[:0]
    drawn: set[str] = set()
    flat = [ax for row in axes for ax in row]
    for i, (title, metric) in enumerate(chosen):
        for j, x in enumerate(xs):
            ax = axes[j][i] if len(xs) > 1 else flat[i]
            drawn |= _panel(ax, curves[curves["metric"] == metric], metric, x, styles, curves, results, collapses)
            ax.set_title(f"{title} vs {X_LABELS[x]}" if len(xs) > 1 else title, fontsize=10)
            ax.set_ylabel(metric, fontsize=9)
    for ax in flat[len(chosen) * (1 if len(xs) == 1 else len(xs)) :]:
        ax.set_visible(False)
    labels = [lab for lab in styles if lab in drawn]
    meta = results.attrs["sweep"]
    by_value = (
        all(lab.split(" [")[0] == str(v) for lab, v in zip(results["label"], results[meta.axes[0]]))
        if len(meta.axes) == 1
        else False
    )  # the labels are the axis values: the legend's title names the axis
    legend_title = short_axis_names(meta.axes)[meta.axes[0]] if by_value else None
    title = _title(fam, curves, results, len(collapses))
    return finish(fig, axes, [_handle(styles[lab]) for lab in labels], labels, title, legend_title)


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
    out = {}
    for fam in fams:
        fig = family_figure(fam, curves, results)
        if fig is not None:
            out[fam.name] = fig
    return out


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
    out = Path(out_dir) if out_dir else Path(path) / "plots"
    return {name: save(fig, out, name, formats) for name, fig in figures(path, metrics).items()}
