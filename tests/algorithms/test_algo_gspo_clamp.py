"""The sequence-level ratio (GSPO) against verl's formula: the mean token log-ratio clamped above at 10 on the
sum that carries the gradient, so a clamped action has ratio e^10 and no gradient; no lower bound."""

import math

import pytest
import torch

from algorithms import POLICY_LOSS
from algorithms.policy_loss import SEQ_LOG_RATIO_MAX
from algorithms.types import ClipParams

PARAMS = ClipParams(eps_low=0.2, eps_high=0.2, dual_c=None, tau_pos=1.0, tau_neg=1.05)


def verl_ratio(logp, old_logp, mask):
    """verl compute_policy_loss_gspo, one row = one sequence: log s = logp - sg[logp] + sg[mean(logp - old)],
    clamped with max=10, then exp."""
    n = mask.sum(-1).clamp(min=1)
    seq = ((logp - old_logp) * mask).sum(-1) / n
    log_s = logp - logp.detach() + seq.detach().unsqueeze(-1)
    return torch.exp(log_s.clamp(max=10.0))


def ours(level, logp, old_logp, adv, mask):
    B, T = mask.shape
    action_id = torch.arange(B).unsqueeze(1).expand(B, T).clone()  # one action per row
    return POLICY_LOSS.get(level)(logp, old_logp, adv, mask, action_id, action_id.clone(), PARAMS)


@pytest.mark.parametrize("level", ["sequence", "trajectory"])
@pytest.mark.parametrize("shift", [0.0, 0.3, 9.5, 12.0, -30.0])
def test_sequence_ratio_matches_verl_in_value_and_gradient(level, shift):
    g = torch.Generator().manual_seed(0)
    B, T = 4, 6
    old = -torch.rand(B, T, generator=g) * 3
    base = old + shift + 0.2 * torch.randn(B, T, generator=g)
    mask = torch.ones(B, T)
    mask[1, 4:] = 0
    mask[3, 2:] = 0
    adv = torch.tensor([[1.0], [-1.0], [0.5], [-2.0]]).expand(B, T).clone()

    lp_ours = base.clone().requires_grad_(True)
    loss, stats = ours(level, lp_ours, old, adv, mask)
    loss.sum().backward()

    lp_verl = base.clone().requires_grad_(True)
    r = verl_ratio(lp_verl, old, mask)
    ref = torch.maximum(-adv * r, -adv * r.clamp(1 - PARAMS.eps_low, 1 + PARAMS.eps_high)) * mask
    ref.sum().backward()

    assert torch.allclose(loss, ref, rtol=1e-5, atol=1e-6)
    assert torch.allclose(lp_ours.grad, lp_verl.grad, rtol=1e-5, atol=1e-6)
    if shift > SEQ_LOG_RATIO_MAX:  # every action clamped: constant e^10 ratio, no gradient at all
        assert torch.all(lp_ours.grad == 0)
        assert stats["ratio_min"].item() == pytest.approx(math.exp(SEQ_LOG_RATIO_MAX), rel=1e-6)
    if shift < -20:  # no lower bound: the ratio follows the mean log-ratio down (the old token clamp stopped at -20)
        assert stats["ratio_max"].item() < math.exp(-25)


def test_unclamped_ratio_is_the_geometric_mean_and_tokens_keep_their_gradient():
    old = torch.tensor([[-1.0, -2.0, -0.5]])
    lp = (old + torch.tensor([[0.1, -0.3, 0.05]])).requires_grad_(True)
    mask = torch.ones(1, 3)
    adv = torch.full((1, 3), 0.01)  # tiny advantage: inside the clip range the surrogate is -A s
    loss, stats = ours("sequence", lp, old, adv, mask)
    s = math.exp((0.1 - 0.3 + 0.05) / 3)
    assert stats["ratio_mean"].item() == pytest.approx(s, rel=1e-6)
    loss.sum().backward()
    assert torch.allclose(lp.grad, torch.full((1, 3), -0.01 * s), rtol=1e-5)
