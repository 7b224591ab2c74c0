"""algo.clip.level: hand-computed ratios and clipping, SAMPO mask, gradient invariants."""

import math
from dataclasses import replace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from algorithms import POLICY_LOSS, ClipParams, negative_advantage_seq_mask

PPO = ClipParams(eps_low=0.2, eps_high=0.2, dual_c=None, tau_pos=1.0, tau_neg=1.05)

LN = math.log


def _call(level, logp, old, adv, mask, action_id=None, traj_id=None, params=PPO):
    action_id = torch.zeros_like(mask) if action_id is None else action_id
    traj_id = torch.zeros_like(mask) if traj_id is None else traj_id
    return POLICY_LOSS.get(level)(logp, old, adv, mask, action_id, traj_id, params)


def test_token_hand_computed():
    old = torch.zeros(1, 5)
    logp = torch.tensor([[LN(1.5), LN(0.5), LN(1.1), LN(0.7), 0.0]])
    adv = torch.tensor([[1.0, -1.0, 1.0, -1.0, 1.0]])
    mask = torch.tensor([[1, 1, 1, 1, 0]])
    loss, stats = _call("token", logp, old, adv, mask)
    # r=1.5,A=+1: max(-1.5, -1.2); r=0.5,A=-1: max(0.5, 0.8); r=1.1: -1.1; r=0.7: max(0.7, 0.8)
    assert torch.allclose(loss, torch.tensor([[-1.2, 0.8, -1.1, 0.8, 0.0]]))
    assert stats["clip_frac_low"].item() == pytest.approx(0.5)
    assert stats["clip_frac_high"].item() == pytest.approx(0.25)
    assert stats["clip_frac"].item() == pytest.approx(0.75)
    assert stats["num_tokens"].item() == 4
    assert stats["ratio_max"].item() == pytest.approx(1.5)
    assert stats["ratio_min"].item() == pytest.approx(0.5)
    assert all(v.dim() == 0 for v in stats.values())


def test_clip_higher():
    logp, old = torch.tensor([[LN(1.25)]]), torch.zeros(1, 1)
    adv, mask = torch.ones(1, 1), torch.ones(1, 1)
    sym, _ = _call("token", logp, old, adv, mask, params=PPO)
    dapo, _ = _call("token", logp, old, adv, mask, params=replace(PPO, eps_high=0.28))
    assert sym.item() == pytest.approx(-1.2) and dapo.item() == pytest.approx(-1.25)


def test_dual_clip():
    logp, old = torch.tensor([[LN(5.0), LN(2.0)]]), torch.zeros(1, 2)
    adv, mask = torch.tensor([[-1.0, -1.0]]), torch.ones(1, 2)
    off, _ = _call("token", logp, old, adv, mask)
    on, stats = _call("token", logp, old, adv, mask, params=replace(PPO, dual_c=3.0))
    assert torch.allclose(off, torch.tensor([[5.0, 2.0]]))  # max(r, 0.8) for A = -1
    assert torch.allclose(on, torch.tensor([[3.0, 2.0]]))  # min(5, c * 1) = 3
    assert stats["dual_clip_frac"].item() == pytest.approx(0.5)


def test_log_ratio_clamped_before_exp():
    logp, old = torch.tensor([[500.0, -500.0]]), torch.zeros(1, 2)
    adv, mask = torch.tensor([[1.0, -1.0]]), torch.ones(1, 2)
    loss, stats = _call("none", logp, old, adv, mask)
    assert torch.isfinite(loss).all()
    assert loss[0, 0].item() == pytest.approx(-math.exp(20.0), rel=1e-5)
    assert loss[0, 1].item() == pytest.approx(math.exp(-20.0), rel=1e-5)


def test_none_is_unclipped():
    logp, old = torch.tensor([[LN(3.0)]]), torch.zeros(1, 1)
    loss, stats = _call("none", logp, old, torch.tensor([[2.0]]), torch.ones(1, 1))
    assert loss.item() == pytest.approx(-6.0)
    assert stats["clip_frac"].item() == 0.0


def _four_tokens():
    old = torch.zeros(1, 5)
    logp = torch.tensor([[LN(1.5), LN(0.5), LN(1.1), LN(0.7), 0.0]])
    adv = torch.tensor([[1.0, -1.0, 1.0, -1.0, 1.0]])
    mask = torch.tensor([[1, 1, 1, 1, 0]])
    return logp, old, adv, mask


