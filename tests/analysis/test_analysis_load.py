"""analysis.load: results folders -> DataFrames, tolerant of partial and old folders."""

import json
import math
import re

import pytest
from synthetic import base_config, curve_rows, make_clip_sweep, write_point

from analysis import AnalysisError, load_curves, load_results
from analysis.load import resolve_metric
from analysis.table import render, table_for


def test_one_row_per_point_with_config_summary_and_cell(clip_sweep):
    df = load_results(clip_sweep)
    assert len(df) == 9
    for col in (
        "point",
        "seed",
        "status",
        "label",
        "is_baseline",
        "config_hash",
        "code_version",
        "algo.clip.level",
        "train.seed",
        "model.lora.r",
        "final/eval_greedy/success",
        "collapsed_at",
    ):
        assert col in df.columns, col
    assert list(dict.fromkeys(df["label"])) == ["ppo", "dual", "none"]  # baseline first, then sweep order
    assert df.loc[df["is_baseline"], "label"].unique().tolist() == ["ppo"]
    assert df["code_version"].iloc[0] == "0123456"  # a 40-hex commit is shortened
    row = df[df["point"] == "clip.level=none__seed0"].iloc[0]
    assert row["collapsed_at"] == 6 and row["collapsed_reason"] == "echo_trap"
    assert df.attrs["sweep"].seeds == [0, 1, 2] and df.attrs["sweep"].source == "sweep.json"


def test_failed_and_missing_points_are_rows_not_crashes(tmp_path):
    root = make_clip_sweep(tmp_path / "clip", drop=("clip.level=dual__seed1",))
    df = load_results(root).set_index("point")
    assert df.loc["clip.level=dual__seed1", "status"] == "missing"
    assert "no point folder" in df.loc["clip.level=dual__seed1", "problems"]
    assert df.loc["clip.level=none__seed2", "status"] == "failed"
    assert df.loc["clip.level=none__seed2", "error"].startswith("CUDA out of memory")


def test_running_point_with_torn_metrics_and_bad_summary(clip_sweep):
    d = clip_sweep / "clip.level=dual__seed2"
    (d / "summary.json").unlink()
    (d / "status").write_text("running\n")
    with open(d / "metrics.jsonl", "a") as f:
        f.write('{"update": 11, "env/succ')  # the runner is mid-write
    (clip_sweep / "clip.level=ppo__seed1" / "summary.json").write_text("{not json")
    (clip_sweep / "clip.level=ppo__seed1" / "status").unlink()
    df = load_results(clip_sweep).set_index("point")
    assert df.loc["clip.level=dual__seed2", "status"] == "running"
    assert "no summary.json" in df.loc["clip.level=dual__seed2", "problems"]
    assert df.loc["clip.level=ppo__seed1", "status"] == "running"  # metrics but no usable summary
    assert "summary.json unreadable" in df.loc["clip.level=ppo__seed1", "problems"]
    curves = load_curves(clip_sweep)
    dual2 = curves[curves["point"] == "clip.level=dual__seed2"]
    assert dual2["update"].max() == 10  # the torn line is skipped


def test_without_sweep_json_axes_are_inferred(tmp_path):
    root = make_clip_sweep(tmp_path / "old", with_sweep_json=False)
    df = load_results(root)
    meta = df.attrs["sweep"]
    assert meta.source == "inferred" and meta.axes == ["algo.clip.level"]
    assert meta.seeds == [0, 1, 2] and meta.name == "old"
    first = sorted(p.name for p in root.iterdir())[0]  # baseline = first point
    assert meta.baseline == {"algo.clip.level": first.split("=")[1].split("__")[0]}
    assert df["seed"].tolist().count(0) == 3
    assert any("no sweep.json" in p for p in meta.problems)


def test_multi_axis_labels_name_each_axis(tmp_path):
    root = tmp_path / "grid"
    points = []
    for level in ("ppo", "dual"):
        for agg in ("token-mean", "seq-mean-token-mean"):
            cfg = base_config(level, 0)
            cfg["algo"]["agg"] = agg
            pid = f"{level}-{agg}"
            write_point(root, pid, cfg, "done", {"final/eval_greedy/success": 0.5}, curve_rows(0.5, 0, None))
            points.append(
                {"id": pid, "label": None, "overrides": {"algo.clip.level": level, "algo.agg": agg}, "seed": 0}
            )
    (root / "sweep.json").write_text(
        json.dumps(
            {
                "name": "grid",
                "axes": ["algo.clip.level", "algo.agg"],
                "baseline": {"algo.clip.level": "dual", "algo.agg": "token-mean"},
                "seeds": [0],
                "points": points,
            }
        )
    )
    df = load_results(root)
    assert df["label"].tolist()[0] == "clip.level=dual, algo.agg=token-mean"
    assert df["is_baseline"].tolist() == [True, False, False, False]


