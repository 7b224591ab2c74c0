"""Colours, line styles and markers of a sweep's lines.

The palette is Okabe and Ito's (2008) colour-blind-safe set, reordered so that neighbours differ
in hue and lightness, with black and grey instead of its yellow, which vanishes on white; past
nine lines, husl hues. One axis: one colour and marker per cell. Two axes: colour = first axis,
line style and marker = second; in small multiples (one panel per value of the first axis) colour
= second axis; two cells with the same values of both (a relabelled copy) make it one colour per
cell. Points of another base config have hollow markers.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
import seaborn as sns
from matplotlib.lines import Line2D

MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "<", ">")
LINESTYLES = ("-", "--", "-.", ":")
PALETTE = (
    "#0072B2",  # blue
    "#E69F00",  # orange
    "#009E73",  # bluish green
    "#CC79A7",  # reddish purple
    "#000000",  # black
    "#56B4E9",  # sky blue
    "#D55E00",  # vermillion
    "#999999",  # grey
    "#8C6D1F",  # dark ochre (for Okabe-Ito's yellow)
)
BASELINE_GREY = "#777777"


@dataclass(frozen=True)
class LineStyle:
    color: tuple | str
    linestyle: str
    marker: str
    hollow: bool


def palette(n: int) -> list:
    return list(PALETTE[:n]) if n <= len(PALETTE) else sns.color_palette("husl", n_colors=n)


def line_styles(results: pd.DataFrame, by: int | None = None) -> dict[str, LineStyle]:
    """Per label: colour, line style, marker. `by` = the axis that colour encodes (small multiples:
    1); default: the first of two axes, else one colour per cell."""
    meta = results.attrs["sweep"]
    first = results.drop_duplicates("label")
    # a grid of two axes, unless two cells share both values (relabelled copies, as in an A/A sweep),
    # which its colour and line style could not tell apart: then one colour per cell
    grid = len(meta.axes) == 2 and len(first[meta.axes].astype(str).drop_duplicates()) == len(first)
    axis = by if by is not None else 0
    values = [list(dict.fromkeys(str(v) for v in first[a])) for a in meta.axes] if grid else []
    colors = palette(len(values[axis]) if grid else len(first))
    out = {}
    for i, (_, r) in enumerate(first.iterrows()):
        foreign = bool(r["group_label"])
        if grid and by is None:
            j = values[1].index(str(r[meta.axes[1]]))
            c, ls, mk = colors[values[0].index(str(r[meta.axes[0]]))], LINESTYLES[j % 4], MARKERS[j % len(MARKERS)]
        elif grid:
            k = values[axis].index(str(r[meta.axes[axis]]))
            c, ls, mk = colors[k], ":" if foreign else "-", MARKERS[k % len(MARKERS)]
        else:
            c, ls, mk = colors[i], ":" if foreign else "-", MARKERS[i % len(MARKERS)]
        out[r["label"]] = LineStyle(c, ls, mk, foreign)
    return out


def handle(st: LineStyle) -> Line2D:
    face = "white" if st.hollow else st.color
    return Line2D([], [], color=st.color, linestyle=st.linestyle, marker=st.marker, markerfacecolor=face)