def test_cispo_hand_computed():
    logp, old, adv, mask = _four_tokens()
    x = logp.clone().requires_grad_(True)
    loss, stats = _call("cispo", x, old, adv, mask)  # bounds 0.2 / 0.2 (verl's defaults)
    # weight w_hat = clip(r, 0.8, 1.2) = 1.2, 0.8, 1.1, 0.8; loss = -w_hat A logp
    w = [1.2, 0.8, 1.1, 0.8]
    expected = [-w[0] * LN(1.5), w[1] * LN(0.5), -w[2] * LN(1.1), w[3] * LN(0.7), 0.0]
    assert torch.allclose(loss, torch.tensor([expected]), atol=1e-6)
    loss.sum().backward()
    # every token keeps a gradient -w_hat A, the clipped ones too (PPO would give 0 on token 0)
    assert torch.allclose(x.grad, torch.tensor([[-1.2, 0.8, -1.1, 0.8, 0.0]]), atol=1e-6)
    assert stats["clip_frac_high"].item() == pytest.approx(0.25)
    assert stats["clip_frac_low"].item() == pytest.approx(0.5)
    assert stats["ratio_max"].item() == pytest.approx(1.5)


def test_cispo_without_lower_bound():
    """The paper's setting: eps_low >= 1 leaves the weight unbounded below."""
    logp, old, adv, mask = _four_tokens()
    x = logp.clone().requires_grad_(True)
    loss, _ = _call("cispo", x, old, adv, mask, params=replace(PPO, eps_low=1.0, eps_high=0.28))
    loss.sum().backward()
    assert torch.allclose(x.grad, torch.tensor([[-1.28, 0.5, -1.1, 0.7, 0.0]]), atol=1e-6)


def test_sapo_hand_computed():
    logp, old, adv, mask = _four_tokens()
    x = logp.clone().requires_grad_(True)
    loss, stats = _call("sapo", x, old, adv, mask)
    sig = lambda z: 1.0 / (1.0 + math.exp(-z))  # noqa: E731
    # tau = 1 for A > 0, 1.05 for A < 0; loss = -sigmoid(tau (r - 1)) 4 / tau A
    expected = [
        -sig(0.5) * 4.0,  # r = 1.5, A = +1: -2.4898
        sig(1.05 * -0.5) * 4.0 / 1.05,  # r = 0.5, A = -1: +1.4159
        -sig(0.1) * 4.0,
        sig(1.05 * -0.3) * 4.0 / 1.05,
        0.0,
    ]
    assert torch.allclose(loss, torch.tensor([expected]), atol=1e-6)
    assert expected[0] == pytest.approx(-2.48984, abs=1e-5) and expected[1] == pytest.approx(1.41594, abs=1e-5)
    loss.sum().backward()
    # d loss / d logp = -4 A r sigmoid(z) (1 - sigmoid(z)), z = tau (r - 1): soft, never exactly 0
    grad = [-4 * a * r * sig(t * (r - 1)) * (1 - sig(t * (r - 1))) for a, r, t in ((1, 1.5, 1.0), (-1, 0.5, 1.05))]
    assert x.grad[0, 0].item() == pytest.approx(grad[0], rel=1e-5)
    assert x.grad[0, 1].item() == pytest.approx(grad[1], rel=1e-5)
    assert stats["clip_frac_high"].item() == pytest.approx(0.25)  # outside [0.8, 1.2], nothing clipped
    assert stats["dual_clip_frac"].item() == 0.0


def test_sapo_temperatures():
    logp, old = torch.tensor([[LN(2.0), LN(2.0)]]), torch.zeros(1, 2)
    adv, mask = torch.tensor([[1.0, -1.0]]), torch.ones(1, 2)
    loss, _ = _call("sapo", logp, old, adv, mask, params=replace(PPO, tau_pos=2.0, tau_neg=0.5))
    sig = lambda z: 1.0 / (1.0 + math.exp(-z))  # noqa: E731
    assert torch.allclose(loss, torch.tensor([[-sig(2.0) * 2.0, sig(0.5) * 8.0]]), atol=1e-6)


