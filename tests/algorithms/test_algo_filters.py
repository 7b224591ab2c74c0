"""algo.filter.name: worked examples, stats, and never an empty selection."""

import pytest
import torch

from algorithms import GROUP_FILTER, EmptyBatchError, FilterParams

P = FilterParams(top_p=0.9, top_k=0.5)

# four groups of four rollouts
REWARDS = torch.tensor(
    [
        1.0,
        0.0,
        1.0,
        0.0,  # g0: std sqrt(1/3) = 0.577
        1.0,
        1.0,
        1.0,
        1.0,  # g1: zero variance
        1.0,
        0.0,
        0.0,
        0.0,  # g2: std 0.5
        0.5,
        0.5,
        0.5,
        0.6,
    ]
)  # g3: std 0.05
GROUP = torch.tensor([7, 7, 7, 7, 3, 3, 3, 3, 9, 9, 9, 9, 1, 1, 1, 1])  # arbitrary ids
ORDER = [7, 3, 9, 1]


def kept(res):
    return [g for g in ORDER if res.keep[GROUP == g].all()]


def test_none_and_dapo():
    res = GROUP_FILTER.get("none")(REWARDS, GROUP, P)
    assert kept(res) == ORDER and res.stats["zero_var_frac"].item() == 0.25
    res = GROUP_FILTER.get("dapo")(REWARDS, GROUP, P)
    assert kept(res) == [7, 9, 1]
    assert res.stats["kept_group_frac"].item() == 0.75
    assert res.stats["kept_traj_frac"].item() == 0.75
    assert res.stats["zero_var_frac"].item() == 0.25
    assert res.keep.dtype == torch.bool and res.keep.shape == REWARDS.shape


@pytest.mark.parametrize(
    "p, groups",
    [
        (0.9, [7, 9]),  # total 1.1274, need 1.0146: 0.577 < need, 0.577 + 0.5 = 1.077 >= need
        (0.5, [7]),  # 0.577 >= 0.5637
        (1.0, [7, 9, 1]),  # every group with a nonzero score, never the zero-variance one
    ],
)
def test_ragen_top_p_worked_example(p, groups):
    res = GROUP_FILTER.get("ragen_top_p")(REWARDS, GROUP, FilterParams(top_p=p, top_k=0.5))
    assert kept(res) == groups
    assert res.stats["kept_group_frac"].item() == len(groups) / 4


@pytest.mark.parametrize("k, groups", [(0.5, [7, 9]), (0.25, [7]), (0.1, [7]), (1.0, [7, 3, 9, 1])])
def test_ragen_top_k(k, groups):
    res = GROUP_FILTER.get("ragen_top_k")(REWARDS, GROUP, FilterParams(top_p=0.9, top_k=k))
    assert kept(res) == groups


@pytest.mark.parametrize("name", ["dapo", "ragen_top_p"])
def test_never_empty_silently(name):
    flat = torch.tensor([1.0, 1.0, 0.0, 0.0, 0.5])
    with pytest.raises(EmptyBatchError) as e:
        GROUP_FILTER.get(name)(flat, torch.tensor([0, 0, 1, 1, 2]), P)
    assert name in str(e.value) and "3" in str(e.value)
    assert e.value.stats["zero_var_frac"].item() == 1.0
    assert e.value.stats["kept_group_frac"].item() == 0.0


def test_empty_input_raises_for_every_filter():
    for name in GROUP_FILTER.names():
        with pytest.raises(EmptyBatchError):
            GROUP_FILTER.get(name)(torch.zeros(0), torch.zeros(0, dtype=torch.long), P)