def test_grid_points_are_named_by_the_keys_they_set(tmp_path):
    """A grid on one key next to hand-written points that also set others (turn_budget's shape):
    a grid point's label names its own key only, not the defaults of keys other points vary; a
    key with one value everywhere is left out of labels; a null shows as null and an empty string
    as "" (not nan and a blank cell)."""
    root = tmp_path / "mixed"
    points = []
    variants = [  # model.lora.r: a grid key listed with one value, so in every point's overrides
        (None, {"algo.clip.eps_low": 0.1, "model.lora.r": 16}),
        (None, {"algo.clip.eps_low": 0.3, "model.lora.r": 16}),
        ("custom", {"algo.clip.eps_low": 0.3, "algo.agg": "seq-mean-token-mean", "model.note": "", "model.lora.r": 16}),
    ]
    for i, (label, overrides) in enumerate(variants):
        cfg = base_config("ppo", 0)
        cfg["algo"]["clip"]["eps_low"] = overrides["algo.clip.eps_low"]
        cfg["algo"]["agg"] = overrides.get("algo.agg", "token-mean")
        cfg["model"]["note"] = overrides.get("model.note")
        pid = f"p{i}"
        write_point(root, pid, cfg, "done", {"final/eval_greedy/success": 0.5}, curve_rows(0.5, 0, None))
        points.append({"id": pid, "label": label, "overrides": overrides, "seed": 0})
    (root / "sweep.json").write_text(
        json.dumps(
            {
                "name": "mixed",
                "axes": ["algo.clip.eps_low", "algo.agg", "model.note", "model.lora.r"],
                "baseline": {
                    "algo.clip.eps_low": 0.1,
                    "algo.agg": "token-mean",
                    "model.note": None,
                    "model.lora.r": 16,
                },
                "seeds": [0],
                "points": points,
            }
        )
    )
    df = load_results(root)
    assert df["label"].tolist() == ["clip.eps_low=0.1", "clip.eps_low=0.3", "custom"]
    table = render(table_for(root), "markdown")
    assert "| clip.eps_low=0.1 | 0.1 | token-mean | null | 16 |" in table
    assert '| custom | 0.3 | seq-mean-token-mean | "" | 16 |' in table
    assert not re.search(r"\bnan\b", table)


def test_curves_long_format_and_derived_metrics(clip_sweep):
    df = load_results(clip_sweep)
    curves = load_curves(clip_sweep, df)
    assert list(curves.columns) == ["point", "seed", "label", "status", "update", "metric", "value"]
    eval_rows = curves[(curves["metric"] == "eval_greedy/success") & (curves["point"] == "clip.level=ppo__seed2")]
    assert eval_rows["update"].tolist() == [0, 5, 10]  # only eval rows carry it; update 0 = before RL
    kl = resolve_metric(df, curves, "final/diag/kl_k3")
    assert kl[df["point"] == "clip.level=ppo__seed1"].item() == pytest.approx(0.02)  # last logged value
    init = resolve_metric(df, curves, "init/env/success")
    assert init[df["status"] == "done"].eq(0).all()
    assert resolve_metric(df, curves, "final/not_logged").isna().all()
    assert math.isnan(resolve_metric(df, None, "best/diag/kl_k3").iloc[0])


def test_not_a_results_folder_is_one_paragraph_error(tmp_path):
    with pytest.raises(AnalysisError, match="not a results folder"):
        load_results(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(AnalysisError, match="no points"):
        load_results(tmp_path / "empty")


def test_runner_flags_win_and_collapse_may_sit_at_the_summary_top_level(clip_sweep):
    sweep = json.loads((clip_sweep / "sweep.json").read_text())
    sweep["baseline"] = {"algo.clip.level": "stale"}  # the is_baseline flags decide
    for p in sweep["points"]:
        p["is_baseline"] = p["variant"] == "clip.level=dual"
        p["label"] = "DUAL" if p["variant"] == "clip.level=dual" else None
    (clip_sweep / "sweep.json").write_text(json.dumps(sweep))
    s = clip_sweep / "clip.level=ppo__seed0" / "summary.json"
    summary = json.loads(s.read_text())
    summary["collapsed_at"] = {"update": 3, "reason": "kl_spike"}
    summary["metrics"].pop("collapsed_at")
    s.write_text(json.dumps(summary))
    df = load_results(clip_sweep)
    assert list(dict.fromkeys(df["label"])) == ["DUAL", "ppo", "none"]
    assert df.loc[df["is_baseline"], "cell"].unique().tolist() == ["clip.level=dual"]
    row = df[df["point"] == "clip.level=ppo__seed0"].iloc[0]
    assert row["collapsed_at"] == 3 and row["collapsed_reason"] == "kl_spike"
