"""The figures a reader could not use, drawn from synthetic folders shaped like the shipped sweeps
(synthetic_figures): small multiples for a 4 x 3 grid, a log-scale KL panel when one line blows
up, smoothed training curves, distinct colours and no stacked bands for 7 cells, "identical to X"
for identical lines, one panel per environment of a mixture, the SFT/RL budget's share as an x
axis, and the band being the table's t interval."""

from __future__ import annotations

import numpy as np
import pytest
import synthetic_figures as sf
from matplotlib.colors import to_rgb

from analysis.layout import overlaps
from analysis.plot import figures


def _legend(fig) -> list[str]:
    (legend,) = fig.legends
    return [t.get_text() for t in legend.get_texts()]


def _bands(ax) -> int:
    return sum(1 for c in ax.collections if c.__class__.__name__ in ("PolyCollection", "FillBetweenPolyCollection"))


def test_a_grid_of_many_cells_is_drawn_as_small_multiples(tmp_path):
    figs = figures(sf.offpolicy(tmp_path / "offpolicy"))
    ev = figs["evaluation"]
    visible = [ax for ax in ev.axes if ax.get_visible()]
    assert len(visible) == 2 * 4  # greedy and sampled success x staleness 0, 1, 2, 4
    titles = [ax.get_title() for ax in visible]
    assert "sampled success · rollout.staleness=4" in titles
    assert _legend(ev) == ["none", "tis_token", "icepop", "baseline: staleness=0, correction=none"]
    assert ev.legends[0].get_title().get_text() == "correction.name"
    for ax in visible:  # at most the 3 corrections of its column and the grey baseline
        assert len(ax.lines) <= 4 and _bands(ax) <= 1
    row = [ax for ax in visible if ax.get_title().startswith("sampled success")]
    assert len({ax.get_ylim() for ax in row}) == 1  # one y range per metric: columns compare
    assert "grey dashed: the baseline, in every column" in ev._suptitle.get_text().replace("\n", " ")
    assert overlaps(ev) == []


def test_a_blown_up_kl_goes_on_a_log_scale_and_training_curves_are_smoothed(tmp_path):
    figs = figures(sf.clipping(tmp_path / "clipping"))
    diag = {ax.get_title(): ax for ax in figs["diagnostics"].axes}
    assert diag["KL to reference (k3)"].get_yscale() == "symlog"
    assert diag["entropy"].get_yscale() == "linear"
    assert "KL on a symmetric log scale" in figs["diagnostics"]._suptitle.get_text().replace("\n", " ")
    title = figs["training"]._suptitle.get_text().replace("\n", " ")
    assert "5-update moving average of each seed" in title
    success = {ax.get_title(): ax for ax in figs["training"].axes}["success"]
    y = success.lines[0].get_ydata()  # the smoothed line moves less from update to update than the raw one
    assert np.abs(np.diff(y)).mean() < 0.05


def test_seven_cells_get_distinct_colours_and_only_the_baselines_band(tmp_path):
    ev = figures(sf.advantage(tmp_path / "advantage"))["evaluation"]
    (legend,) = ev.legends
    colours = [to_rgb(h.get_color()) for h in legend.legend_handles]
    gaps = [np.abs(np.subtract(a, b)).sum() for i, a in enumerate(colours) for b in colours[i + 1 :]]
    assert len(colours) == 7 and min(gaps) > 0.3  # no two lines in near-identical colours
    for ax in (a for a in ev.axes if a.get_visible()):
        assert _bands(ax) == 1  # the baseline's band, not seven stacked ones
    assert "band: the baseline's (grpo) 95% t interval" in ev._suptitle.get_text().replace("\n", " ")


def test_identical_lines_say_so_in_the_legend(tmp_path):
    figs = figures(sf.filtering(tmp_path / "filtering"))
    for name in ("evaluation", "training", "diagnostics"):
        labels = _legend(figs[name])
        assert "ragen-top-p (identical to dapo)" in labels and "dapo" in labels, name
        assert not any("identical" in lab for lab in labels if not lab.startswith("ragen-top-p")), name


