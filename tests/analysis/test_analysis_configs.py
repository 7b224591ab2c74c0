"""Config groups (analysis.configs): a key one point's config lacks takes its schema default, as sweep.json
records them (`schema_defaults`), so points written before a key existed pool with those written after it
at its default, and only then."""

from __future__ import annotations

from analysis.configs import _canon, config_groups, differing, signature
from harness.experiments.base_config import base_manifest, differing_keys, schema_defaults

DEFAULTS = {k: _canon(v) for k, v in schema_defaults().items()}


def test_an_absent_key_at_its_default_is_no_difference():
    old = {"algo.lr": 0.001, "train.learner.behaviour": "recompute"}  # written before precision existed
    new = {**old, "train.learner.precision": "float32"}
    assert DEFAULTS["train.learner.precision"] == '"float32"'
    assert differing(signature(old, []), signature(new, []), DEFAULTS) == []
    assert differing(signature(new, []), signature(old, []), DEFAULTS) == []
    assert differing(signature(new, []), signature(old, [])) == [("train.learner.precision", "float32")]  # no defaults
    assert differing_keys(old, new, schema_defaults()) == []


def test_an_absent_key_against_another_value_is_a_difference():
    old = {"algo.lr": 0.001}
    new = {**old, "train.learner.precision": "bfloat16"}
    got = differing(signature(new, []), signature(old, []), DEFAULTS)
    assert got == [("train.learner.precision", "bfloat16")]
    assert differing(signature(old, []), signature(new, []), DEFAULTS) == [("train.learner.precision", "(unset)")]
    assert differing(signature({"x.y": 1}, []), signature({}, []), DEFAULTS) == [("x.y", 1)]  # no schema default
    assert differing_keys(new, old, schema_defaults()) == ["train.learner.precision"]


def test_points_before_and_after_a_new_key_form_one_group():
    before = {"algo.lr": 0.001, "train.seed": 0}
    after = {"algo.lr": 0.001, "train.seed": 1, "train.learner.precision": "float32"}
    other = {"algo.lr": 0.002, "train.seed": 2, "train.learner.precision": "float32"}
    points = [{"id": "a", "is_baseline": True}, {"id": "b"}, {"id": "c"}]
    raw = {"base_config": {"algo.lr": 0.001, "train.learner.precision": "float32"}, "base_excluded": ["train.seed"]}
    raw["schema_defaults"] = base_manifest({"train": {"seed": 0}}, [])["schema_defaults"]
    groups = config_groups(raw, {"a": before, "b": after, "c": other}, points, [])
    assert groups == {"a": [], "b": [], "c": [("algo.lr", 0.002)]}
    del raw["schema_defaults"]  # a manifest written before sweep.json carried them: the old, stricter rule
    assert config_groups(raw, {"a": before, "b": after, "c": other}, points, [])["a"] == [
        ("train.learner.precision", "(unset)")
    ]
