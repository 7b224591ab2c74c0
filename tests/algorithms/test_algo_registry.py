"""Registry behaviour, AXES wiring and presets."""

import pytest

import algorithms as A
from algorithms.registry import Registry, UnknownChoiceError


def test_register_twice_errors():
    r = Registry("algo.test", "a test axis")
    r.register("x", doc="one")(lambda: 1)
    with pytest.raises(ValueError, match="registered twice"):
        r.register("x", doc="two")(lambda: 2)


def test_unknown_name_lists_choices():
    with pytest.raises(UnknownChoiceError) as e:
        A.AGGREGATION.get("token-men")
    msg = str(e.value)
    assert "algo.agg" in msg and "token-men" in msg
    for name in A.AGGREGATION.names():
        assert name in msg
    assert isinstance(e.value, KeyError)


def test_axes_keys_and_values():
    assert set(A.AXES) == {
        "algo.clip.level",
        "algo.agg",
        "algo.adv.estimator",
        "algo.adv.norm",
        "algo.filter.name",
        "algo.kl.estimator",
        "algo.correction.name",
    }
    assert A.AXES["algo.clip.level"].names() == ["token", "sequence", "trajectory", "none", "cispo", "sapo"]
    assert A.AXES["algo.agg"].names() == [
        "token-mean",
        "seq-mean-token-mean",
        "seq-mean-token-sum",
        "seq-mean-token-sum-norm",
    ]
    assert set(A.AXES["algo.adv.estimator"].names()) == {
        "grpo",
        "dr_grpo",
        "rloo",
        "reinforce_pp",
        "reinforce_pp_baseline",
        "gae",
        "gigpo",
    }
    assert A.AXES["algo.adv.norm"].names() == ["group", "batch", "task", "env_std"]
    assert A.AXES["algo.filter.name"].names() == ["none", "dapo", "ragen_top_p", "ragen_top_k"]
    assert A.AXES["algo.kl.estimator"].names() == ["none", "k1", "k2", "k3"]
    assert A.AXES["algo.correction.name"].names() == [
        "none",
        "tis_token",
        "tis_seq",
        "mis_token",
        "mis_seq",
        "icepop",
        "geo_seq_mask",
        "decoupled",
    ]
    for key, reg in A.AXES.items():
        assert reg.axis == key
        for entry in reg:
            assert entry.doc and "\n" not in entry.doc, (key, entry.name)
            assert entry.fn.__doc__, (key, entry.name)


def test_presets_use_registered_values():
    assert {"ppo", "grpo", "rloo", "reinforce_pp"} <= set(A.PRESETS)
    for name, preset in A.PRESETS.items():
        for key, value in preset.items():
            axis = "algo." + key
            if axis in A.AXES:
                assert value in A.AXES[axis], (name, key, value)
        A.check_norm_compatible(preset["adv.estimator"], preset["adv.norm"])
    assert A.PRESETS["ppo"]["critic.enabled"] is True
