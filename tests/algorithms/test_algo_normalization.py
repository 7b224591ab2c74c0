"""algo.adv.norm: hand-computed cases."""

import math

import pytest
import torch

from algorithms import ADV_NORM, ADVANTAGE, AdvantageInputs, AdvantageParams, check_norm_compatible

P = AdvantageParams(
    gamma=1.0,
    lam=1.0,
    gigpo_gamma=0.95,
    gigpo_step_weight=1.0,
    gigpo_mode="mean_norm",
    gigpo_episode_stats="trajectories",
)


def _inputs(mask, rewards, group, task=None, env=None):
    mask = torch.tensor(mask)
    return AdvantageInputs(
        mask=mask,
        turn_index=torch.where(mask.bool(), 0, -1),
        rewards=torch.tensor(rewards),
        group=torch.tensor(group),
        task=None if task is None else torch.tensor(task),
        env=None if env is None else torch.tensor(env),
    )


def test_group_is_identity():
    adv = torch.randn(2, 3)
    inp = _inputs([[1, 1, 0], [1, 0, 0]], [0.0, 1.0], [0, 0])
    assert ADV_NORM.get("group")(adv, inp, P) is adv


def test_batch_hand_computed():
    inp = _inputs([[1, 1, 0], [1, 0, 0]], [0.0, 1.0], [0, 0])
    adv = torch.tensor([[1.0, 2.0, 50.0], [3.0, float("nan"), 7.0]])
    out = ADV_NORM.get("batch")(adv, inp, P)
    # tokens 1, 2, 3: mean 2, unbiased var 1
    d = 1 / math.sqrt(1 + 1e-8)
    assert torch.allclose(out, torch.tensor([[-d, 0.0, 0.0], [d, 0.0, 0.0]]))


def test_task_hand_computed():
    # task 0 tokens (1, 3): mean 2, var 2; task 1 tokens (10, 10, 40): mean 20, var 300
    inp = _inputs([[1, 1, 0], [1, 0, 1], [1, 0, 0]], [0.0, 0.0, 0.0], [0, 1, 2], task=[1, 0, 1])
    adv = torch.tensor([[10.0, 10.0, 9.0], [1.0, 9.0, 3.0], [40.0, 0.0, 9.0]])
    out = ADV_NORM.get("task")(adv, inp, P)
    a, b = 1 / math.sqrt(2), 10 / math.sqrt(300)
    exp = torch.tensor([[-b, -b, 0.0], [-a, 0.0, a], [2 * b, 0.0, 0.0]])
    assert torch.allclose(out, exp, atol=1e-6)
    for t in (0, 1):  # each task standardized: mean 0, std 1
        sel = out[inp.mask.bool() & (inp.task[:, None] == t)]
        assert sel.mean().abs() < 1e-6 and (sel.std() - 1).abs() < 1e-6
    with pytest.raises(ValueError, match="task"):
        ADV_NORM.get("task")(adv, _inputs([[1]], [0.0], [0]), P)


def test_env_std_hand_computed():
    # groups (1, 0) and (1, 1) in one env: env std of (1, 0, 1, 1) = 0.5
    inp = _inputs([[1, 1]] * 4, [1.0, 0.0, 1.0, 1.0], [0, 0, 1, 1], env=[3, 3, 3, 3])
    out = ADV_NORM.get("env_std")(torch.zeros(4, 2), inp, P)
    exp = torch.tensor([1.0, -1.0, 0.0, 0.0]) * 0.5 / (0.5 + 1e-6)
    assert torch.allclose(out, exp[:, None].expand(4, 2))


def test_env_std_ignores_invalid_trajectories_and_equals_grpo_per_group_env():
    inp = _inputs([[1, 1], [1, 0], [0, 0]], [1.0, 0.0, 100.0], [0, 0, 1], env=[0, 0, 0])
    out = ADV_NORM.get("env_std")(torch.zeros(3, 2), inp, P)
    grpo = ADVANTAGE.get("grpo")(inp, P).advantages  # env std over the 2 valid = group std
    assert torch.allclose(out, grpo)


def test_compatibility():
    check_norm_compatible("grpo", "env_std")
    check_norm_compatible("gae", "batch")
    with pytest.raises(ValueError, match="env_std"):
        check_norm_compatible("gae", "env_std")
