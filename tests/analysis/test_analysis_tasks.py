"""The table over seeds x tasks (eval_tasks.jsonl): known start, final, gain, Δ, Δ at equal episodes,
cost, MDE, captions, the per-seed fallback, other base configs in the folder, and the CLI."""

import io

import numpy as np
import pandas as pd
import pytest
import typer
from synthetic import make_clip_sweep
from synthetic_tasks import AXIS, SEEDS, TASKS, add_other_config, make_task_sweep, task_rows
from typer.testing import CliRunner

from analysis.intervals import grid_interval, pooled_design, seed_interval, separate_interval, sig2
from analysis.render import render
from analysis.table import table_for
from harness.cli.analysis import register


def data(root, *metrics, **kw) -> pd.DataFrame:
    return pd.read_csv(io.StringIO(render(table_for(root, list(metrics) or None, **kw), "csv"))).set_index(
        "filter.name"
    )


def grid(level: str, update: int, seeds=SEEDS, mode="greedy") -> np.ndarray:
    """(seeds, tasks) scores built from the fixture's rows, independently of analysis.tasks."""
    out = np.zeros((len(seeds), TASKS))
    for i, s in enumerate(seeds):
        rows = [r for r in task_rows(level, s, 4) if r["update"] == update and r["mode"] == mode]
        for r in rows:
            out[i, r["task"] - 100] += r["success"] / (1 if mode == "greedy" else 2)
    return out


@pytest.fixture
def sweep(tmp_path):
    return make_task_sweep(tmp_path / "filters")


def test_start_final_gain_and_delta_are_the_known_values(sweep):
    d = data(sweep)
    assert d.loc["none", "start"] == pytest.approx(7 / 24) and d.loc["none", "final"] == pytest.approx(13 / 24)
    assert d.loc["none", "gain"] == pytest.approx(0.25)
    assert d.loc["ragen_top_p", "delta"] == pytest.approx(0.25) and d.loc["dapo", "delta"] == pytest.approx(0.25)
    assert bool(d.loc["dapo", "delta:paired"]) and d.loc["dapo", "delta:n"] == 3
    gain = grid_interval(grid("none", 4) - grid("none", 0))  # the interval of the paired differences
    assert (d.loc["none", "gain:lo"], d.loc["none", "gain:hi"]) == pytest.approx((gain.lo, gain.hi))
    delta = grid_interval(grid("dapo", 4) - grid("none", 4))
    assert (d.loc["dapo", "delta:lo"], d.loc["dapo", "delta:hi"]) == pytest.approx((delta.lo, delta.hi))
    assert d.loc["none", "final:hi"] - d.loc["none", "final:lo"] > 0.2  # 8 tasks: the tasks' spread counts


def test_cost_and_the_compute_matched_delta(sweep):
    d = data(sweep)
    assert d.loc["dapo", "episodes"] == 160 and d.loc["none", "episodes"] == 64 and d.loc["dapo", "wall"] == 1500
    # dapo at the baseline's 64 episodes: 0.8 of the way from update 0 (0 episodes) to update 2 (80)
    assert d.loc["dapo", "equal_episodes_budget"] == 64
    assert d.loc["dapo", "delta@equal_episodes"] == pytest.approx((0.2 * 7 + 0.8 * 13) / 24 - 13 / 24)
    assert np.isnan(d.loc["ragen_top_p", "delta@equal_episodes"])  # same cost: nothing to match
    text = render(table_for(sweep), "markdown")
    dapo = next(line for line in text.splitlines() if line.startswith("| dapo"))
    assert "| -0.05 [" in dapo and "160 (×2.50)" in dapo and "25.0 min (×2.50)" in dapo
    assert "| same cost |" in next(line for line in text.splitlines() if line.startswith("| ragen_top_p"))


def test_caption_says_split_tasks_decoding_and_episodes(sweep):
    t = table_for(sweep)
    assert "held-out success rate, greedy decoding, 8 held-out tasks x 1 sample each (8 episodes per evaluation)" in (
        t.caption
    )
    assert "95% t interval from the two-way model of seeds and tasks" in t.caption and "after update 4" in t.caption
    s = table_for(sweep, ["final/eval_sampled/success"])
    assert "sampled decoding, 8 held-out tasks x 2 samples each (16 episodes per evaluation)" in s.caption
    d = data(sweep, "final/eval_sampled/success")
    assert d.loc["none", "final"] == pytest.approx(grid("none", 4, mode="sampled").mean())


def test_mde_is_printed_under_the_table(sweep):
    t = table_for(sweep)
    iv = pooled_design([grid(c, 4) - grid("none", 4) for c in ("ragen_top_p", "dapo")]).interval()
    line = next(s for s in t.summary if s.startswith("Minimum detectable effect"))
    assert f"for 3 seeds x 8 tasks: {sig2(iv.mde80())} = {iv.mde80() / iv.se:.2f} x SE {sig2(iv.se)}" in line
    assert not any(s.startswith("Warning") for s in t.summary)
    assert render(t, "markdown").index("Minimum detectable") < render(t, "markdown").index("Notes:")


