"""Cells of a sweep: the seeds of one variant within one config group, their labels and baselines.

A cell is keyed by the runner's variant slug (else the axis values), suffixed with the config
group's differing keys for points of another base config (analysis.configs). Each group has its
own baseline cell (the baseline's axis values within the group); differences are only ever taken
within a group.
"""

from __future__ import annotations

import json
import math
from typing import Any

import pandas as pd


def format_value(v: Any) -> str:
    """Axis value as shown in labels and tables (stable, compact)."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if v is None:
        return "null"
    if isinstance(v, float):
        return "null" if math.isnan(v) else f"{v:g}"  # NaN: a null the table's column could not hold
    if v == "":
        return '""'
    if isinstance(v, (list, dict)):
        return json.dumps(v, separators=(",", ":"), sort_keys=True)
    return str(v)


def short_axis_names(axes: list[str]) -> dict[str, str]:
    """'algo.clip.level' -> 'clip.level' (last two parts), the full key where that is ambiguous."""
    short = {a: ".".join(a.split(".")[-2:]) for a in axes}
    if len(set(short.values())) < len(short):
        return {a: a for a in axes}
    return short


def cell_key(row: pd.Series | dict, axes: list[str]) -> str:
    return " | ".join(format_value(row.get(a)) for a in axes) if axes else "all"


def axis_label(row: pd.Series | dict, axes: list[str], with_keys: bool = False) -> str:
    """'ppo' for one axis (unless with_keys), 'clip.level=ppo, agg=token-mean' for several, 'all'
    for none."""
    if not axes:
        return "all"
    if len(axes) == 1 and not with_keys:
        return format_value(row.get(axes[0]))
    short = short_axis_names(axes)
    return ", ".join(f"{short[a]}={format_value(row.get(a))}" for a in axes)


def _baselines(keys, by_axes, groups, flagged, wanted, meta) -> dict[str, str | None]:
    """{group: its baseline cell}; the sweep's own group ('') falls back to its first cell."""
    out: dict[str, str | None] = {}
    for k, g, f in zip(keys, groups, flagged):
        if g == "" and f is True:
            out.setdefault("", k)
    for k, a, g in zip(keys, by_axes, groups):
        if a == wanted:
            out.setdefault(g, k)
    own = [k for k, g in zip(keys, groups) if g == ""]
    if "" not in out and own:
        if meta.baseline:
            meta.problems.append(f"baseline {meta.baseline} matches no point; using the first point's cell")
        out[""] = own[0]
    return out


def add_cells(df: pd.DataFrame, meta) -> pd.DataFrame:
    """Add `cell`, `label`, `is_baseline` (the sweep's baseline cell), `baseline_cell` (the
    baseline of the row's config group, or None) and `group_label`; order rows by group (the
    sweep's own first), then baseline cell first, then sweep order, then seed."""
    axes = meta.axes
    by_axes = [cell_key(r, axes) for _, r in df.iterrows()]
    groups = [g or "" for g in df["config_group"]]
    short_groups = [g or "" for g in df["group_label"]]
    keys = [v if isinstance(v, str) and v else k for v, k in zip(df["_variant"], by_axes)]
    keys = [f"{k} [{g}]" if g else k for k, g in zip(keys, groups)]
    wanted = cell_key(meta.baseline, axes) if meta.baseline else None
    base = _baselines(keys, by_axes, groups, list(df["_is_baseline"]), wanted, meta)
    # an axis with one value in every point (a grid key listed with a single value) tells no two
    # cells apart, and a grid point is named by the axes its overrides set ('turns.max=8', not the
    # defaults of keys only other points vary); the table keeps a column for every axis
    varying = [a for a in axes if len({format_value(v) for v in df[a]}) > 1] or axes
    labels: dict[str, str] = {}
    for k, lab, g, (_, r) in zip(keys, df["_sweep_label"], short_groups, df.iterrows()):
        named = isinstance(lab, str) and bool(lab)
        if k not in labels or named:  # a label the sweep gave wins over the axis values
            shown = [a for a in varying if a in r["_own_axes"]] or varying
            text = lab if named else axis_label(r, shown, with_keys=shown != axes)
            labels[k] = text + (f" [{g}]" if g else "")
    if len(set(labels.values())) < len(labels):  # axis values do not tell two variants apart
        labels = {k: k for k in labels}
    group_order = list(dict.fromkeys([""] + groups))
    order = list(dict.fromkeys([base.get(g) for g in group_order if base.get(g)] + keys))
    df["cell"] = keys
    df["label"] = [labels[k] for k in keys]
    df["is_baseline"] = [k == base.get("") for k in keys]
    df["baseline_cell"] = [base.get(g) for g in groups]
    df["_order"] = [(group_order.index(g), order.index(k)) for g, k in zip(groups, keys)]
    df = df.sort_values(["_order", "seed"], kind="stable", na_position="last")
    return df.drop(columns=["_order", "_sweep_label", "_variant", "_is_baseline", "_own_axes"]).reset_index(drop=True)
