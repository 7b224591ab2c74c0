"""What a figure's lines are made of: the mean and 95% interval over seeds per (label, update), the
optional moving average of each seed's series, the x position of every line point (update,
episodes, tokens, or the share of an SFT/RL budget spent), and which lines are identical.

The band is analysis.intervals.seed_interval, the table's interval over seeds (one method,
docs/algorithms.md#statistics); with smoothing, each seed's series is averaged first and the band
is the interval of the smoothed values, so it stays an interval of what the line shows.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from analysis.intervals import seed_interval
from analysis.tasks import EPISODE_KEYS, TOKEN_KEYS, cumulative

BUDGET_KEYS = ("sft.budget", "sft.demos", "sft.demo_cost")


def smooth(data: pd.DataFrame, window: int) -> pd.DataFrame:
    """Each point's series (columns point, update, value) replaced by its centred moving average
    over `window` updates (fewer at the ends); window 1: unchanged."""
    if window <= 1 or data.empty:
        return data
    data = data.sort_values(["point", "update"], kind="stable")
    rolled = data.groupby("point", sort=False)["value"].transform(
        lambda v: v.rolling(window, center=True, min_periods=1).mean()
    )
    return data.assign(value=rolled)


def bands(data: pd.DataFrame) -> pd.DataFrame:
    """Mean and 95% t interval over seeds per (label, update) (analysis.intervals.seed_interval)."""
    rows = []
    for label, g in data.groupby("label", sort=False):
        order = np.argsort(g["update"].to_numpy(), kind="stable")
        updates, values = g["update"].to_numpy()[order], g["value"].to_numpy()[order]
        keys, starts = np.unique(updates, return_index=True)
        for update, chunk in zip(keys, np.split(values, starts[1:])):
            e = seed_interval(chunk)
            rows.append((label, update, e.value, e.lo, e.hi))
    return pd.DataFrame(rows, columns=["label", "update", "mean", "lo", "hi"])


def has_budget(results: pd.DataFrame) -> bool:
    """Every point is an SFT/RL split under a budget (sft.budget set): its x axis can be the budget's share."""
    if not all(k in results for k in BUDGET_KEYS):
        return False
    return bool(pd.to_numeric(results["sft.budget"], errors="coerce").notna().all())


def x_positions(b: pd.DataFrame, x: str, curves: pd.DataFrame, results: pd.DataFrame) -> pd.Series:
    """The x value of every (label, update) band row: the update; or the mean over the label's seeds
    of the cumulative count (episodes or tokens) at that update; or, for `budget`, the share of
    sft.budget spent: the demonstrations (sft.demos x sft.demo_cost episodes) and then RL's episodes."""
    if x == "update":
        return b["update"].astype(float)
    totals = cumulative(curves, TOKEN_KEYS if x == "tokens" else EPISODE_KEYS)
    label_of = dict(zip(results["point"], results["label"]))
    offset, scale = {}, {}
    if x == "budget":
        for _, r in results.iterrows():
            budget = float(r["sft.budget"])
            offset[r["point"]], scale[r["point"]] = float(r["sft.demos"]) * float(r["sft.demo_cost"]), budget
    rows = [
        (label_of.get(p), u, (offset.get(p, 0.0) + v) / scale.get(p, 1.0))
        for p, s in totals.items()
        for u, v in s.items()
    ]
    mean = pd.DataFrame(rows, columns=["label", "update", "x"]).groupby(["label", "update"])["x"].mean()
    return pd.Series([mean.get((lab, u), math.nan) for lab, u in zip(b["label"], b["update"])], index=b.index)


def identical_to(curves: pd.DataFrame, metrics: list[str], labels: list[str]) -> dict[str, str]:
    """{label: an earlier label} for every label whose per-seed values of `metrics` are exactly those
    of an earlier one (its line would hide under the other's)."""
    sub = curves[curves["metric"].isin(metrics)]
    seen: dict[tuple, str] = {}
    out = {}
    for label in labels:
        g = sub[sub["label"] == label]
        if g.empty:
            continue
        key = tuple(sorted(zip(g["metric"], g["seed"].astype(str), g["update"], g["value"])))
        if key in seen:
            out[label] = seen[key]
        else:
            seen[key] = label
    return out