def test_fewer_than_three_seeds_warns(tmp_path):
    t = table_for(make_task_sweep(tmp_path / "f", seeds=(0, 1)))
    assert any(s.startswith("Warning: 2 seed(s) per point") for s in t.summary)
    t1 = table_for(make_task_sweep(tmp_path / "g", seeds=(0,)))
    assert "not available for 1 seeds x 8 tasks" in t1.summary[0]


def test_without_per_task_results_the_table_falls_back_to_seeds_and_says_so(tmp_path):
    root = make_task_sweep(tmp_path / "old", per_task=False)
    t = table_for(root)
    assert "no per-task results (eval_tasks.jsonl): intervals are over seeds only" in t.caption
    d = data(root)
    assert d.loc["none", "final"] == pytest.approx(13 / 24) and d.loc["dapo", "delta"] == pytest.approx(0.25)
    per_seed = seed_interval(grid("none", 4).mean(axis=1))  # one value per seed: the t interval
    assert (d.loc["none", "final:lo"], d.loc["none", "final:hi"]) == pytest.approx((per_seed.lo, per_seed.hi))
    assert "for 3 seeds (seed-level values)" in t.summary[0]


def test_points_without_per_task_results_make_the_whole_table_per_seed(sweep):
    (sweep / "filter.name=dapo__seed=1__h1" / "eval_tasks.jsonl").unlink()
    t = table_for(sweep)
    assert "per-task results (eval_tasks.jsonl) are missing for 1 of 9 finished points" in t.caption
    assert "two-way model" not in t.caption


def test_points_of_another_base_config_are_never_pooled(sweep):
    add_other_config(sweep, updates=6)
    d = pd.read_csv(io.StringIO(render(table_for(sweep), "csv")))
    own = d[d["config"] == "sweep"].set_index("filter.name")
    other = d[d["config"] == "train.updates=6"].set_index("filter.name")
    assert own.loc["none", "final"] == pytest.approx(13 / 24)  # unchanged by the other points
    assert list(other.index) == ["none", "dapo"] and other.loc["none", "delta"] != other.loc["none", "delta"]  # NaN
    assert other.loc["dapo", "delta"] == pytest.approx(1.0 - 16 / 24)  # to the baseline of its own config
    text = render(table_for(sweep), "markdown")
    assert "| dapo | train.updates=6 | 3/3 |" in text and "Differences: train.updates=6." in text


@pytest.fixture
def cli():
    app = typer.Typer()
    register(app)
    return lambda *args: CliRunner().invoke(app, [str(a) for a in args])


def test_cli_unknown_metric_exits_2_with_a_did_you_mean(cli, tmp_path):
    root = make_clip_sweep(tmp_path / "clip")
    r = cli("table", root, "-m", "final/eval_greedy/sucess")
    assert r.exit_code == 2 and "did you mean final/eval_greedy/success" in r.output
    assert "Traceback" not in r.output and r.output.count("\n") <= 2  # one paragraph


