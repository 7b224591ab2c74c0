"""analysis.stats: bootstrap CI, IQM and baseline differences on hand-computed cases."""

import math

import numpy as np
import pytest

from analysis.stats import bootstrap_ci, iqm, paired_difference, stratified_bootstrap_ci


def test_identical_seeds_give_zero_width():
    e = bootstrap_ci([0.4, 0.4, 0.4])
    assert e.value == pytest.approx(0.4) and e.n == 3
    assert e.lo == e.hi == e.value and e.half_width == 0


def test_two_values_percentile_interval_is_hand_computed():
    # resampled means of [0, 1]: 0 (p=1/4), 0.5 (1/2), 1 (1/4) -> 2.5% and 97.5% percentiles are 0 and 1
    e = bootstrap_ci([0.0, 1.0])
    assert (e.value, e.lo, e.hi) == (0.5, 0.0, 1.0)


def test_interval_contains_mean_and_is_deterministic():
    x = np.random.default_rng(3).normal(size=8)
    a, b = bootstrap_ci(x), bootstrap_ci(x)
    assert a == b
    assert a.lo < x.mean() < a.hi
    assert a.value == pytest.approx(x.mean())
    assert bootstrap_ci(x, seed=1) != a  # the seed is what fixes it


def test_nan_dropped_and_single_value_has_no_interval():
    e = bootstrap_ci([0.3, math.nan])
    assert e.value == 0.3 and e.n == 1 and math.isnan(e.lo) and math.isnan(e.hi)
    assert bootstrap_ci([]).n == 0 and math.isnan(bootstrap_ci([]).value)


def test_iqm_trims_a_quarter_each_side():
    assert iqm(np.arange(1.0, 9.0)) == pytest.approx(4.5)  # mean of 3, 4, 5, 6
    assert iqm(np.array([0.0, 1.0, 100.0])) == pytest.approx(101 / 3)  # n=3: int(0.75) = 0 trimmed
    x = [1, 2, 3, 4, 5, 6, 7, 1000]
    e, m = bootstrap_ci(x, statistic="iqm"), bootstrap_ci(x)
    assert e.value == pytest.approx(4.5) and m.value == pytest.approx(128.5)  # robust to the outlier
    assert e.hi < m.hi


def test_stratified_bootstrap_resamples_within_strata():
    # stratum values are constant: every resample keeps both strata intact -> zero width
    e = stratified_bootstrap_ci([[1.0, 1.0, 1.0], [3.0, 3.0]], statistic="mean")
    assert (e.value, e.lo, e.hi, e.n) == (pytest.approx(9 / 5), pytest.approx(9 / 5), pytest.approx(9 / 5), 5)
    with pytest.raises(ValueError, match="mean, iqm"):
        bootstrap_ci([1.0, 2.0], statistic="median")


def test_known_shift_paired_is_exact():
    base = {0: 0.1, 1: 0.5, 2: 0.9}
    cell = {s: v + 0.25 for s, v in base.items()}
    d = paired_difference(cell, base)
    assert d.paired and d.n == 3
    assert d.value == pytest.approx(0.25)
    assert d.lo == pytest.approx(0.25) and d.hi == pytest.approx(0.25)


def test_unpaired_fallback_when_seeds_differ():
    base = {0: 0.1, 1: 0.5, 2: 0.9}
    cell = {0: 0.35, 1: 0.75, 3: 1.15}  # same shift, but seed 3 is not a baseline seed
    d = paired_difference(cell, base)
    assert not d.paired
    assert d.value == pytest.approx(0.25)
    assert d.lo < 0.25 < d.hi  # the seed-level spread no longer cancels
    p = paired_difference({0: 0.35, 1: 0.75, 2: 1.15}, base)
    assert (p.hi - p.lo) < (d.hi - d.lo)


def test_difference_with_missing_side_is_nan():
    d = paired_difference({0: math.nan}, {0: 0.5})
    assert d.n == 0 and math.isnan(d.value)


def test_iqm_difference_paired():
    base = {s: float(s) for s in range(8)}
    d = paired_difference({s: v + 2 for s, v in base.items()}, base, statistic="iqm")
    assert d.paired and d.value == pytest.approx(2) and d.lo == pytest.approx(2) and d.hi == pytest.approx(2)