def test_a_mixture_gets_one_panel_per_environment(tmp_path):
    figs = figures(sf.multitask(tmp_path / "multitask"))
    env = figs["environments"]
    titles = {ax.get_title() for ax in env.axes if ax.get_visible()}
    assert titles == {f"{e}, {m}" for e in ("frozenlake", "search", "sokoban") for m in ("sampled", "greedy")}
    assert overlaps(env) == []


def test_an_sft_rl_split_is_drawn_against_the_share_of_the_budget(tmp_path):
    ev = figures(sf.sft_rl_split(tmp_path / "sft_rl_split"))["evaluation"]
    ax = next(a for a in ev.axes if a.get_title() == "sampled success vs share of sft.budget spent")
    starts = sorted(line.get_xdata()[0] for line in ax.lines)
    assert starts == pytest.approx([0.2, 0.4, 0.6])  # 20, 40, 60 demonstrations x 10 episodes of 1000
    assert ax.xaxis.get_major_formatter()(0.5, 0) == "50%"
    assert "each line starts at its demonstrations' share" in ev._suptitle.get_text().replace("\n", " ")


def test_the_band_is_the_tables_t_interval_over_seeds(tmp_path):
    """A figure with at most 3 lines shades every band; the band at the last update is the t interval
    over the 3 seeds' values there, as in the table's per-seed columns."""
    import json

    from scipy import stats

    root = sf.sft_rl_split(tmp_path / "split")
    ev = figures(root)["evaluation"]
    ax = next(a for a in ev.axes if a.get_title() == "greedy success vs update")
    assert _bands(ax) == 3
    last = [
        json.loads((root / f"sft.demos=40__seed={s}" / "metrics.jsonl").read_text().splitlines()[-1])[
            "eval_greedy/success"
        ]
        for s in range(3)
    ]
    half = stats.t.ppf(0.975, 2) * np.std(last, ddof=1) / np.sqrt(3)
    band = ax.collections[0].get_paths()[0].vertices  # the baseline (first) cell's band, (x, y) rows
    at_end = band[band[:, 0] == sf.UPDATES, 1]
    assert at_end.max() == pytest.approx(min(1.0, np.mean(last) + half), abs=1e-9)
    assert at_end.min() == pytest.approx(np.mean(last) - half, abs=1e-9)


def test_no_figure_is_wider_than_two_panel_columns_and_its_legend(tmp_path):
    """The 4 x 3 off-policy grid wraps its staleness columns into blocks of two (it was 3208 px wide);
    a three-panel family wraps into two rows."""
    from analysis.layout import DPI
    from analysis.plot import MAX_COLUMNS

    figs = figures(sf.offpolicy(tmp_path / "offpolicy"))
    for name, fig in figs.items():
        assert fig.get_size_inches()[0] * DPI <= 1850, name  # two panels and the legend: about 1,800 px
        assert overlaps(fig) == [], name
    ev = figs["evaluation"]
    visible = [ax for ax in ev.axes if ax.get_visible()]
    assert len(visible) == 2 * 4 and len({round(ax.get_position().x0, 3) for ax in visible}) == MAX_COLUMNS
    training = figures(sf.clipping(tmp_path / "clipping"))["training"]
    shown = [ax for ax in training.axes if ax.get_visible()]
    assert len(shown) == 3 and len({round(ax.get_position().x0, 3) for ax in shown}) == 2


def test_a_point_where_every_seed_agrees_gets_no_band(tmp_path):
    """Before RL every seed starts from the same checkpoint: the band is not pinched to zero width at
    update 0 but starts at the first evaluation with a spread, and the title says why."""
    import json

    root = sf.sft_rl_split(tmp_path / "split")
    for metrics in root.glob("*/metrics.jsonl"):  # every seed the same value at update 0
        rows = [json.loads(x) for x in metrics.read_text().splitlines()]
        for r in rows:
            if r.get("update") == 0 and "eval_greedy/success" in r:
                r["eval_greedy/success"] = 0.5
        metrics.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    ev = figures(root)["evaluation"]
    ax = next(a for a in ev.axes if a.get_title() == "greedy success vs update")
    band = ax.collections[0].get_paths()[0].vertices
    assert band[:, 0].min() > 0  # no band at update 0
    title = ev._suptitle.get_text().replace("\n", " ")
    assert "no band where every seed has the same value, as at update 0" in title
