"""algo.kl.estimator, KL-in-reward helper and chunked entropy."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from algorithms import KL_ESTIMATOR, entropy_from_logits, kl_penalty_rewards

LOGP, REF = torch.tensor([[0.0, -1.0]]), torch.tensor([[-1.0, 0.0]])  # d = (1, -1)


@pytest.mark.parametrize(
    "name, exp",
    [
        ("none", [0.0, 0.0]),
        ("k1", [1.0, -1.0]),
        ("k2", [0.5, 0.5]),
        ("k3", [math.exp(-1) + 1 - 1, math.exp(1) - 1 - 1]),  # 0.3679, 0.7183
    ],
)
def test_hand_computed(name, exp):
    assert torch.allclose(KL_ESTIMATOR.get(name)(LOGP, REF), torch.tensor([exp]))


@settings(max_examples=50, deadline=None)
@given(seed=st.integers(0, 10_000), scale=st.floats(0.01, 100.0))
def test_k2_k3_nonnegative_and_finite(seed, scale):
    g = torch.Generator().manual_seed(seed)
    logp = torch.randn(3, 5, generator=g) * scale
    ref = torch.randn(3, 5, generator=g) * scale
    for name in ("k2", "k3"):
        kl = KL_ESTIMATOR.get(name)(logp, ref)
        assert (kl >= 0).all() and torch.isfinite(kl).all()


def test_k3_zero_at_equal_policies():
    x = torch.randn(2, 3)
    assert torch.equal(KL_ESTIMATOR.get("k3")(x, x), torch.zeros(2, 3))


def test_kl_penalty_rewards():
    r = torch.tensor([[0.0, 0.0, 1.0]])
    kl = torch.tensor([[0.5, 9.0, 0.25]], requires_grad=True)
    out = kl_penalty_rewards(r, kl, beta=0.1, mask=torch.tensor([[1, 0, 1]]))
    assert torch.allclose(out, torch.tensor([[-0.05, 0.0, 0.975]]))
    assert not out.requires_grad


def test_entropy_hand_computed():
    logits = torch.tensor(
        [
            [0.0, 0.0, 0.0, 0.0],
            [math.log(2), 0.0, 0.0, -float("inf")],
            [0.0, -float("inf"), -float("inf"), -float("inf")],
        ]
    )
    h = entropy_from_logits(logits)
    # uniform over 4: ln 4; (1/2, 1/4, 1/4): 0.5 ln 2 + 0.5 ln 4; one-hot: 0
    assert torch.allclose(h, torch.tensor([math.log(4), 0.5 * math.log(2) + 0.5 * math.log(4), 0.0]))


def test_entropy_chunked_matches_and_has_gradient():
    x = torch.randn(3, 5, 11, dtype=torch.float64, requires_grad=True)
    full = entropy_from_logits(x, chunk_size=1000)
    chunked = entropy_from_logits(x, chunk_size=4)
    assert full.shape == (3, 5) and torch.allclose(full, chunked)
    (g1,) = torch.autograd.grad(full.sum(), x)
    (g2,) = torch.autograd.grad(chunked.sum(), x)
    assert torch.allclose(g1, g2) and torch.isfinite(g2).all()
    masked = torch.tensor([[0.0, -float("inf"), 1.0]], requires_grad=True)
    entropy_from_logits(masked).sum().backward()
    assert torch.isfinite(masked.grad).all()