def _verl_cispo(logp, old, adv, eps_low, eps_high):
    """verl compute_policy_loss_cispo, per token (before aggregation)."""
    ratio = torch.exp(torch.clamp(logp - old, min=-20.0, max=20.0))
    clipped = torch.clamp(ratio, 1 - eps_low, 1 + eps_high).detach()
    return -clipped * adv * logp


def _verl_sapo(logp, old, adv, tau_pos, tau_neg):
    """verl compute_policy_loss_sapo, per token (before aggregation)."""
    ratio = torch.exp(torch.clamp(logp - old, min=-20.0, max=20.0))
    taus = torch.where(adv > 0, torch.as_tensor(tau_pos, dtype=adv.dtype), torch.as_tensor(tau_neg, dtype=adv.dtype))
    return -torch.sigmoid(taus * (ratio - 1.0)) * (4.0 / taus) * adv


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), B=st.integers(1, 5), T=st.integers(1, 8), level=st.sampled_from(["cispo", "sapo"]))
def test_cispo_and_sapo_match_verl_per_token(seed, B, T, level):
    """Loss and gradient equal verl's per-token losses on the trained tokens (0 elsewhere)."""
    logp, old, adv, mask, aid, tid = _random(seed, B, T)
    params = replace(PPO, eps_high=0.28)
    x, y = logp.clone().requires_grad_(True), logp.clone().requires_grad_(True)
    ours, _ = POLICY_LOSS.get(level)(x, old, adv, mask, aid, tid, params)
    ref = (_verl_cispo(y, old, adv, 0.2, 0.28) if level == "cispo" else _verl_sapo(y, old, adv, 1.0, 1.05)) * mask
    assert torch.allclose(ours, ref, atol=1e-12)
    ours.sum().backward()
    ref.sum().backward()
    assert torch.allclose(x.grad, y.grad, atol=1e-12)


def _two_actions():
    # one row, action 0 = tokens 0-1, action 1 = tokens 2-3, token 4 = observation
    old = torch.zeros(1, 5)
    logp = torch.tensor([[LN(2.0), 0.0, LN(0.9), LN(0.9), 7.0]])
    adv = torch.tensor([[1.0, 1.0, -1.0, -1.0, 5.0]])
    mask = torch.tensor([[1, 1, 1, 1, 0]])
    action_id = torch.tensor([[0, 0, 1, 1, -1]])
    return logp, old, adv, mask, action_id


def test_sequence_hand_computed():
    logp, old, adv, mask, aid = _two_actions()
    loss, stats = _call("sequence", logp, old, adv, mask, aid)
    # action 0: s = exp((ln2 + 0)/2) = sqrt(2) > 1.2, A > 0 -> -1.2; action 1: s = 0.9 -> 0.9
    assert torch.allclose(loss, torch.tensor([[-1.2, -1.2, 0.9, 0.9, 0.0]]))
    assert stats["clip_frac_high"].item() == pytest.approx(0.5)
    assert stats["ratio_max"].item() == pytest.approx(math.sqrt(2.0))


def test_trajectory_hand_computed():
    logp, old, adv, mask, aid = _two_actions()
    loss, _ = _call("trajectory", logp, old, adv, mask, aid, torch.zeros_like(aid))
    s = (2.0 * 0.81) ** 0.25  # exp(mean(ln2, 0, ln.9, ln.9)) = 1.1282, inside [0.8, 1.2]
    assert torch.allclose(loss, torch.tensor([[-s, -s, s, s, 0.0]]))


def test_trajectory_spans_rows():
    """Per-step layout: one trajectory over two rows has one ratio."""
    logp = torch.tensor([[LN(2.0), 0.0], [LN(0.9), LN(0.9)]])
    adv, mask = torch.ones(2, 2), torch.ones(2, 2)
    loss, _ = _call(
        "trajectory", logp, torch.zeros(2, 2), adv, mask, torch.tensor([[0, 0], [1, 1]]), torch.tensor([[7, 7], [7, 7]])
    )
    s = (2.0 * 0.81) ** 0.25
    assert torch.allclose(loss, torch.full((2, 2), -s))


