"""Config groups (analysis.configs): a key one point's config lacks takes its schema default, so points
written before a key existed pool with those written after it at its default, and only then."""

from __future__ import annotations

from analysis.configs import config_groups, differing, schema_defaults, signature


def test_an_absent_key_at_its_default_is_no_difference():
    old = {"algo.lr": 0.001, "train.learner.behaviour": "recompute"}  # written before precision existed
    new = {**old, "train.learner.precision": "float32"}
    assert schema_defaults()["train.learner.precision"] == '"float32"'
    assert differing(signature(old, []), signature(new, [])) == []
    assert differing(signature(new, []), signature(old, [])) == []


def test_an_absent_key_against_another_value_is_a_difference():
    old = {"algo.lr": 0.001}
    new = {**old, "train.learner.precision": "bfloat16"}
    assert differing(signature(new, []), signature(old, [])) == [("train.learner.precision", "bfloat16")]
    assert differing(signature(old, []), signature(new, [])) == [("train.learner.precision", "(unset)")]
    # a key no schema knows has no default: absent and present still differ
    assert differing(signature({"x.y": 1}, []), signature({}, [])) == [("x.y", 1)]


def test_points_before_and_after_a_new_key_form_one_group():
    before = {"algo.lr": 0.001, "train.seed": 0}
    after = {"algo.lr": 0.001, "train.seed": 1, "train.learner.precision": "float32"}
    other = {"algo.lr": 0.002, "train.seed": 2, "train.learner.precision": "float32"}
    points = [{"id": "a", "is_baseline": True}, {"id": "b"}, {"id": "c"}]
    groups = config_groups(None, {"a": before, "b": after, "c": other}, points, [])
    assert groups == {"a": [], "b": [], "c": [("algo.lr", 0.002)]}
