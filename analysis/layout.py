"""Figure layout in inches: fixed panel sizes, the legend in a column of its own to the right of
the panels, the title wrapped above them. Nothing is left to a layout engine, so no panel can be
squeezed by a long legend or title, and no legend can cover a curve.

Usage: `fig, axes = panels(rows, cols)`, draw into `axes[r][c]`, then `finish(fig, axes, handles,
labels, title, legend_title)` sizes the figure around what was drawn.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

DPI = 150


@dataclass(frozen=True)
class Box:
    """Sizes in inches."""

    panel_w: float = 3.3
    panel_h: float = 2.3
    left: float = 0.85  # y tick labels and the y label of the first column
    hgap: float = 0.95  # between columns: the next column's y labels
    vgap: float = 0.85  # between rows: x label, panel title of the next row
    bottom: float = 0.6
    panel_title: float = 0.35
    title_line: float = 0.24
    legend_gap: float = 0.3
    right: float = 0.35


BOX = Box()


def panels(rows: int, cols: int) -> tuple[Figure, list[list]]:
    """A figure with rows x cols axes, positioned later by `finish`."""
    fig = Figure(dpi=DPI)
    FigureCanvasAgg(fig)
    axes = [[fig.add_axes((0, 0, 1, 1)) for _ in range(cols)] for _ in range(rows)]
    return fig, axes


def _legend(fig: Figure, handles: list, labels: list[str], title: str | None):
    if not handles:
        return None, 0.0, 0.0
    ncol = 1 if len(handles) <= 18 else 2
    leg = fig.legend(
        handles, labels, loc="upper left", bbox_to_anchor=(0, 0), frameon=False, title=title, ncol=ncol, fontsize=9
    )
    leg._legend_box.align = "left"  # the title over the entries' left edge
    box = leg.get_window_extent(fig.canvas.get_renderer())
    return leg, box.width / fig.dpi, box.height / fig.dpi


def _place(fig: Figure, axes: list[list], leg, lw: float, lh: float, lines: list[str]) -> float:
    """Size the figure for `lines` of title and put every axes and the legend in place; returns
    the width in inches available to the title."""
    rows, cols = len(axes), len(axes[0])
    grid_w = BOX.left + cols * BOX.panel_w + (cols - 1) * BOX.hgap
    width = grid_w + (BOX.legend_gap + lw if leg is not None else 0) + BOX.right
    top = BOX.title_line * len(lines) + 0.15 + BOX.panel_title
    height = top + max((rows - 1) * BOX.vgap + rows * BOX.panel_h, lh) + BOX.bottom
    fig.set_size_inches(width, height)
    for r, row in enumerate(axes):
        for c, ax in enumerate(row):
            x0 = BOX.left + c * (BOX.panel_w + BOX.hgap)
            y0 = height - top - BOX.panel_h - r * (BOX.panel_h + BOX.vgap)
            ax.set_position((x0 / width, y0 / height, BOX.panel_w / width, BOX.panel_h / height))
    if leg is not None:
        leg.set_bbox_to_anchor(((grid_w + BOX.legend_gap) / width, (height - top) / height), transform=fig.transFigure)
    fig.suptitle("\n".join(lines), x=BOX.left / width, y=1 - 0.08 / height, ha="left", va="top", fontsize=10)
    return width - BOX.left - BOX.right


def finish(
    fig: Figure, axes: list[list], handles: list, labels: list[str], title: str, legend_title: str | None = None
) -> Figure:
    """Place every axes at its fixed size, the legend to the right, the title wrapped on top (the
    wrap narrows until the drawn title fits the figure's width)."""
    leg, lw, lh = _legend(fig, handles, labels, legend_title)
    chars = 200
    for _ in range(12):
        lines = textwrap.wrap(title, width=chars)
        room = _place(fig, axes, leg, lw, lh, lines)
        drawn = fig._suptitle.get_window_extent(fig.canvas.get_renderer()).width / fig.dpi
        if drawn <= room:
            break
        chars = max(30, int(chars * room / drawn) - 2)
    return fig


def overlaps(fig: Figure, min_panel_in: float = 1.5) -> list[str]:
    """Problems a reader would see in the drawn figure: a legend or the title over an axes (its
    tick labels and titles included) or cut by the figure's edge, or an axes smaller than
    `min_panel_in` inches. Empty = fine."""
    renderer = fig.canvas.get_renderer()
    fig.draw(renderer)
    visible = [ax for ax in fig.axes if ax.get_visible()]
    problems = []
    for i, ax in enumerate(visible):
        box = ax.get_window_extent(renderer)
        if box.width < min_panel_in * fig.dpi or box.height < min_panel_in * fig.dpi:
            problems.append(f"axes {i} is {box.width / fig.dpi:.2f} x {box.height / fig.dpi:.2f} in")
    others = [("legend", leg) for leg in fig.legends] + [("legend", ax.get_legend()) for ax in visible]
    title = getattr(fig, "_suptitle", None)
    if title is not None:
        others.append(("title", title))
    for name, artist in others:
        if artist is None:
            continue
        box = artist.get_window_extent(renderer)
        if box.x0 < 0 or box.y0 < 0 or box.x1 > fig.bbox.x1 + 0.5 or box.y1 > fig.bbox.y1 + 0.5:
            problems.append(f"{name} extends past the figure's edge")
        for i, ax in enumerate(visible):
            if box.overlaps(ax.get_tightbbox(renderer)):
                problems.append(f"{name} overlaps axes {i}")
    return problems
