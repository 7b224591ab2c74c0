"""The table's intervals, verdicts and warnings: known answers computed by hand, Holm across the
sweep's contrasts, degenerate outputs flagged, the equivalence margin from the sweep, the CPU
kernel-path warning, and the config column of a folder with several base configs."""

from __future__ import annotations

import io
import json
import math
import re

import numpy as np
import pandas as pd
import pytest
import typer
import yaml
from scipy import stats
from synthetic import make_clip_sweep, write_point
from synthetic_tasks import TASKS, make_task_sweep, task_rows
from typer.testing import CliRunner

from analysis.columns import DELTA
from analysis.findings import answer
from analysis.load import AnalysisError
from analysis.render import render
from analysis.table import table_for
from harness.cli.analysis import register

# per-seed final success of the baseline and of four cells (seeds 0, 1, 2): Δ = cell - base per seed
BASE = [0.50, 0.60, 0.70]
SHIFTS = {
    "small": [0.09, 0.12, 0.15],  # t = 0.12 / (0.03 / sqrt 3) = 6.93, 2 df: p = 0.020, CI [0.045, 0.195]
    "large": [0.30, 0.301, 0.302],  # p < 1e-5: survives Holm
    "same": [0.001, -0.001, 0.0005],  # 90% CI well inside ±0.05: equivalent
    "noisy": [0.2, -0.2, 0.05],  # wide: undetermined
}


def make_shift_sweep(root, margin=None):
    """One axis, baseline `base`, four cells whose per-seed finals are the baseline's plus SHIFTS."""
    points = []
    for cell, shift in {"base": [0.0] * 3, **SHIFTS}.items():
        for seed in range(3):
            pid = f"{cell}__seed{seed}"
            final = BASE[seed] + shift[seed]
            cfg = {"algo": {"variant": cell}, "train": {"seed": seed, "updates": 10}}
            metrics = {"final/eval_greedy/success": final, "init/eval_greedy/success": 0.25 * seed}
            write_point(root, pid, cfg, "done", metrics, [{"update": 0, "diag/kl_k3": 0.0}])
            overrides = {"algo.variant": cell}
            points.append({"id": pid, "variant": cell, "label": cell, "seed": seed, "overrides": overrides})
    manifest = {"name": "shift", "axes": ["algo.variant"], "baseline": {"algo.variant": "base"}, "seeds": [0, 1, 2]}
    manifest.update(points=points, metric="final/eval_greedy/success")
    if margin is not None:
        manifest["equivalence_margin"] = margin
    (root / "sweep.json").write_text(json.dumps(manifest))
    return root


def csv(root, **kw) -> pd.DataFrame:
    return pd.read_csv(io.StringIO(render(table_for(root, **kw), "csv"))).set_index(table_for(root).key_header[-1])


def test_the_table_uses_the_t_interval_of_the_paired_grid(tmp_path):
    """Δ of dapo against none over 3 seeds x 8 tasks: the mean squares of the per-seed, per-task
    differences, by hand (two-way ANOVA), give SE and df; the table prints exactly that interval."""
    root = make_task_sweep(tmp_path / "filters")

    def grid(level):
        out = np.zeros((3, TASKS))
        for s in range(3):
            for r in task_rows(level, s, 4):
                if r["update"] == 4 and r["mode"] == "greedy":
                    out[s, r["task"] - 100] = r["success"]
        return out

    d = grid("dapo") - grid("none")
    n, m = d.shape
    rows, cols, mu = d.mean(axis=1), d.mean(axis=0), d.mean()
    ms_seed = m * ((rows - mu) ** 2).sum() / (n - 1)
    ms_task = n * ((cols - mu) ** 2).sum() / (m - 1)
    ms_res = ((d - rows[:, None] - cols[None, :] + mu) ** 2).sum() / ((n - 1) * (m - 1))
    assert ms_seed == 0 and ms_task > ms_res  # the seeds agree: the task term carries SE, Satterthwaite's df
    se = math.sqrt((ms_task - ms_res) / (n * m))
    df = (ms_task - ms_res) ** 2 / (ms_task**2 / (m - 1) + ms_res**2 / ((n - 1) * (m - 1)))
    half = stats.t.ppf(0.975, df) * se
    t = csv(root)
    assert t.loc["dapo", "delta"] == pytest.approx(0.25)
    assert (t.loc["dapo", "delta:lo"], t.loc["dapo", "delta:hi"]) == pytest.approx((0.25 - half, 0.25 + half))
    # a column of per-seed values (final KL): the t interval with 2 df
    kl = [0.002 * 4 * (1 + s) for s in range(3)]
    half = stats.t.ppf(0.975, 2) * np.std(kl, ddof=1) / math.sqrt(3)
    assert t.loc["none", "final/diag/kl_k3:hi"] == pytest.approx(np.mean(kl) + half)


