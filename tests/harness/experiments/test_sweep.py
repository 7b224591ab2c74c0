"""Sweep expansion: shipped sweeps, grid / zip / points, baselines, stable ids, axis isolation."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from harness.config.errors import ConfigError
from harness.config.keys import flatten, iter_config_fields
from harness.config.schema import RunConfig
from harness.experiments.provenance import config_hash
from harness.experiments.sweep import load_sweep, short_key
from tests.helpers import REPO  # noqa: E402

SHIPPED = sorted(p for p in (REPO / "sweeps").glob("*.yaml") if not p.name.startswith("tune_"))  # tune_*: studies

BASE = "env: {name: frozenlake}\ntrain: {updates: 3}\n"


def write_sweep(tmp_path: Path, body: str, base: str = BASE) -> Path:
    (tmp_path / "base.yaml").write_text(base)
    path = tmp_path / "sweep.yaml"
    path.write_text(body)
    return path


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_every_shipped_sweep_loads_and_expands(path):
    sweep = load_sweep(path)
    assert sweep.name == path.stem
    assert len(sweep.seeds) >= 3
    ids = [p.id for p in sweep.points]
    assert len(ids) == len(set(ids))
    assert len(sweep.points) == len({p.variant for p in sweep.points}) * len(sweep.seeds)
    assert sum(p.is_baseline for p in sweep.points) == len(sweep.seeds)
    assert all(p.config.train.seed == p.seed for p in sweep.points)


def test_the_clipping_sweep_exists():
    assert (REPO / "sweeps" / "clipping.yaml") in SHIPPED


def test_grid_is_a_cartesian_product_and_zip_varies_together(tmp_path):
    path = write_sweep(
        tmp_path,
        """
name: t
base: base.yaml
grid:
  algo.agg: [token-mean, seq-mean-token-mean]
  turns.max: [4, 6, 8]
zip:
  - {algo.clip.eps_low: [0.1, 0.2], algo.clip.eps_high: [0.3, 0.4]}
seeds: [0, 1]
""",
    )
    sweep = load_sweep(path)
    assert len(sweep.points) == 2 * 3 * 2 * 2
    pairs = {(p.config.algo.clip.eps_low, p.config.algo.clip.eps_high) for p in sweep.points}
    assert pairs == {(0.1, 0.3), (0.2, 0.4)}
    assert sweep.axes == ["algo.agg", "turns.max", "algo.clip.eps_low", "algo.clip.eps_high", "train.seed"]
    assert sweep.baseline == sweep.points[0].variant  # default: the first point


def test_points_are_added_to_the_grid_with_labels_and_baseline_by_label(tmp_path):
    path = write_sweep(
        tmp_path,
        """
name: t
base: base.yaml
grid: {algo.agg: [token-mean, seq-mean-token-sum]}
points:
  - {label: gspo, algo.clip.level: sequence, algo.clip.eps_low: 3.0e-4}
seeds: [0, 1, 2]
baseline: gspo
""",
    )
    sweep = load_sweep(path)
    assert len(sweep.points) == 3 * 3
    base = [p for p in sweep.points if p.is_baseline]
    assert {p.variant for p in base} == {"gspo"} and {p.seed for p in base} == {0, 1, 2}
    assert base[0].id.startswith("gspo__seed=0__")
    assert base[0].config.algo.clip.level == "sequence"


def test_baseline_by_overrides(tmp_path):
    path = write_sweep(
        tmp_path,
        """
