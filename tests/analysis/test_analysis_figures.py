"""Figures a reader reads at a glance: no legend or title over an axes, no collapsed axes, fixed
panel sizes, the point labels in the legend, grid sweeps in colour x line style, sane axes."""

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from PIL import Image
from synthetic import base_config, curve_rows, make_clip_sweep, write_point
from synthetic_tasks import add_other_config, make_task_sweep

from analysis.layout import BOX, DPI, overlaps
from analysis.plot import figures, save
from analysis.plot_axes import details

LONG = "a-rather-long-variant-label-that-names-three-settings"


def make_grid_sweep(root, levels=("token", "sequence", "none"), aggs=("token-mean", "seq-mean-token-mean")):
    points = []
    for i, level in enumerate(levels):
        for j, agg in enumerate(aggs):
            for seed in (0, 1):
                cfg = base_config(level, seed)
                cfg["algo"]["agg"] = agg
                pid = f"{level}-{agg}-{seed}"
                final = 0.125 * (i + 3 * j + 1)  # six distinct curves (equal ones say "identical to")
                write_point(root, pid, cfg, "done", {"final/eval_greedy/success": final}, curve_rows(final, seed, None))
                overrides = {"algo.clip.level": level, "algo.agg": agg}
                points.append(
                    {"id": pid, "variant": f"{level}-{agg}", "label": None, "seed": seed, "overrides": overrides}
                )
    axes = ["algo.clip.level", "algo.agg"]
    baseline = {"algo.clip.level": levels[0], "algo.agg": aggs[0]}
    (root / "sweep.json").write_text(
        json.dumps({"name": "grid", "axes": axes, "baseline": baseline, "seeds": [0, 1], "points": points})
    )
    return root


def make_many_cells(root, n=16):
    points = []
    for i in range(n):
        cfg = base_config(f"v{i}", 0)
        write_point(root, f"p{i}", cfg, "done", {"final/eval_greedy/success": 0.5}, curve_rows(i / n, 0, None))
        label = f"{LONG}-{i}"
        points.append(
            {"id": f"p{i}", "variant": f"v{i}", "label": label, "seed": 0, "overrides": {"algo.clip.level": f"v{i}"}}
        )
    (root / "sweep.json").write_text(
        json.dumps(
            {
                "name": "many",
                "axes": ["algo.clip.level"],
                "baseline": {"algo.clip.level": "v0"},
                "seeds": [0],
                "points": points,
            }
        )
    )
    return root


def add_probe_curves(root: Path) -> Path:
    """The clip sweep as a reward-hacking probe: its evaluation rows also carry the truth and the exploit."""
    for metrics in root.glob("*/metrics.jsonl"):
        rows = [json.loads(line) for line in metrics.read_text().splitlines()]
        for r in rows:
            if "eval_greedy/success" in r:
                for mode in ("greedy", "sampled"):
                    r[f"eval_{mode}/true_success"] = 0.8 * r["eval_greedy/success"]
                    r[f"eval_{mode}/exploit_rate"] = 0.2 + 0.1 * r["update"] / 10
        metrics.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root


@pytest.fixture(params=["clip", "tasks+other config", "grid", "many cells", "probe"])
def sweep_root(request, tmp_path):
    if request.param == "clip":
        return make_clip_sweep(tmp_path / "clip")
    if request.param == "probe":
        return add_probe_curves(make_clip_sweep(tmp_path / "probe"))
    if request.param == "grid":
        return make_grid_sweep(tmp_path / "grid")
    if request.param == "many cells":
        return make_many_cells(tmp_path / "many")
    root = make_task_sweep(tmp_path / "filters")
    add_other_config(root)
    return root


def test_no_legend_or_title_over_an_axes_and_no_collapsed_axes(sweep_root, tmp_path):
    figs = figures(sweep_root)
    assert {"evaluation", "diagnostics"} <= set(figs)
    assert ("probe" in figs) == (sweep_root.name == "probe")  # only a probe's runs log a truth
    for name, fig in figs.items():
        assert overlaps(fig) == [], name
        for ax in (a for a in fig.axes if a.get_visible()):  # every panel at the fixed size
            box = ax.get_window_extent(fig.canvas.get_renderer())
            assert (box.width / DPI, box.height / DPI) == pytest.approx((BOX.panel_w, BOX.panel_h), abs=0.02), name
    (png,) = save(figs["evaluation"], tmp_path, "evaluation", ("png",))  # the saved file is the figure checked
    assert Image.open(png).size == pytest.approx(tuple(figs["evaluation"].get_size_inches() * DPI), abs=1)