def test_holm_keeps_a_contrast_whose_own_interval_excludes_0_undetermined(tmp_path):
    t = csv(make_shift_sweep(tmp_path / "shift"))
    small = t.loc["small"]
    assert small["delta:lo"] > 0  # alone, its 95% interval excludes 0 (p = 0.020) ...
    half = stats.t.ppf(0.975, 2) * 0.03 / math.sqrt(3)
    assert (small["delta:lo"], small["delta:hi"]) == pytest.approx((0.12 - half, 0.12 + half))
    # ... but 4 contrasts: Holm's first step needs p <= 0.05 / 4 and the smallest p belongs to `large`;
    # the second step needs p <= 0.05 / 3 = 0.0167 > 0.020: not rejected
    assert small["verdict"] == "undetermined" and small["verdict:p_holm"] == pytest.approx(3 * 0.0202, abs=2e-3)
    assert t.loc["large", "verdict"] == "better"
    assert t.loc["same", "verdict"] == "equivalent" and t.loc["noisy", "verdict"] == "undetermined"
    assert pd.isna(t.loc["base", "verdict"])
    text = render(table_for(tmp_path / "shift"), "markdown")
    assert "| small | 3/3 |" in text and "| +0.12 [0.05, 0.19] | undetermined |" in text
    assert "Holm's correction across the table's contrasts" in text
    # the findings table says in words why such a contrast is not a finding, and only for it
    said = {f["cell"]: answer(f, 0.05) for f in table_for(tmp_path / "shift").findings}
    assert said["small"].startswith(
        "cannot tell small from base (its 95% interval excludes 0, but not after Holm's correction across the "
        "sweep's contrasts; a verdict would need about "
    )
    assert "Holm" not in said["noisy"] and "Holm" not in said["large"] and "Holm" not in said["same"]
    # every undetermined row says the seeds a verdict would need; a decided row says nothing of it
    assert re.search(r"\(a verdict would need about \d+ seeds at the observed Δ and variance\)$", said["noisy"])
    assert "would need" not in said["large"] + said["same"]


def test_a_sequential_rows_open_verdict_is_explained_by_its_look_not_by_holm():
    """A seed budget's row left undetermined with a fixed-n interval clear of 0 (clipping_sequential's
    no-clip): the findings say the look's share of the error rate held it back, not Holm."""
    from analysis.intervals import Interval

    iv = Interval(-0.10, 0.03, 14.0, 15, 256)
    assert iv.hi < 0
    f = {"cell": "no-clip", "baseline": "ppo-token", "column": DELTA, "interval": iv, "verdict": "undetermined"}
    assert "Holm" in answer(f, 0.05)
    said = answer({**f, "sequential": True}, 0.05)
    assert said.startswith("cannot tell no-clip from ppo-token") and "last look" in said and "Holm" not in said
    # at the last look: the seeds a verdict would need; before it, also that more looks are to come
    done = answer({**f, "sequential": True, "needed": 18}, 0.05)
    assert done.endswith("may spend; a verdict would need about 18 seeds at the observed Δ and variance)")
    still = answer({**f, "sequential": True, "needed": 18, "open_look": (2, 7, 5)}, 0.05)
    assert "; still open after look 2 of 7 (5 seeds): the sweep's next looks add seeds; a verdict would need" in still