name: t
base: base.yaml
grid: {algo.agg: [token-mean, seq-mean-token-sum]}
seeds: [0, 1, 2]
baseline: {algo.agg: seq-mean-token-sum}
""",
    )
    sweep = load_sweep(path)
    assert sweep.baseline == "agg=seq-mean-token-sum"
    assert all(p.config.algo.agg == "seq-mean-token-sum" for p in sweep.points if p.is_baseline)


def test_inline_base_and_no_axes_gives_one_variant(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text("name: solo\nbase: {turns: {max: 3}}\nseeds: [5]\n")
    sweep = load_sweep(path)
    assert [p.id.split("__")[:2] for p in sweep.points] == [["base", "seed=5"]]
    assert sweep.points[0].config.turns.max == 3


def test_point_id_is_slug_seed_and_config_hash(tmp_path):
    path = write_sweep(tmp_path, "name: t\nbase: base.yaml\ngrid: {algo.clip.level: [sequence]}\nseeds: [1]\n")
    point = load_sweep(path).points[0]
    assert point.id == f"clip.level=sequence__seed=1__{config_hash(point.config)}"
    assert len(point.config_hash) == 8
    assert short_key("algo.agg") == "agg" and short_key("turns.max") == "turns.max"


def _ids_in_subprocess(path: Path) -> list[str]:
    code = (
        f"from harness.experiments.sweep import load_sweep; "
        f"print('\\n'.join(p.id for p in load_sweep({str(path)!r}).points))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    return out.stdout.split()


def test_point_ids_are_stable_across_processes():
    path = REPO / "sweeps" / "clipping.yaml"
    assert _ids_in_subprocess(path) == [p.id for p in load_sweep(path).points]


def test_point_ids_change_with_the_base_config(tmp_path):
    body = "name: t\nbase: base.yaml\ngrid: {algo.agg: [token-mean, seq-mean-token-sum]}\nseeds: [0, 1, 2]\n"
    before = [p.id for p in load_sweep(write_sweep(tmp_path, body)).points]
    after = [p.id for p in load_sweep(write_sweep(tmp_path, body, BASE + "algo: {lr: 2.0e-4}\n")).points]
    assert not set(before) & set(after)
    assert [i.split("__")[:2] for i in before] == [i.split("__")[:2] for i in after]  # same slugs


def test_config_hash_covers_every_field():
    dump = RunConfig().model_dump(mode="json")
    reference = config_hash(dump)
    for key, _ in iter_config_fields():
        changed = json.loads(json.dumps(dump))
        node = changed
        *parents, leaf = key.split(".")
        for part in parents:
            node = node[part]
        node[leaf] = ["changed", node[leaf]]
        assert config_hash(changed) != reference, key
    assert config_hash(RunConfig()) == reference


SWEEP_ERRORS = {
    "unknown-sweep-key": (
        "name: t\nbase: base.yaml\ngrids: {algo.agg: [token-mean]}\n",
        ["unknown key 'grids'", "Did you mean 'grid'"],
    ),
    "bad-axis-value-in-grid": (
        "name: t\nbase: base.yaml\ngrid: {algo.clip.level: [token, tokn]}\n",
        ["algo.clip.level = 'tokn'", "sequence", "set by the sweep's grid"],
    ),
    "zip-lengths": (
        "name: t\nbase: base.yaml\nzip:\n  - {algo.clip.eps_low: [0.1, 0.2], algo.clip.eps_high: [0.3]}\n",
        ["zip group 1", "different lengths"],
    ),
    "baseline-not-found": (
        "name: t\nbase: base.yaml\npoints: [{label: a, algo.agg: seq-mean-token-sum}]\nbaseline: b\n",
        ["baseline 'b'", "choose one of: a"],
    ),
    "baseline-overrides-not-found": (
        "name: t\nbase: base.yaml\ngrid: {algo.agg: [seq-mean-token-sum]}\nbaseline: {algo.agg: token-mean}\n",
        ["matches no point"],
    ),
    "duplicate-labels": (
        "name: t\nbase: base.yaml\npoints: [{label: a, turns.max: 3}, {label: a, turns.max: 4}]\n",
        ["label 'a' is used twice"],
    ),
    "seed-in-grid": ("name: t\nbase: base.yaml\ngrid: {train.seed: [1, 2]}\n", ["train.seed", "seeds"]),
    "identical-points": (
        "name: t\nbase: base.yaml\npoints: [{label: a, turns.max: 3}, {label: b, turns.max: 3}]\n",
        ["'a' and 'b' resolve to the same config"],
    ),
    "missing-base-file": ("name: t\nbase: nothere.yaml\n", ["not found", "nothere.yaml"]),
    "bad-name": ("name: 'my sweep!'\nbase: base.yaml\n", ["name", "pattern"]),
    "axis-isolation": (
        "name: t\nbase: base.yaml\npoints:\n  - {label: custom, algo.agg: token-mean}\n"
        "  - {label: ppo, algo.preset: ppo}\nbaseline: custom\n",
        ["point 'ppo' differs from the baseline 'custom'", "not a declared axis", "algo.adv.estimator"],
    ),
}


@pytest.mark.parametrize("name", sorted(SWEEP_ERRORS))
def test_malformed_sweep_gives_a_clear_message(tmp_path, name):
    body, expected = SWEEP_ERRORS[name]
    with pytest.raises(ConfigError) as info:
        load_sweep(write_sweep(tmp_path, body))
    for piece in expected:
        assert piece in str(info.value), f"{piece!r} missing from:\n{info.value}"


def test_base_errors_name_the_base_file(tmp_path):
    path = write_sweep(tmp_path, "name: t\nbase: base.yaml\n", base="algo: {agg: nope}\n")
    with pytest.raises(ConfigError, match=r"base\.yaml: algo\.agg = 'nope'"):
        load_sweep(path)


def test_manifest_lists_variants_and_baseline():
    sweep = load_sweep(REPO / "sweeps" / "clipping.yaml")
    manifest = sweep.manifest()
    assert manifest["baseline_variant"] == "ppo-token"
    ref = flatten(next(p for p in sweep.points if p.is_baseline).config.model_dump(mode="json"))
    assert manifest["baseline"] == {a: ref[a] for a in manifest["axes"]}
    assert manifest["baseline"]["algo.clip.level"] == "token"
    assert "train.seed" not in manifest["axes"]
    assert len(manifest["points"]) == len(sweep.points)
    assert {v["variant"] for v in manifest["variants"]} == {p.variant for p in sweep.points}
    json.dumps(manifest)  # serializable
    assert all(k in flatten(sweep.points[0].config.model_dump()) for v in manifest["variants"] for k in v["overrides"])


def test_base_overrides_and_seeds_for_smoke_runs(tmp_path):
    body = "name: t\nbase: base.yaml\ngrid: {algo.agg: [token-mean, seq-mean-token-sum]}\nseeds: [0, 1, 2]\n"
    path = write_sweep(tmp_path, body)
    full = load_sweep(path)
    smoke = load_sweep(path, ["train.updates=1", "rollout.group_size=2"], seeds=[5])
    assert [p.seed for p in smoke.points] == [5, 5]
    assert all(p.config.train.updates == 1 and p.config.rollout.group_size == 2 for p in smoke.points)
    assert {p.config.algo.agg for p in smoke.points} == {"token-mean", "seq-mean-token-sum"}
    assert not {p.id for p in smoke.points} & {p.id for p in full.points}
    assert smoke.axes == full.axes
    with pytest.raises(ConfigError, match=r"rollout\.group_size = 0"):
        load_sweep(path, ["rollout.group_size=0"])
    with pytest.raises(ConfigError, match="duplicates"):
        load_sweep(path, seeds=[1, 1])


def test_the_sweep_files_tables_are_held_out_metrics_and_reach_the_manifest(tmp_path):
    from harness.experiments.sweep import load_sweep

    base = "base: {model: {name: tiny}, env: {name: frozenlake, options: {checker: lenient}}}\n"
    good = tmp_path / "good.yaml"
    good.write_text(
        "name: probe\n" + base + "points: [{label: a}, {label: b, algo.kl.coef: 0.0}]\nseeds: [0, 1, 2]\n"
        "baseline: a\nmetric: eval_sampled/true_success\ntables: [eval_sampled/exploit_rate]\n"
    )
    manifest = load_sweep(good).manifest()
    assert manifest["metric"] == "final/eval_sampled/true_success"
    assert manifest["tables"] == ["final/eval_sampled/exploit_rate"]
    bad = tmp_path / "bad.yaml"
    bad.write_text(good.read_text().replace("tables: [eval_sampled/exploit_rate]", "tables: [eval_sampled/exploit]"))
    with pytest.raises(ConfigError) as e:
        load_sweep(bad)
    msg = str(e.value)
    assert str(bad) in msg and "tables" in msg and "eval_sampled/exploit_rate" in msg  # did you mean


def test_manifest_lists_the_options_that_keep_the_held_out_tasks():
    """Sokoban's deadlock handling changes how an episode ends and pays, not which levels its split
    holds: the manifest lists those options so `analysis` pairs the points by level; a sweep
    without such an environment writes no such key (its sweep.json is as before)."""
    repo = REPO
    manifest = load_sweep(repo / "sweeps" / "sokoban_deadlock.yaml").manifest()
    assert manifest["task_neutral"] == ["env.options.deadlock", "env.options.deadlock_penalty"]
    assert "task_neutral" not in load_sweep(repo / "sweeps" / "clipping.yaml").manifest()


def test_seed_offset_runs_a_variant_on_other_seeds_and_changes_nothing_else(tmp_path):
    body = """
