"""algo.correction.name: hand-computed weights and rejections of every correction, the band checks,
sequences spanning rows, and untrained positions that never matter."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from algorithms import CORRECTION, CorrectionParams
from algorithms.correction import BANDS, check_params

OWN = CorrectionParams(c=None, lo=None, hi=None)  # None: each correction's own default

LN = math.log
# two sequences; rollout_logp = 0, so rho = exp(old_logp) is the ratio written below
# row 0: sequence 0, sampled ratios 3, 0.4, an untrained observation token (ratio never read), 1.5
# row 1: sequence 1, sampled ratios 0.8, 1.25, 0.45, then padding
RATIOS = [[3.0, 0.4, 7.0, 1.5], [0.8, 1.25, 0.45, 9.0]]
OLD = torch.tensor(RATIOS).log()
ROLL = torch.zeros(2, 4)
MASK = torch.tensor([[1.0, 1.0, 0.0, 1.0], [1.0, 1.0, 1.0, 0.0]])
SEQ = torch.tensor([[0, 0, 0, 0], [1, 1, 1, -1]])
S0, S1 = 3.0 * 0.4 * 1.5, 0.8 * 1.25 * 0.45  # sequence ratios exp(sum delta): 1.8 and 0.45


def _call(name, params=OWN, old=OLD, roll=ROLL, mask=MASK, seq=SEQ):
    return CORRECTION.get(name)(roll, old, mask, seq, params)


def _close(x, expected):
    assert torch.allclose(x, torch.tensor(expected, dtype=x.dtype), atol=1e-6), x


def test_none_changes_nothing():
    out = _call("none")
    assert out.weight is None and out.reject is None


def test_tis_token_truncates_each_ratio_at_c():
    _close(_call("tis_token").weight, [[2.0, 0.4, 1.0, 1.5], [0.8, 1.25, 0.45, 1.0]])  # C = 2 (verl)
    _close(
        _call("tis_token", CorrectionParams(c=1.3, lo=None, hi=None)).weight,
        [[1.3, 0.4, 1.0, 1.3], [0.8, 1.25, 0.45, 1.0]],
    )
    assert _call("tis_token").reject is None


def test_tis_seq_gives_every_token_of_a_sequence_its_truncated_product():
    # sequence 0: 1.8 < 2 on all four positions (the observation follows its sequence); sequence 1: 0.45
    _close(_call("tis_seq").weight, [[S0] * 4, [S1, S1, S1, 1.0]])
    _close(_call("tis_seq", CorrectionParams(c=1.5, lo=None, hi=None)).weight, [[1.5] * 4, [S1, S1, S1, 1.0]])


def test_mis_token_rejects_tokens_outside_the_band():
    out = _call("mis_token")  # [0.5, 2]
    assert out.weight is None
    assert out.reject.tolist() == [[True, True, False, False], [False, False, True, False]]
    wide = _call("mis_token", CorrectionParams(c=None, lo=0.1, hi=5.0))
    assert not wide.reject.any()


def test_mis_seq_rejects_whole_sequences():
    out = _call("mis_seq")  # 1.8 inside [0.5, 2], 0.45 below
    assert out.reject.tolist() == [[False] * 4, [True, True, True, False]]
    out = _call("mis_seq", CorrectionParams(c=None, lo=0.4, hi=1.5))  # 1.8 above, 0.45 inside
    assert out.reject.tolist() == [[True] * 4, [False] * 4]


def test_icepop_keeps_the_ratio_inside_its_band_and_zeroes_it_outside():
    out = _call("icepop")  # [0.5, 5]: 0.4 and 0.45 fall out, 3 stays (no truncation)
    _close(out.weight, [[3.0, 0.0, 1.0, 1.5], [0.8, 1.25, 0.0, 1.0]])
    assert out.reject is None
    _close(
        _call("icepop", CorrectionParams(c=None, lo=None, hi=2.0)).weight, [[0.0, 0.0, 1.0, 1.5], [0.8, 1.25, 0.0, 1.0]]
    )


def test_geo_seq_mask_uses_the_geometric_mean_over_sampled_tokens():
    geo0, geo1 = S0 ** (1 / 3), S1 ** (1 / 3)  # 1.216 and 0.766: both outside [0.99, 1.01]
    assert geo0 > 1.01 and geo1 < 0.99
    assert _call("geo_seq_mask").reject.tolist() == [[True] * 4, [True, True, True, False]]
    kept = _call("geo_seq_mask", CorrectionParams(c=None, lo=0.7, hi=1.25))
    assert not kept.reject.any()
    only0 = _call("geo_seq_mask", CorrectionParams(c=None, lo=0.8, hi=1.25))  # geo1 = 0.766 < 0.8
    assert only0.reject.tolist() == [[False] * 4, [True, True, True, False]]


def test_decoupled_weights_by_the_untruncated_ratio_and_rejects_above_its_cap():
    out = _call("decoupled")
    _close(out.weight, [[3.0, 0.4, 1.0, 1.5], [0.8, 1.25, 0.45, 1.0]])
    assert out.reject is None  # AReaL: no cap unless configured
    capped = _call("decoupled", CorrectionParams(c=2.0, lo=None, hi=None))
    assert capped.reject.tolist() == [[True, False, False, False], [False] * 4]


def test_action_unit_and_sequences_spanning_rows():
    """Per-step layout: one trajectory over two rows is one sequence; with turn-action ids each action is."""
    traj = torch.tensor([[0, 0, 0, 0], [0, 0, 0, -1]])
    _close(_call("tis_seq", seq=traj).weight, [[min(S0 * S1, 2.0)] * 4, [S0 * S1] * 3 + [1.0]])
    actions = torch.tensor([[0, 0, 0, 1], [2, 2, 3, -1]])
    _close(_call("tis_seq", seq=actions).weight, [[1.2, 1.2, 1.2, 1.5], [1.0, 1.0, 0.45, 1.0]])


def test_log_ratios_are_clamped_before_exp():
    old = torch.tensor([[100.0, -100.0]])
    roll, mask, seq = torch.zeros(1, 2), torch.ones(1, 2), torch.zeros(1, 2, dtype=torch.long)
    w = CORRECTION.get("decoupled")(roll, old, mask, seq, OWN).weight
    assert torch.isfinite(w).all()
    assert w[0, 0].item() == pytest.approx(math.exp(20.0), rel=1e-5)
    assert w[0, 1].item() == pytest.approx(math.exp(-20.0), rel=1e-5)
    assert CORRECTION.get("tis_seq")(roll, old, mask, seq, OWN).weight.tolist() == [[1.0, 1.0]]


def test_band_checks():
    with pytest.raises(ValueError, match="algo.correction.lo is set, but correction 'tis_token' has no band"):
        check_params("tis_token", CorrectionParams(c=None, lo=0.5, hi=None))
    with pytest.raises(ValueError, match="must contain 1"):
        check_params("icepop", CorrectionParams(c=None, lo=1.5, hi=None))
    with pytest.raises(ValueError, match="must contain 1"):
        check_params("geo_seq_mask", CorrectionParams(c=None, lo=None, hi=0.995))
    for name in BANDS:
        check_params(name, OWN)  # every default band contains 1
    check_params("decoupled", CorrectionParams(c=5.0, lo=None, hi=None))


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), B=st.integers(1, 5), T=st.integers(1, 7), name=st.sampled_from(CORRECTION.names()))
def test_untrained_positions_never_matter(seed, B, T, name):
    g = torch.Generator().manual_seed(seed)
    roll = torch.randn(B, T, generator=g, dtype=torch.float64) - 1
    old = roll + 0.4 * torch.randn(B, T, generator=g, dtype=torch.float64)
    mask = (torch.rand(B, T, generator=g) > 0.3).double()
    seq = torch.arange(B).repeat_interleave(T).reshape(B, T) // 2
    fn, params = CORRECTION.get(name), OWN
    off = ~mask.bool()
    nan = torch.full_like(roll, float("nan"))
    a = fn(roll, old, mask, seq, params)
    b = fn(torch.where(off, nan, roll), torch.where(off, nan, old), mask, seq, params)
    for x, y in ((a.weight, b.weight), (a.reject, b.reject)):
        assert (x is None) == (y is None)
        if x is not None:
            assert torch.equal(x, y)
            assert not x.is_floating_point() or (torch.isfinite(x).all() and (x >= 0).all())
    if a.weight is not None:
        assert not a.weight.requires_grad