def test_an_established_difference_on_other_tasks_is_lower_never_worse(tmp_path):
    """A cell evaluated on another map size than its baseline compares two task distributions: its
    established Δ is "lower" (harder tasks), not "worse" (a worse method), in the table and in the
    findings' words; a cell on the baseline's own tasks with the same shift stays "worse"."""
    root, points = tmp_path / "size", []
    cells = {"base": ([0.0] * 3, 4), "bigger-map": ([-0.39, -0.40, -0.41], 5), "same-map": ([-0.39, -0.40, -0.41], 4)}
    for cell, (shift, size) in cells.items():
        for seed in range(3):
            pid = f"{cell}__seed{seed}"
            cfg = {"algo": {"variant": cell}, "env": {"options": {"size": size}}, "train": {"seed": seed}}
            metrics = {"final/eval_greedy/success": BASE[seed] + shift[seed], "init/eval_greedy/success": 0.2}
            write_point(root, pid, cfg, "done", metrics, [{"update": 0, "diag/kl_k3": 0.0}])
            overrides = {"algo.variant": cell, "env.options.size": size}
            points.append({"id": pid, "variant": cell, "label": cell, "seed": seed, "overrides": overrides})
    baseline = {"algo.variant": "base", "env.options.size": 4}
    manifest = {"name": "size", "axes": ["algo.variant", "env.options.size"], "baseline": baseline}
    manifest.update(seeds=[0, 1, 2], points=points, metric="final/eval_greedy/success")
    (root / "sweep.json").write_text(json.dumps(manifest))
    t = pd.read_csv(io.StringIO(render(table_for(root), "csv"))).set_index("setting")
    assert t.loc["bigger-map", "delta:hi"] < 0 and t.loc["bigger-map", "verdict"] == "lower"
    assert t.loc["same-map", "delta:hi"] < 0 and t.loc["same-map", "verdict"] == "worse"
    said = {f["cell"]: (f["other_tasks"], answer(f, 0.05)) for f in table_for(root).findings}
    assert said["bigger-map"] == (
        True,
        "bigger-map ends lower than base on its own held-out tasks (other tasks than the baseline's)",
    )
    assert said["same-map"] == (False, "same-map is worse than base")
    assert "for a Δ against a baseline on other held-out tasks" in render(table_for(root), "markdown")


def test_degenerate_outputs_are_flagged_not_printed_as_results(tmp_path):
    t = table_for(make_clip_sweep(tmp_path / "clip"))  # dual = ppo + 0.25 on every seed; every start 0
    text = render(t, "markdown")
    dual = next(line for line in text.splitlines() if line.startswith("| dual"))
    assert "+0.25 (degenerate) | degenerate |" in dual and "0.00 (degenerate)" in dual
    assert "[0.25, 0.25]" not in text and "± 0.00" not in text and "[0.00, 0.00]" not in text
    mde = next(s for s in t.summary if s.startswith("Minimum detectable effect"))
    assert "degenerate" in mde and "= 0" not in mde  # no MDE of 0
    assert "no interval can be estimated: the number is not a result" in text


def test_the_mde_is_printed_to_two_significant_digits(tmp_path):
    t = table_for(make_task_sweep(tmp_path / "filters"))
    line = next(s for s in t.summary if s.startswith("Minimum detectable effect"))
    mde = line.split("tasks: ")[1].split(" = ")[0]
    assert len(mde.replace("0.", "").lstrip("0")) == 2  # e.g. 0.44, 0.050


def test_the_equivalence_margin_comes_from_the_sweep(tmp_path):
    tight = csv(make_shift_sweep(tmp_path / "tight", margin=0.0001))
    assert tight.loc["same", "verdict"] == "undetermined"  # 90% CI not inside ±0.0001
    assert "±0.0001" in table_for(tmp_path / "tight").caption
    assert csv(tmp_path / "tight", margin=0.05).loc["same", "verdict"] == "equivalent"  # --margin wins
    make_shift_sweep(tmp_path / "bad", margin="wide")
    with pytest.raises(AnalysisError, match=r"bad/sweep.json: equivalence_margin = 'wide' is not a valid margin"):
        table_for(tmp_path / "bad")