def _as_mixture(root):
    """The fixture's tasks 100-103 as environment `a` and 104-107 as `b` of a mixture, as a sweep on
    env.mixture records them: rows with "env", per-environment summary metrics, the sweep's metric."""
    import json

    for d in (p for p in root.iterdir() if p.is_dir()):
        rows = [json.loads(line) for line in (d / "eval_tasks.jsonl").read_text().splitlines()]
        for r in rows:
            r["env"] = "a" if r["task"] < 104 else "b"
        (d / "eval_tasks.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        summary = json.loads((d / "summary.json").read_text())
        last = max(r["update"] for r in rows)
        for when, u in (("init", 0), ("final", last)):
            for env in ("a", "b"):
                sel = [r["success"] for r in rows if r["update"] == u and r["mode"] == "greedy" and r["env"] == env]
                summary["metrics"][f"{when}/eval_greedy/{env}/success"] = sum(sel) / len(sel)
        (d / "summary.json").write_text(json.dumps(summary))
    manifest = json.loads((root / "sweep.json").read_text())
    manifest["metric"] = "final/eval_greedy/success"
    (root / "sweep.json").write_text(json.dumps(manifest))
    return root


def test_a_mixture_gets_a_paired_table_per_environment(sweep):
    from analysis.load import load_results
    from analysis.results_doc import env_table_metrics
    from analysis.tasks import task_env, task_metric

    assert task_metric("final/eval_sampled/sokoban/success") == ("final", "sampled", "success")
    assert (
        task_env("final/eval_sampled/sokoban/success") == "sokoban" and task_env("final/eval_sampled/success") is None
    )
    root = _as_mixture(sweep)
    assert env_table_metrics(load_results(root)) == ["final/eval_greedy/a/success", "final/eval_greedy/b/success"]
    t = table_for(root, ["final/eval_greedy/a/success"])
    assert "held-out success rate on a, greedy decoding, 4 held-out tasks x 1 sample each" in t.caption
    d = data(root, "final/eval_greedy/a/success")
    # none: seeds 0, 1 solve tasks j < 2 at the start and j < 4 at the end; seed 2 one more task each
    assert d.loc["none", "start"] == pytest.approx((2 + 2 + 3) / 12) and d.loc["none", "final"] == pytest.approx(1.0)
    a = grid("none", 4)[:, :4], grid("none", 0)[:, :4]
    gain = grid_interval(a[0] - a[1])  # the paired interval on environment a's tasks only
    assert (d.loc["none", "gain:lo"], d.loc["none", "gain:hi"]) == pytest.approx((gain.lo, gain.hi))
    b = data(root, "final/eval_greedy/b/success")
    # ragen_top_p ends at threshold 6 (7 on seed 2): tasks 104, 105 (and 106) of b
    assert b.loc["none", "start"] == 0.0 and b.loc["ragen_top_p", "final"] == pytest.approx((2 + 2 + 3) / 12)


def _dapo_on_another_map_size(sweep, task_neutral: list[str] | None = None) -> None:
    """Rewrite the folder as if dapo had run with env.options.size 5 and the others with 4 (an axis
    of the manifest), optionally listing options as task-neutral in the manifest."""
    import json

    import yaml

    for cfg in sweep.glob("*/config.yaml"):
        c = yaml.safe_load(cfg.read_text())
        c["env"]["options"] = {"size": 5 if "dapo" in cfg.parent.name else 4}
        cfg.write_text(yaml.safe_dump(c))
    manifest = json.loads((sweep / "sweep.json").read_text())
    for p in manifest["points"]:
        p["overrides"]["env.options.size"] = 5 if p["overrides"][AXIS] == "dapo" else 4
    manifest["axes"].append("env.options.size")
    manifest["base_config"]["env.options.size"] = 4
    manifest["baseline"]["env.options.size"] = 4
    manifest["base_excluded"].append("env.options.size")
    if task_neutral is not None:
        manifest["task_neutral"] = task_neutral
    (sweep / "sweep.json").write_text(json.dumps(manifest))


def test_a_cell_on_other_held_out_tasks_is_compared_unpaired(sweep):
    """dapo evaluated on another map size: the same task ids are other maps, so Δ is the difference of
    two grids whose variances add (`separate_interval`), marked ‡ with its own footnote, and left out
    of the MDE's paired differences; ragen_top_p (same tasks) stays paired."""
    _dapo_on_another_map_size(sweep)
    d = data(sweep)
    assert d.loc["dapo", "delta"] == pytest.approx(0.25) and not bool(d.loc["dapo", "delta:paired"])
    assert bool(d.loc["ragen_top_p", "delta:paired"])
    sep = separate_interval(grid("dapo", 4), grid("none", 4))
    assert (d.loc["dapo", "delta:lo"], d.loc["dapo", "delta:hi"]) == pytest.approx((sep.lo, sep.hi))
    paired = grid_interval(grid("dapo", 4) - grid("none", 4))
    assert sep.hi - sep.lo > paired.hi - paired.lo  # the tasks' spread no longer cancels
    text = render(table_for(sweep), "markdown")
    assert "held-out tasks are not the baseline's" in text and "seeds differ from the baseline's" not in text
    # the MDE comes from the paired Δ of ragen_top_p alone
    alone = pooled_design([grid("ragen_top_p", 4) - grid("none", 4)]).interval()
    assert f"{sig2(alone.mde80())} = " in text


def test_options_the_manifest_lists_as_task_neutral_keep_the_pairing(sweep):
    """The same folder as above, but the manifest lists env.options.size as task-neutral (as a
    sweep of Sokoban's deadlock handling lists `deadlock`): dapo's Δ is paired by task again."""
    _dapo_on_another_map_size(sweep, task_neutral=["env.options.size"])
    d = data(sweep)
    assert d.loc["dapo", "delta"] == pytest.approx(0.25) and bool(d.loc["dapo", "delta:paired"])
    paired = grid_interval(grid("dapo", 4) - grid("none", 4))
    assert (d.loc["dapo", "delta:lo"], d.loc["dapo", "delta:hi"]) == pytest.approx((paired.lo, paired.hi))
    assert "held-out tasks are not the baseline's" not in render(table_for(sweep), "markdown")


def test_separate_interval_by_hand():
    a, b = np.full((3, 4), 0.75), np.full((2, 6), 0.5)  # no spread: degenerate, never a zero-width interval
    e = separate_interval(a, b)
    assert (e.value, e.n, e.degenerate) == (0.25, 2, True)
    one = separate_interval(np.ones((1, 4)), b)  # one seed on a side: the point estimate only
    assert one.value == 0.5 and np.isnan(one.lo) and np.isnan(one.hi)
    # seeds only (one task column): SE^2 is the sum of the two t intervals' SE^2
    x, y = np.array([[0.1], [0.3], [0.2]]), np.array([[0.5], [0.9]])
    e = separate_interval(x, y)
    assert e.se == pytest.approx(np.sqrt(x.var(ddof=1) / 3 + y.var(ddof=1) / 2))
