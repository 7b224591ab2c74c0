"""Figures of a sweep: learning curves with 95% CI bands over seeds per axis value, and a
diagnostics panel (KL, entropy, MI estimate, in-group reward std) with collapse markers.

Figures are built on `matplotlib.figure.Figure` objects (no pyplot, no display, no global
backend switch) and saved as PNG and SVG. Bands are the 95% percentile-bootstrap CI over the
seeds logged at each update (analysis.stats, fixed seed: the figure is reproducible); an update
logged by one seed only has no band.
"""

from __future__ import annotations

import re
from pathlib import Path

import matplotlib
import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.figure import Figure

from analysis.integrity import CORRUPT
from analysis.load import AnalysisError, load_curves, load_results
from analysis.stats import bootstrap_ci

# Panel title -> candidate metric names, first present wins.
DIAGNOSTICS = {
    "KL to reference (k3)": ("diag/kl_k3",),
    "entropy": ("diag/entropy", "loss/entropy"),
    "MI estimate": ("diag/mi_estimate",),
    "in-group reward std": ("env/group_reward_std",),
}
CURVE_DEFAULTS = ("eval_greedy/success", "env/success")
FORMATS = ("png", "svg")
N_BOOT = 1000


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "_", name).strip("_")


def _palette(labels: list[str]) -> dict[str, tuple]:
    colors = sns.color_palette("colorblind", n_colors=max(len(labels), 1))
    return dict(zip(labels, colors))


def _save(fig: Figure, out_dir: Path, stem: str) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    with matplotlib.rc_context({"svg.hashsalt": "harness", "svg.fonttype": "none"}):
        for fmt in FORMATS:
            p = out_dir / f"{stem}.{fmt}"
            fig.savefig(p, format=fmt, dpi=150, metadata={"Date": None} if fmt == "svg" else {"Software": None})
            paths.append(p)
    return paths


def bands(data: pd.DataFrame, n_boot: int = N_BOOT) -> pd.DataFrame:
    """Mean and 95% percentile-bootstrap CI over seeds per (label, update): the table's definition
    (analysis.stats), vectorized per point, unlike seaborn's per-resample Python loop."""
    rows = []
    for label, g in data.groupby("label", sort=False):
        order = np.argsort(g["update"].to_numpy(), kind="stable")
        updates, values = g["update"].to_numpy()[order], g["value"].to_numpy()[order]
        keys, starts = np.unique(updates, return_index=True)
        for update, chunk in zip(keys, np.split(values, starts[1:])):
            e = bootstrap_ci(chunk, n_boot=n_boot)
            rows.append((label, update, e.value, e.lo, e.hi))
    return pd.DataFrame(rows, columns=["label", "update", "mean", "lo", "hi"])


def _lines(ax, data: pd.DataFrame, palette: dict, legend: bool) -> None:
    b = bands(data)
    sns.lineplot(
        data=b,
        x="update",
        y="mean",
        hue="label",
        hue_order=list(palette),
        palette=palette,
        errorbar=None,
        ax=ax,
        legend=legend,
    )
    for label, g in b.groupby("label", sort=False):
        ax.fill_between(g["update"], g["lo"], g["hi"], color=palette[label], alpha=0.2, linewidth=0)


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


def plot_learning_curves(curves: pd.DataFrame, results: pd.DataFrame, metric: str, out_dir: Path) -> list[Path]:
    """Mean `metric` vs update per axis value with a 95% CI band over seeds."""
    labels = list(dict.fromkeys(results["label"]))
    data = curves[curves["metric"] == metric]
    fig = Figure(figsize=(6, 4), layout="constrained")
    ax = fig.add_subplot()
    _lines(ax, data, _palette(labels), legend=True)
    meta = results.attrs["sweep"]
    ax.set(xlabel="update", ylabel=metric)
    ax.set_title(f"{meta.name}: {metric}\n(mean, 95% CI over seeds)", fontsize="medium")  # two lines: long names fit
    if ax.get_legend() is not None:
        ax.get_legend().set_title(", ".join(meta.axes) or None)
    return _save(fig, out_dir, f"curves_{_safe(metric)}")


def plot_diagnostics(curves: pd.DataFrame, results: pd.DataFrame, out_dir: Path) -> list[Path]:
    """One panel per diagnostic present; dotted vertical lines where a run's collapse detector fired."""
    logged = set(curves["metric"].unique())
    panels = {
        t: next(m for m in cands if m in logged) for t, cands in DIAGNOSTICS.items() if any(m in logged for m in cands)
    }
    if not panels:
        return []
    labels = list(dict.fromkeys(results["label"]))
    palette = _palette(labels)
    fig = Figure(figsize=(5 * min(len(panels), 2), 3.5 * ((len(panels) + 1) // 2)), layout="constrained")
    axes = fig.subplots((len(panels) + 1) // 2, min(len(panels), 2), squeeze=False).ravel()
    collapses = results.dropna(subset=["collapsed_at"])
    for i, (ax, (title, metric)) in enumerate(zip(axes, panels.items())):
        _lines(ax, curves[curves["metric"] == metric], palette, legend=i == 0)
        for _, r in collapses.iterrows():
            ax.axvline(r["collapsed_at"], color=palette.get(r["label"], "k"), linestyle=":", linewidth=1.2)
        ax.set(xlabel="update", ylabel=metric, title=title)
        if ax.get_legend() is not None:
            ax.get_legend().set_title(", ".join(results.attrs["sweep"].axes) or None)
    for ax in axes[len(panels) :]:
        ax.set_visible(False)
    meta = results.attrs["sweep"]
    note = f"; dotted lines: collapse detected ({len(collapses)} runs)" if len(collapses) else ""
    fig.suptitle(f"{meta.name}: diagnostics (mean, 95% CI over seeds{note})")
    return _save(fig, out_dir, "diagnostics")


def make_plots(
    path: str | Path, metrics: list[str] | None = None, out_dir: str | Path | None = None
) -> dict[str, list[Path]]:
    """Write every figure of a results folder (default into <results>/plots; failed and corrupt points left out).
    Returns {"curves_<metric>": [png, svg], ..., "diagnostics": [png, svg]}."""
    results = load_results(path)
    # failed runs stop early for reasons unrelated to the method, corrupt ones hold damaged rows: left out
    curves = load_curves(path, results[~results["status"].isin(("failed", CORRUPT))])
    out = Path(out_dir) if out_dir else Path(path) / "plots"
    figures: dict[str, list[Path]] = {}
    for m in metrics or [None]:
        metric = curve_metric(curves, m)
        figures[f"curves_{_safe(metric)}"] = plot_learning_curves(curves, results, metric, out)
    diag = plot_diagnostics(curves, results, out)
    if diag:
        figures["diagnostics"] = diag
    return figures