def test_results_doc_takes_the_margin_from_the_sweep_file_and_names_a_bad_one(tmp_path):
    app = typer.Typer()
    register(app)
    root, sweeps = tmp_path / "results", tmp_path / "sweeps"
    make_shift_sweep(root / "shift")
    sweeps.mkdir()
    (sweeps / "shift.yaml").write_text("name: shift\nequivalence_margin: 0.0001\n")
    out = tmp_path / "docs" / "results.md"
    r = CliRunner().invoke(app, ["results-doc", str(root), "--out", str(out), "--sweeps", str(sweeps)])
    assert r.exit_code == 0, r.output
    same = next(line for line in out.read_text().splitlines() if line.startswith("| same |"))
    assert "| +0.000 [-0.002, 0.003] | undetermined |" in same
    (sweeps / "shift.yaml").write_text("name: shift\nequivalence_margin: -1\n")
    r = CliRunner().invoke(app, ["results-doc", str(root), "--out", str(out), "--sweeps", str(sweeps)])
    assert r.exit_code == 2 and "Traceback" not in r.output
    assert "shift.yaml: equivalence_margin = -1 is not a valid margin; it must be a positive number" in r.output


def _set_cpu(root, kernels: dict[str, str]) -> None:
    for d in (p for p in root.iterdir() if p.is_dir()):
        summary = json.loads((d / "summary.json").read_text())
        path = kernels.get(d.name.split("__")[0], "AVX2")
        summary["cpu"] = {"model": "AMD EPYC 9654", "torch_kernels": path, "blas": "mkl", "MKL_CBWR": None}
        (d / "summary.json").write_text(json.dumps(summary))


def test_the_table_warns_when_it_pools_runs_from_several_cpu_kernel_paths(tmp_path):
    root = make_task_sweep(tmp_path / "filters")
    assert table_for(root).warnings == []  # no CPU recorded (older runs): nothing to say
    _set_cpu(root, {})
    assert table_for(root).warnings == []  # one kernel path
    _set_cpu(root, {"filter.name=dapo": "AVX512"})
    (warning,) = table_for(root).warnings
    assert warning.startswith("Warning: this table pools runs from 2 CPU kernel paths (")
    assert "AVX2, mkl on AMD EPYC 9654: 6 points" in warning and "AVX512, mkl on AMD EPYC 9654: 3 points" in warning
    assert warning in render(table_for(root), "markdown")
    app = typer.Typer()
    register(app)
    r = CliRunner().invoke(app, ["table", str(root), "--format", "csv"])
    assert r.exit_code == 0 and warning in r.output  # on stderr, which the runner mixes in


def test_the_config_column_leads_with_the_keys_that_tell_the_groups_apart(tmp_path):
    """Two other runs of the sweep differ from its base alike in algo.lr and model.name and from each
    other in train.updates: their labels start with train.updates, not with the keys they share."""
    from synthetic_tasks import add_other_config

    root = make_task_sweep(tmp_path / "filters")
    for updates in (2, 6):
        for pid in add_other_config(root, updates=updates):
            cfg = yaml.safe_load((root / pid / "config.yaml").read_text())
            cfg["algo"]["lr"], cfg["model"]["name"] = 2e-5, "tiny-b"
            (root / pid / "config.yaml").write_text(yaml.safe_dump(cfg))
    t = table_for(root)
    groups = {keys[-1] for keys, _, _ in t.rows} - {"sweep"}
    assert groups == {"train.updates=2, algo.lr=2e-05 (+1 keys)", "train.updates=6, algo.lr=2e-05 (+1 keys)"}


def test_a_one_cell_sweep_gets_the_verdict_of_its_gain(tmp_path):
    from synthetic_figures import make_sweep

    root = make_sweep(
        tmp_path / "learn", "learn", [("grpo", {"algo.x": "grpo"}, 0.1, 0.05)], ["algo.x"], {"algo.x": "grpo"}
    )
    t = table_for(root)
    assert t.metric_header[:4] == ["start", "final", "gain", "verdict"]
    (finding,) = t.findings
    assert finding["column"] == "gain" and finding["verdict"] in ("better", "undetermined")
    assert finding["interval"].lo == pytest.approx(float(csv(root).loc["grpo", "gain:lo"]))
