"""algo.agg: hand-computed cases, micro-batching and masking invariants."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from algorithms import AGGREGATION, AggParams, global_counts

L = torch.tensor([[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 0.0, 0.0], [7.0, 8.0, 9.0, 9.0]])
M = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]])  # third row: nothing trained
P = AggParams(num_tokens=None, num_seqs=None, agg_len=8)  # None: each call counts its own

# tokens 1+2+3 (row 0) and 5 (row 1); row 2 is empty and excluded everywhere
EXPECTED = {
    "token-mean": 11 / 4,
    "seq-mean-token-mean": (6 / 3 + 5 / 1) / 2,
    "seq-mean-token-sum": (6 + 5) / 2,
    "seq-mean-token-sum-norm": 11 / (2 * 8),  # B = 2 non-empty rows, as TRL (B * T_const)
}


@pytest.mark.parametrize("name", list(EXPECTED))
def test_hand_computed(name):
    assert AGGREGATION.get(name)(L, M, P).item() == pytest.approx(EXPECTED[name])


@pytest.mark.parametrize("name", list(EXPECTED))
def test_masked_values_never_matter(name):
    noisy = torch.where(M.bool(), L, torch.full_like(L, float("nan")))
    assert AGGREGATION.get(name)(noisy, M, P).item() == pytest.approx(EXPECTED[name])


@pytest.mark.parametrize("name", list(EXPECTED))
def test_empty_mask_gives_zero_not_nan(name):
    out = AGGREGATION.get(name)(L, torch.zeros_like(M), P)
    assert out.item() == 0.0


def test_gradient_only_on_trained_tokens():
    x = L.clone().requires_grad_(True)
    AGGREGATION.get("token-mean")(x, M, P).backward()
    assert torch.equal(x.grad, M.float() / 4)


def _random(seed, B, T, p_empty=0.2):
    g = torch.Generator().manual_seed(seed)
    loss = torch.randn(B, T, generator=g, dtype=torch.float64)
    mask = (torch.rand(B, T, generator=g) > 0.4).long()
    mask[torch.rand(B, generator=g) < p_empty] = 0
    return loss, mask


@settings(max_examples=50, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    B=st.integers(1, 8),
    T=st.integers(1, 7),
    name=st.sampled_from(list(EXPECTED)),
    data=st.data(),
)
def test_micro_batches_sum_to_full_batch(seed, B, T, name, data):
    loss, mask = _random(seed, B, T)
    fn = AGGREGATION.get(name)
    own = AggParams(num_tokens=None, num_seqs=None, agg_len=T)
    g = global_counts(mask, own)
    full = fn(loss, mask, own)
    cuts = sorted(data.draw(st.lists(st.integers(1, B - 1), max_size=3, unique=True))) if B > 1 else []
    bounds = [0, *cuts, B]
    micro = sum(fn(loss[a:b], mask[a:b], g) for a, b in zip(bounds, bounds[1:]))
    assert torch.allclose(micro, full, atol=1e-12)
    # 1 x B == B x 1 (gradient accumulation never changes the result)
    single = sum(fn(loss[i : i + 1], mask[i : i + 1], g) for i in range(B))
    assert torch.allclose(single, full, atol=1e-12)


@settings(max_examples=50, deadline=None)
@given(seed=st.integers(0, 10_000), B=st.integers(1, 8), T=st.integers(1, 7), name=st.sampled_from(list(EXPECTED)))
def test_padding_and_masked_values_invariant(seed, B, T, name):
    loss, mask = _random(seed, B, T)
    fn = AGGREGATION.get(name)
    own = AggParams(num_tokens=None, num_seqs=None, agg_len=T)
    ref = fn(loss, mask, own)
    noisy = torch.where(mask.bool(), loss, torch.randn_like(loss) * 1e6)
    padded_l = torch.cat([noisy, torch.randn(B, 3, dtype=loss.dtype)], 1)  # extra padding cols
    padded_m = torch.cat([mask, torch.zeros(B, 3, dtype=mask.dtype)], 1)
    extra_l = torch.cat([padded_l, torch.randn(2, T + 3, dtype=loss.dtype)], 0)  # empty rows
    extra_m = torch.cat([padded_m, torch.zeros(2, T + 3, dtype=mask.dtype)], 0)
    assert torch.allclose(fn(extra_l, extra_m, own), ref, atol=1e-12)
    assert math.isfinite(ref.item())


@settings(max_examples=50, deadline=None)
@given(seed=st.integers(0, 10_000), B=st.integers(1, 8), T=st.integers(1, 7), length=st.integers(1, 7))
def test_seq_mean_token_mean_equals_token_mean_at_equal_lengths(seed, B, T, length):
    length = min(length, T)
    loss, _ = _random(seed, B, T)
    mask = torch.zeros(B, T, dtype=torch.long)
    for b in range(B):  # every row trains `length` tokens, at varying offsets
        start = (seed + b) % (T - length + 1)
        mask[b, start : start + length] = 1
    a = AGGREGATION.get("seq-mean-token-mean")(loss, mask, P)
    b = AGGREGATION.get("token-mean")(loss, mask, P)
    assert torch.allclose(a, b, atol=1e-12)