name: t
base: base.yaml
points:
  - {label: a}
  - {label: a-again, seed_offset: 1000}
  - {label: b, turns.max: 6}
seeds: [0, 1]
baseline: a
"""
    sweep = load_sweep(write_sweep(tmp_path, body))
    seeds = {v: [p.seed for p in sweep.points if p.variant == v] for v in ("a", "a-again", "b")}
    assert seeds == {"a": [0, 1], "a-again": [1000, 1001], "b": [0, 1]}
    assert all(p.config.train.seed == p.seed for p in sweep.points)
    again = [p for p in sweep.points if p.variant == "a-again"]
    assert [p.id.split("__")[1] for p in again] == ["seed=1000", "seed=1001"]
    assert "seed_offset" not in sweep.axes and "seed_offset" not in str([p.overrides for p in sweep.points])
    variants = {v["variant"]: v for v in sweep.manifest()["variants"]}
    assert variants["a-again"]["seed_offset"] == 1000 and "seed_offset" not in variants["a"]
    # without the offset the same points as a sweep of the other two: ids do not move
    plain = load_sweep(write_sweep(tmp_path, body.replace("  - {label: a-again, seed_offset: 1000}\n", "")))
    assert [p.id for p in plain.points] == [p.id for p in sweep.points if p.variant != "a-again"]


@pytest.mark.parametrize(
    "point, seeds, expected",
    [
        ("{label: c}", "[0, 1]", "give one a seed_offset"),  # the same config twice on the same seeds
        ("{label: c, seed_offset: -1}", "[0, 1]", "seed_offset = -1 must be a whole number >= 0"),
        ("{label: c, seed_offset: 1.5}", "[0, 1]", "must be a whole number"),
        ("{label: c, seed_offset: 4294967295}", "[0, 1]", "out of range"),
        ("{label: c, seed_offset: 1000}", "{start: 2, step: 1, max: 3}", "seed budget"),
    ],
)
def test_seed_offset_errors(tmp_path, point, seeds, expected):
    body = f"name: t\nbase: base.yaml\npoints:\n  - {{label: a}}\n  - {point}\nseeds: {seeds}\nbaseline: a\n"
    with pytest.raises(ConfigError, match=expected):
        load_sweep(write_sweep(tmp_path, body))


def test_merged_manifest_counts_the_sweeps_seeds_not_the_offset_ones(tmp_path):
    from harness.experiments.sweep import merge_manifest

    path = write_sweep(tmp_path, "name: t\nbase: base.yaml\npoints: [{label: a}, {label: b, seed_offset: 1000}]\n")
    first, second = (load_sweep(path, seeds=[s]).manifest() for s in (0, 1))
    merged = merge_manifest(first, second)  # a run of --seeds 1 into the folder of a run of --seeds 0
    assert sorted(p["seed"] for p in merged["points"]) == [0, 1, 1000, 1001]
    assert merged["seeds"] == [0, 1] and merged["command"].endswith("--seeds 0,1")
