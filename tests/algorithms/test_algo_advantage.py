"""algo.adv.estimator: hand-computed cases and invariants (GiGPO in test_algo_gigpo.py)."""

import math
from dataclasses import replace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from algorithms import ADVANTAGE, AdvantageInputs, AdvantageParams

P = AdvantageParams(
    gamma=1.0,
    lam=1.0,
    gigpo_gamma=0.95,
    gigpo_step_weight=1.0,
    gigpo_mode="mean_norm",
    gigpo_episode_stats="trajectories",
)


def _outcome_inputs(rewards, group, T=3):
    """One trajectory per row, tokens 0..T-2 trained, last token padding."""
    N = len(rewards)
    mask = torch.ones(N, T, dtype=torch.long)
    mask[:, -1] = 0
    turn_index = torch.where(mask.bool(), 0, -1)
    return AdvantageInputs(mask=mask, turn_index=turn_index, rewards=torch.tensor(rewards), group=torch.tensor(group))


R = [1.0, 0.0, 0.0, 1.0, 2.0, 2.0, 3.0]
G = [0, 0, 0, 0, 1, 1, 2]  # a group of 4, a zero-variance pair, a singleton
s = 0.5 / (math.sqrt(1 / 3) + 1e-6)  # unbiased std of (1,0,0,1) is sqrt(1/3)
EXPECTED = {
    "grpo": [s, -s, -s, s, 0.0, 0.0, 3.0],  # singleton: mean 0, std 1 (verl)
    "dr_grpo": [0.5, -0.5, -0.5, 0.5, 0.0, 0.0, 3.0],
    "rloo": [2 / 3, -2 / 3, -2 / 3, 2 / 3, 0.0, 0.0, 3.0],  # 1 - (0+0+1)/3 ...
}


@pytest.mark.parametrize("name", list(EXPECTED))
def test_outcome_estimators_hand_computed(name):
    inp = _outcome_inputs(R, G)
    out = ADVANTAGE.get(name)(inp, P)
    exp = torch.tensor(EXPECTED[name])
    assert torch.allclose(out.advantages[:, :2], exp[:, None].expand(7, 2), atol=1e-6)
    assert (out.advantages[:, 2] == 0).all()
    assert out.returns is None


@settings(max_examples=50, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    n_groups=st.integers(1, 4),
    size=st.integers(2, 5),
    name=st.sampled_from(["grpo", "dr_grpo", "rloo"]),
    shift=st.floats(-5, 5),
)
def test_group_shift_invariance(seed, n_groups, size, name, shift):
    g = torch.Generator().manual_seed(seed)
    rewards = torch.randint(0, 3, (n_groups * size,), generator=g).double()
    group = torch.arange(n_groups).repeat_interleave(size)
    base = ADVANTAGE.get(name)(_outcome_inputs(rewards.tolist(), group.tolist()), P).advantages
    shifted = rewards + shift * (group == 0)  # shift only group 0
    out = ADVANTAGE.get(name)(_outcome_inputs(shifted.tolist(), group.tolist()), P).advantages
    assert torch.allclose(out, base, atol=1e-5)


def _two_turns(values=None):
    """One trajectory: action 0 = tokens 0-1, observation token 2, action 1 = token 3."""
    return AdvantageInputs(
        mask=torch.tensor([[1, 1, 0, 1]]),
        turn_index=torch.tensor([[0, 0, -1, 1]]),
        rewards=torch.tensor([1.0]),
        group=torch.tensor([0]),
        turn_rewards=torch.tensor([[0.0, 1.0]]),
        turn_mask=torch.tensor([[1, 1]]),
        values=values,
    )


def test_gae_hand_computed():
    inp = _two_turns(torch.tensor([[0.5, 0.6, 99.0, 0.8]]))
    out = ADVANTAGE.get("gae")(inp, replace(P, gamma=0.9, lam=0.8))
    # token 3: 1 + 0.9*0 - 0.8 = 0.2
    # token 1: delta = 0 + 0.9*0.8 - 0.6 = 0.12 (next value = token 3's, not the obs's 99)
    #          A = 0.12 + 0.72*0.2 = 0.264
    # token 0: delta = 0.9*0.6 - 0.5 = 0.04; A = 0.04 + 0.72*0.264 = 0.23008
    assert torch.allclose(out.advantages, torch.tensor([[0.23008, 0.264, 0.0, 0.2]]))
    assert torch.allclose(out.returns, torch.tensor([[0.73008, 0.864, 0.0, 1.0]]))


