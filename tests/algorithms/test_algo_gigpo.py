"""GiGPO: hand-computed two-level advantages and reductions to the episode level."""

import math
from dataclasses import replace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from algorithms import ADVANTAGE, AdvantageInputs, AdvantageParams

gigpo = ADVANTAGE.get("gigpo")
P = AdvantageParams(
    gamma=1.0,
    lam=1.0,
    gigpo_gamma=0.95,
    gigpo_step_weight=1.0,
    gigpo_mode="mean_norm",
    gigpo_episode_stats="trajectories",
)


def _example(anchor=((10, 11), (10, 12)), turn_mask=((1, 1), (1, 1)), group=(0, 0)):
    """Two trajectories, two turns of two tokens each: tokens [t0 t0 obs t1 t1]."""
    tm = torch.tensor(turn_mask)
    turn_rewards = torch.tensor([[0.0, 1.0], [0.0, 0.0]]) * tm
    ti = torch.tensor([[0, 0, -1, 1, 1]] * 2)
    ti = torch.where(tm.gather(1, ti.clamp(min=0)).bool() & (ti >= 0), ti, -1)
    return AdvantageInputs(
        mask=(ti >= 0).long(),
        turn_index=ti,
        rewards=turn_rewards.sum(1),
        group=torch.tensor(group),
        turn_rewards=turn_rewards,
        turn_mask=tm,
        anchor=torch.tensor(anchor),
    )


def test_hand_computed_mean_norm():
    out = gigpo(_example(), replace(P, gigpo_gamma=0.5, gigpo_mode="mean_norm"))
    # A^E = R - mean = +-0.5. Step returns: traj 0 (0.5, 1), traj 1 (0, 0).
    # anchor 10 holds (0.5, 0) -> A^S = +-0.25; anchors 11, 12 are singletons -> 0.
    exp = torch.tensor([[0.75, 0.75, 0.0, 0.5, 0.5], [-0.75, -0.75, 0.0, -0.5, -0.5]])
    assert torch.allclose(out.advantages, exp)


def test_hand_computed_mean_std_norm():
    out = gigpo(_example(), replace(P, gigpo_gamma=0.5, gigpo_mode="mean_std_norm"))
    e = 0.5 / (math.sqrt(0.5) + 1e-6)  # std of (1, 0) = sqrt(1/2)
    st_ = 0.25 / (math.sqrt(0.125) + 1e-6)  # std of (0.5, 0) = sqrt(1/8)
    exp = torch.tensor([[e + st_, e + st_, 0.0, e, e], [-e - st_, -e - st_, 0.0, -e, -e]])
    assert torch.allclose(out.advantages, exp, atol=1e-5)


def test_step_weight():
    out = gigpo(_example(), replace(P, gigpo_gamma=0.5, gigpo_mode="mean_norm", gigpo_step_weight=2.0))
    assert torch.allclose(out.advantages[0, 0], torch.tensor(1.0))  # 0.5 + 2 * 0.25


def test_episode_stats_over_steps():
    # traj 0 has 2 turns (R = 1), traj 1 has 1 turn (R = 0): weighted mean = 2/3
    inp = _example(turn_mask=((1, 1), (1, 0)))
    traj = gigpo(inp, replace(P, gigpo_mode="mean_norm", gigpo_gamma=0.5))
    steps = gigpo(inp, replace(P, gigpo_mode="mean_norm", gigpo_gamma=0.5, gigpo_episode_stats="steps"))
    # step part is identical in both: anchor 10 holds (0.5, 0) -> +-0.25
    assert traj.advantages[0, 3].item() == pytest.approx(0.5)
    assert steps.advantages[0, 3].item() == pytest.approx(1 / 3)
    assert steps.advantages[1, 0].item() == pytest.approx(-2 / 3 - 0.25)
    assert (steps.advantages[1, 3:] == 0).all()  # turn 1 of traj 1 does not exist


def test_same_anchor_in_other_group_is_another_step_group():
    out = gigpo(_example(group=(0, 1)), replace(P, gigpo_mode="mean_norm"))
    # two singleton episode groups (verl: A^E = R) and only singleton step groups
    assert torch.allclose(out.advantages, torch.tensor([[1.0, 1, 0, 1, 1], [0, 0, 0, 0, 0]]))


def test_needs_anchor():
    inp = _example()
    inp.anchor = None
    with pytest.raises(ValueError, match="anchor"):
        gigpo(inp, P)


@settings(max_examples=30, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    N=st.integers(2, 8),
    K=st.integers(1, 4),
    mode=st.sampled_from(["mean_norm", "mean_std_norm"]),
)
def test_distinct_anchors_equal_episode_level(seed, N, K, mode):
    g = torch.Generator().manual_seed(seed)
    L = 2  # tokens per turn
    turn_mask = torch.ones(N, K, dtype=torch.long)
    turn_mask[:, 1:] = (torch.rand(N, K - 1, generator=g) > 0.3).long().cummin(1).values
    ti = torch.arange(K).repeat_interleave(L).expand(N, K * L)
    ti = torch.where(turn_mask.gather(1, ti).bool(), ti, -1)
    turn_rewards = torch.rand(N, K, generator=g) * turn_mask
    inp = AdvantageInputs(
        mask=(ti >= 0).long(),
        turn_index=ti,
        rewards=turn_rewards.sum(1),
        group=torch.arange(N) // 2,
        turn_rewards=turn_rewards,
        turn_mask=turn_mask,
        anchor=torch.arange(N * K).reshape(N, K),
    )
    out = gigpo(inp, replace(P, gigpo_mode=mode))
    episode = ADVANTAGE.get("grpo" if mode == "mean_std_norm" else "dr_grpo")(inp, P)
    assert torch.allclose(out.advantages, episode.advantages, atol=1e-6)