def test_sampo_negative_advantage_mask():
    # three actions: A<0 & mean log(old/p)=0.5 > delta -> dropped; A>0 same drift -> kept;
    # A<0 with drift 0.1 -> kept
    old = torch.zeros(1, 6)
    logp = torch.tensor([[-0.5, -0.5, -0.5, -0.5, -0.1, -0.1]])
    adv = torch.tensor([[-1.0, -1.0, 1.0, 1.0, -1.0, -1.0]])
    mask = torch.ones(1, 6)
    aid = torch.tensor([[0, 0, 1, 1, 2, 2]])
    out = negative_advantage_seq_mask(logp, old, adv, mask, aid, delta=0.223)
    assert torch.equal(out, torch.tensor([[0.0, 0.0, 1.0, 1.0, 1.0, 1.0]]))
    assert out.dtype == mask.dtype
    # untrained tokens stay untrained, their values never matter
    mask2 = torch.tensor([[1.0, 1.0, 1.0, 1.0, 1.0, 0.0]])
    logp2 = logp.clone()
    logp2[0, 5] = float("nan")
    out2 = negative_advantage_seq_mask(logp2, old, adv, mask2, aid, delta=0.223)
    assert torch.equal(out2, torch.tensor([[0.0, 0.0, 1.0, 1.0, 1.0, 0.0]]))


def _random(seed, B, T, same=False):
    g = torch.Generator().manual_seed(seed)
    old = torch.randn(B, T, generator=g, dtype=torch.float64) - 2
    logp = old.clone() if same else old + 0.3 * torch.randn(B, T, generator=g, dtype=torch.float64)
    mask = (torch.rand(B, T, generator=g) > 0.3).long()
    # turn-actions: contiguous spans of 1-3 tokens, ids unique across the batch
    action_id = torch.arange(B * T).reshape(B, T) // 2
    traj_id = torch.arange(B).repeat_interleave(T).reshape(B, T) // 2  # 2 rows per trajectory
    per_action = torch.randn(B * T, generator=g, dtype=torch.float64)
    adv = per_action[action_id]  # constant per action
    return logp, old, adv, mask, action_id, traj_id


LEVELS = ["token", "sequence", "trajectory", "none", "cispo", "sapo"]


@settings(max_examples=50, deadline=None)
@given(seed=st.integers(0, 10_000), B=st.integers(1, 6), T=st.integers(1, 8))
def test_same_gradient_at_ratio_one(seed, B, T):
    logp, old, adv, mask, aid, tid = _random(seed, B, T, same=True)
    grads = []
    for level in LEVELS:
        x = logp.clone().requires_grad_(True)
        loss, _ = POLICY_LOSS.get(level)(x, old, adv, mask, aid, tid, replace(PPO, eps_low=3e-4, eps_high=4e-4))
        loss.sum().backward()
        grads.append(x.grad)
    expected = torch.where(mask.bool(), -adv, 0.0)  # -A_k d logp_k
    for g in grads:
        assert torch.allclose(g, expected, atol=1e-12)


@settings(max_examples=50, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    B=st.integers(1, 6),
    T=st.integers(1, 8),
    level=st.sampled_from(LEVELS),
    dual=st.booleans(),
)
def test_masked_positions_never_matter(seed, B, T, level, dual):
    logp, old, adv, mask, aid, tid = _random(seed, B, T)
    params = replace(PPO, eps_high=0.28, dual_c=3.0 if dual else None)
    fn = POLICY_LOSS.get(level)
    loss, stats = fn(logp, old, adv, mask, aid, tid, params)
    off = ~mask.bool()
    noise = torch.full_like(logp, float("nan"))
    x = torch.where(off, noise, logp).requires_grad_(True)
    loss2, stats2 = fn(
        x,
        torch.where(off, -noise, old),
        torch.where(off, noise, adv),
        mask,
        torch.where(off, 999, aid),
        torch.where(off, 999, tid),
        params,
    )
    loss2.sum().backward()
    assert torch.equal(loss, loss2)
    assert (loss[off] == 0).all() and torch.isfinite(loss).all()
    assert torch.isfinite(x.grad).all() and (x.grad[off] == 0).all()
    for k in ("clip_frac_low", "clip_frac_high", "clip_frac", "dual_clip_frac"):
        assert 0.0 <= stats[k].item() <= 1.0
        assert stats[k].item() == stats2[k].item()