def test_the_checker_catches_an_overlapping_legend_and_a_collapsed_axes():
    fig = Figure(figsize=(6, 4), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ax.plot([0, 1], [0, 1], label="ppo")
    ax.legend(title="algo.clip.level, algo.clip.eps_low, algo.clip.eps_high", loc="center")
    assert "legend overlaps axes 0" in overlaps(fig)
    squeezed = Figure(figsize=(5, 3), layout="constrained")
    FigureCanvasAgg(squeezed)
    axes = squeezed.subplots(1, 2)
    for i in range(12):
        axes[0].plot([0, 1], [i, i], label=f"{LONG}-{i}")
    squeezed.legend(loc="outside right upper")  # the layout engine gives up: the legend covers the panels
    with pytest.warns(UserWarning, match="constrained_layout not applied"):
        assert "legend overlaps axes 0" in overlaps(squeezed)
    tiny = Figure(figsize=(5, 3))
    FigureCanvasAgg(tiny)
    tiny.add_axes((0.1, 0.1, 0.8, 0.1))
    assert overlaps(tiny) == ["axes 0 is 4.00 x 0.30 in"]


def test_legend_names_points_by_label_and_grid_uses_colour_and_line_style(tmp_path):
    fig = figures(make_grid_sweep(tmp_path / "grid"))["evaluation"]
    (legend,) = fig.legends
    labels = [t.get_text() for t in legend.get_texts()]
    assert labels[0] == "clip.level=token, algo.agg=token-mean" and len(labels) == 6
    assert legend.get_title().get_text() == ""  # not the joined axis keys
    lines = {lab: h for lab, h in zip(labels, legend.legend_handles)}
    same_level = [
        lines["clip.level=token, algo.agg=token-mean"],
        lines["clip.level=token, algo.agg=seq-mean-token-mean"],
    ]
    assert same_level[0].get_color() == same_level[1].get_color()
    assert same_level[0].get_linestyle() != same_level[1].get_linestyle()
    assert same_level[0].get_marker() != same_level[1].get_marker()
    same_agg = [lines["clip.level=token, algo.agg=token-mean"], lines["clip.level=none, algo.agg=token-mean"]]
    assert same_agg[0].get_color() != same_agg[1].get_color()
    assert same_agg[0].get_linestyle() == same_agg[1].get_linestyle()


def test_axes_ticks_limits_and_titles(tmp_path):
    root = make_task_sweep(tmp_path / "filters")
    figs = figures(root)
    ev = figs["evaluation"]
    title = ev._suptitle.get_text().replace("\n", " ")
    assert "held-out split of 8 tasks, 8 episodes per evaluation, greedy and sampled decoding" in title
    assert "evaluated every 2 updates" in title and "mean over 3 seeds" in title
    panels = {ax.get_title(): ax for ax in ev.axes}
    assert set(panels) >= {"greedy success vs update", "greedy success vs episodes generated"}
    lo, hi = panels["greedy success vs update"].get_ylim()
    assert lo >= -0.03 and hi <= 1.03 and hi - lo >= 0.5  # never zoomed in so far that 1/8 is a cliff
    ticks = [t for t in panels["greedy success vs update"].get_xticks() if 0 <= t <= 4]
    assert all(float(t).is_integer() for t in ticks)
    diag = {ax.get_title(): ax for ax in figs["diagnostics"].axes}
    assert diag["KL to reference (k3)"].get_ylim()[0] <= 0  # a non-negative quantity is drawn from 0
    other = make_task_sweep(tmp_path / "f2")
    add_other_config(other)
    (legend,) = figures(other)["evaluation"].legends
    assert "dapo [train.updates=6]" in [t.get_text() for t in legend.get_texts()]


def test_caption_names_the_lines_with_fewer_seeds_in_a_partly_run_sweep(tmp_path):
    root = make_task_sweep(tmp_path / "filters")
    short = sorted(p for p in root.iterdir() if p.name.startswith("filter.name=dapo__"))
    assert len(short) == 3
    for p in short[1:]:  # the sweep stopped after dapo's first seed
        shutil.rmtree(p)
    title = figures(root)["evaluation"]._suptitle.get_text().replace("\n", " ")
    assert "mean over 3 seeds (dapo: 1 seed)" in title
    full = figures(make_task_sweep(tmp_path / "full"))["evaluation"]._suptitle.get_text().replace("\n", " ")
    assert "mean over 3 seeds;" in full and "seed)" not in full


def test_an_unshaded_band_does_not_stretch_the_y_axis(tmp_path):
    root = make_grid_sweep(tmp_path / "grid")  # six lines: only the baseline's band is shaded
    noisy = root / "none-seq-mean-token-mean-1" / "metrics.jsonl"
    rows = [json.loads(line) for line in noisy.read_text().splitlines()]
    for r in rows:
        r["diag/kl_k3"] = 0.02 * r["update"]  # seed 1 far from seed 0: a 1-df t band ~60x the line
    noisy.write_text("".join(json.dumps(r) + "\n" for r in rows))
    panels = {ax.get_title(): ax for ax in figures(root)["diagnostics"].axes}
    top = panels["KL to reference (k3)"].get_ylim()[1]
    line_peak = (0.02 * 10 + 0.001 * 10) / 2  # the noisy label's mean at the last update
    band_peak = line_peak + 12.71 * (0.02 * 10 - 0.001 * 10) / 2  # its unshaded t band's upper end
    assert line_peak < top < band_peak / 2


def test_caption_of_a_run_evaluated_only_before_and_after_training():
    curves = pd.DataFrame({"metric": ["eval_greedy/episodes"], "value": [128.0]})
    once = pd.DataFrame({"env.heldout_tasks": [128], "train.eval_every": [30], "train.updates": [30]})
    assert details("eval_greedy/success", curves, once).endswith("evaluated before RL and after the last update")
    often = once.assign(**{"train.eval_every": [10]})
    assert details("eval_greedy/success", curves, often).endswith("evaluated every 10 updates and at the end")


def test_caption_gives_the_range_when_refills_vary_the_episodes_per_update():
    fixed = pd.DataFrame({"metric": ["perf/episodes"] * 3, "value": [32.0, 32.0, 32.0]})
    assert details("env/success", fixed, pd.DataFrame()) == "32 episodes per update, sampled decoding"
    refilled = pd.DataFrame({"metric": ["perf/episodes"] * 4, "value": [16.0, 48.0, 32.0, 32.0]})
    caption = details("env/success", refilled, pd.DataFrame())
    assert caption == "16-48 episodes per update, median 32, sampled decoding"


def add_mismatch_curves(root: Path, stale: str | None) -> Path:
    """Every update logs the sampler-trainer mismatch: float32 rounding (k3 ~1e-12) everywhere, and
    a stale sampler's mismatch for the points of the `stale` clip level."""
    for metrics in root.glob("*/metrics.jsonl"):
        off = stale is not None and f"={stale}__" in metrics.parent.name
        seed = int(metrics.parent.name[-1])
        rows = [json.loads(line) for line in metrics.read_text().splitlines()]
        for r in rows:
            k3 = (0.01 + 0.02 * seed) if off and r["update"] > 0 else 1e-12
            r["diag/mismatch_k3"] = k3
            r["diag/mismatch_delta_p0_1"] = -40 * k3
            r["diag/mismatch_delta_p99_9"] = 20 * k3
            r["diag/mismatch_ess"] = 1.0 - 2 * k3  # seeds spread: a t band over 3 seeds reaches above 1
        metrics.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root


def test_mismatch_figure_only_for_off_policy_data(tmp_path):
    on_policy = add_mismatch_curves(make_clip_sweep(tmp_path / "on"), stale=None)
    assert "mismatch" not in figures(on_policy)  # float32 rounding is not a mismatch worth a figure
    stale = add_mismatch_curves(make_clip_sweep(tmp_path / "stale"), stale="dual")
    fig = figures(stale)["mismatch"]
    assert "sampler-trainer mismatch" in fig._suptitle.get_text().replace("\n", " ")
    panels = {ax.get_title(): ax for ax in fig.axes if ax.get_visible() and ax.get_title()}
    assert set(panels) == {
        "mismatch k3",
        "delta, 0.1% quantile",
        "delta, 99.9% quantile",
        "effective sample size of the weights",
    }
    assert panels["mismatch k3"].get_ylim()[0] <= 0 <= panels["mismatch k3"].get_ylim()[0] + 0.01
    ess = panels["effective sample size of the weights"]
    tops = [p.get_paths()[0].vertices[:, 1].max() for p in ess.collections if p.get_paths()]
    assert tops and max(tops) <= 1.0  # the seeds' band is cut at an ESS of 1


def test_relabelled_copies_get_lines_of_their_own():
    """Two axes whose values two cells share (an A/A sweep's baseline and its copy): one colour per cell."""
    from types import SimpleNamespace

    import pandas as pd

    from analysis.plot_style import line_styles

    axes = ["algo.correction.name", "algo.micro_batch_tokens"]
    df = pd.DataFrame(
        {
            "label": ["baseline", "baseline-copy", "tis", "mb512"],
            axes[0]: ["none", "none", "tis_token", "none"],
            axes[1]: [1024, 1024, 1024, 512],
            "group_label": ["", "", "", ""],
        }
    )
    df.attrs["sweep"] = SimpleNamespace(axes=axes)
    styles = line_styles(df)
    assert len({(s.color, s.linestyle, s.marker) for s in styles.values()}) == 4
    grid = df[df["label"] != "baseline-copy"].copy()  # a true grid keeps colour = first axis
    grid.attrs["sweep"] = df.attrs["sweep"]
    by_axis = line_styles(grid)
    assert by_axis["baseline"].color == by_axis["mb512"].color != by_axis["tis"].color
