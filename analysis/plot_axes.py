"""The axes of a figure's panels (limits, scales, ticks) and the words of its title (split, tasks,
decoding, episodes), apart from the drawing itself (analysis.plot)."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd
from matplotlib.ticker import FuncFormatter, MaxNLocator, PercentFormatter

X_LABELS = {
    "update": "update",
    "episodes": "episodes generated",
    "tokens": "generated tokens",
    "budget": "share of sft.budget spent",
}
RATE = re.compile(r"(success|_rate|_frac|constrained_mass)$")
RATE_SPAN = 0.5  # the least height of a rate axis: a step of 1/8 is a quarter of the panel at most
NONNEGATIVE = re.compile(r"(k3|kl_k2|entropy|_std|tokens|episodes|turns|mi_estimate|rounds)$")
KL = re.compile(r"kl_k\d$")
AT_MOST_ONE = re.compile(r"_ess$")  # an effective sample size as a share of the tokens: in (0, 1]
TOO_TALL = 10.0  # a KL panel whose highest line peaks this many times above the median line's peak: symlog


def clipped(b: pd.DataFrame, metric: str) -> pd.DataFrame:
    """Bands drawn inside the quantity's range: a rate or an effective sample size in [0, 1], a
    non-negative quantity from 0."""
    if RATE.search(metric) or AT_MOST_ONE.search(metric):
        return b.assign(lo=b["lo"].clip(0, 1), hi=b["hi"].clip(0, 1))
    if NONNEGATIVE.search(metric):
        return b.assign(lo=b["lo"].clip(lower=0))
    return b


def ylim(ax, metric: str, b: pd.DataFrame) -> None:
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


def too_tall(metric: str, b: pd.DataFrame) -> bool:
    """A KL panel where one line's peak is TOO_TALL times the median line's peak."""
    if not KL.search(metric) or b["label"].nunique() < 2:
        return False
    peaks = b.groupby("label")["mean"].max()
    return bool(peaks.max() > TOO_TALL * max(float(peaks.median()), 1e-3))


def x_axis(ax, x: str) -> None:
    ax.set_xlabel(X_LABELS[x])
    if x == "update":
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    elif x == "budget":
        ax.xaxis.set_major_formatter(PercentFormatter(1.0, decimals=0))
        ax.set_xlim(0, max(1.0, ax.get_xlim()[1]) + 0.02)
    else:
        ax.xaxis.set_major_formatter(FuncFormatter(_count))
        ax.xaxis.set_major_locator(MaxNLocator(nbins=5))


def _median(curves: pd.DataFrame, metric: str) -> float | None:
    v = curves.loc[curves["metric"] == metric, "value"]
    return float(v.median()) if len(v) else None


def _config(results: pd.DataFrame, key: str) -> str | None:
    vals = pd.to_numeric(results.get(key, pd.Series(dtype=float)), errors="coerce").dropna().unique()
    return "/".join(f"{v:g}" for v in sorted(vals)) if len(vals) else None


def details(first: str, curves: pd.DataFrame, results: pd.DataFrame) -> str:
    """What a figure whose first metric is `first` shows: split, tasks, decoding, episodes per
    evaluation or update."""
    if first.startswith("eval_"):
        eps = _median(curves, "eval_greedy/episodes") or _median(curves, "eval_sampled/episodes")
        eps_text = f"{eps:g}" if eps else _config(results, "train.eval_episodes")
        tasks, every = _config(results, "env.heldout_tasks"), _config(results, "train.eval_every")
        updates = _config(results, "train.updates")
        parts = [f"held-out split of {tasks} tasks" if tasks else "held-out split"]
        parts.append(f"{eps_text} episodes per evaluation, greedy and sampled decoding" if eps_text else "")
        if every and every != "0" and every == updates:  # one evaluation after training: no "every"
            parts.append("evaluated before RL and after the last update")
        elif every and every != "0":
            parts.append(f"evaluated every {every} updates and at the end")
        return ", ".join(p for p in parts if p)
    if first.startswith("env/"):
        eps = curves.loc[curves["metric"] == "perf/episodes", "value"]
        if not len(eps) or not eps.median():  # records without perf/episodes
            eps = curves.loc[curves["metric"] == "env/episodes", "value"]
        if not len(eps) or not eps.median():
            return "sampled decoding"
        if eps.min() == eps.max():
            return f"{eps.median():g} episodes per update, sampled decoding"
        # dynamic sampling (DAPO refill rounds) plays a different number of episodes each update
        return f"{eps.min():g}-{eps.max():g} episodes per update, median {eps.median():g}, sampled decoding"
    return "per update, from the training batches"