@pytest.mark.parametrize("obs_value", [float("nan"), -1e6, 0.0])
def test_gae_ignores_values_at_observation_tokens(obs_value):
    ref = ADVANTAGE.get("gae")(_two_turns(torch.tensor([[0.5, 0.6, 99.0, 0.8]])), P)
    out = ADVANTAGE.get("gae")(_two_turns(torch.tensor([[0.5, 0.6, obs_value, 0.8]])), P)
    assert torch.equal(out.advantages, ref.advantages)
    assert torch.equal(out.returns, ref.returns)


def test_gae_needs_values():
    with pytest.raises(ValueError, match="values"):
        ADVANTAGE.get("gae")(_two_turns(), P)


def test_reinforce_pp_hand_computed():
    inp = AdvantageInputs(
        mask=torch.tensor([[1, 1, 0, 1, 1]]),
        turn_index=torch.tensor([[0, 0, -1, 1, 1]]),
        rewards=torch.tensor([1.5]),
        group=torch.tensor([0]),
        turn_rewards=torch.tensor([[0.5, 1.0]]),
        turn_mask=torch.tensor([[1, 1]]),
    )
    out = ADVANTAGE.get("reinforce_pp")(inp, replace(P, gamma=0.5))
    # rewards on last token of each turn: 0.5 at token 1, 1.0 at token 4; obs token skipped
    # G4 = 1, G3 = 0.5, G1 = 0.5 + 0.5*0.5 = 0.75, G0 = 0.375
    assert torch.allclose(out.returns, torch.tensor([[0.375, 0.75, 0.0, 0.5, 1.0]]))
    mean = 2.625 / 4
    dev = torch.tensor([0.375, 0.75, 0.5, 1.0]) - mean
    var = (dev**2).sum() / 3  # unbiased, as verl's masked_whiten
    exp = dev / torch.sqrt(var + 1e-8)
    assert torch.allclose(out.advantages[0, [0, 1, 3, 4]], exp, atol=1e-6)
    assert out.advantages[0, 2] == 0


def test_reinforce_pp_uses_given_token_rewards():
    """KL-in-reward: the caller's token rewards win over turn rewards."""
    inp = _two_turns()
    inp.token_rewards = torch.tensor([[-0.1, -0.1, 5.0, 0.9]])  # obs token reward ignored
    out = ADVANTAGE.get("reinforce_pp")(inp, replace(P, gamma=1.0))
    assert torch.allclose(out.returns, torch.tensor([[0.7, 0.8, 0.0, 0.9]]))


def test_reinforce_pp_baseline_hand_computed():
    inp = AdvantageInputs(
        mask=torch.tensor([[1, 1, 0], [1, 1, 0]]),
        turn_index=torch.tensor([[0, 0, -1], [0, 0, -1]]),
        rewards=torch.tensor([1.0, 0.0]),
        group=torch.tensor([0, 0]),
    )
    out = ADVANTAGE.get("reinforce_pp_baseline")(inp, P)
    # scores 1, 0; minus group mean -> +-0.5 on 4 tokens; unbiased var = 1/3
    a = 0.5 / math.sqrt(1 / 3 + 1e-8)
    assert torch.allclose(out.advantages, torch.tensor([[a, a, 0.0], [-a, -a, 0.0]]), atol=1e-6)


@settings(max_examples=30, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    N=st.integers(1, 6),
    T=st.integers(1, 6),
    name=st.sampled_from(["grpo", "dr_grpo", "rloo", "reinforce_pp", "reinforce_pp_baseline", "gae"]),
)
def test_zero_outside_mask_and_padding_invariant(seed, N, T, name):
    g = torch.Generator().manual_seed(seed)
    mask = (torch.rand(N, T, generator=g) > 0.3).long()
    inp = AdvantageInputs(
        mask=mask,
        turn_index=torch.where(mask.bool(), 0, -1),
        rewards=torch.rand(N, generator=g),
        group=torch.arange(N) // 2,
        values=torch.rand(N, T, generator=g),
    )
    out = ADVANTAGE.get(name)(inp, replace(P, gamma=0.9, lam=0.95))
    assert (out.advantages[~mask.bool()] == 0).all() and torch.isfinite(out.advantages).all()
    pad = AdvantageInputs(
        mask=torch.cat([mask, torch.zeros(N, 2, dtype=mask.dtype)], 1),
        turn_index=torch.cat([inp.turn_index, torch.full((N, 2), -1)], 1),
        rewards=inp.rewards,
        group=inp.group,
        values=torch.cat([inp.values, torch.full((N, 2), float("nan"))], 1),
    )
    out2 = ADVANTAGE.get(name)(pad, replace(P, gamma=0.9, lam=0.95))
    assert torch.allclose(out2.advantages[:, :T], out.advantages, atol=1e-6)
