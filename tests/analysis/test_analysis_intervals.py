"""analysis.intervals: the interval every table and band uses, checked by simulation to cover 93-97% at
95% across the variance regimes the shipped sweeps show, its MDE, Holm and the verdict rule."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from analysis.intervals import (
    DEFAULT_MARGIN,
    grid_interval,
    holm,
    holm_adjusted,
    seed_interval,
    verdict,
    verdicts,
)

# (sigma_seed, sigma of the effect across tasks, seeds, tasks): the regimes of the shipped sweeps'
# paired differences. Held-out success is 0/1 per (seed, task), so the residual is Bernoulli noise;
# sigma_seed 0.056 and 0.08 are where the two-level bootstrap under-covered with 3 seeds (90%, 83%),
# 0 is the residual-dominated case where it over-covered (97.8%).
REGIMES = [
    (0.0, 0.0, 3, 256),
    (0.02, 0.0, 3, 256),
    (0.056, 0.0, 3, 256),
    (0.08, 0.0, 3, 256),
    (0.056, 0.2, 3, 256),
    (0.08, 0.2, 3, 128),
    (0.0, 0.2, 5, 256),
    (0.056, 0.0, 5, 256),
    (0.08, 0.2, 5, 128),
]


def _paired_grid(rng, sigma_seed: float, sigma_effect: float, n: int, m: int, delta: float = 0.05):
    """One simulated contrast: Bernoulli successes of two arms on m tasks of varied difficulty, the
    second arm better by an effect that varies by task, plus a seed effect on the second arm."""
    p = 1 / (1 + np.exp(-rng.normal(0.5, 1.5, m)))
    effect = np.clip(rng.normal(delta, sigma_effect, m), -p, 1 - p)
    seed = rng.normal(0, sigma_seed, n)
    a = rng.random((n, m)) < p
    b = rng.random((n, m)) < np.clip(p + effect + seed[:, None], 0, 1)
    return b.astype(float) - a.astype(float)


def _population_effect(rng, sigma_effect: float, delta: float = 0.05, k: int = 400_000) -> float:
    p = 1 / (1 + np.exp(-rng.normal(0.5, 1.5, k)))
    return float(np.clip(rng.normal(delta, sigma_effect, k), -p, 1 - p).mean())


@pytest.mark.parametrize("regime", REGIMES)
def test_the_interval_covers_95_percent_across_regimes(regime):
    sigma_seed, sigma_effect, n, m = regime
    rng = np.random.default_rng(hash(regime) % 2**32)
    truth = _population_effect(rng, sigma_effect)
    reps = 1500
    covered = 0
    for _ in range(reps):
        lo, hi = grid_interval(_paired_grid(rng, sigma_seed, sigma_effect, n, m)).bounds()
        covered += lo <= truth <= hi
    coverage = covered / reps
    # 1500 draws: the standard error of a true 95% coverage is 0.0056, so 0.93-0.97 is +-3.5 SE
    assert 0.93 <= coverage <= 0.97, (regime, coverage)


def test_with_seed_noise_dominant_it_is_the_t_interval_on_seed_means():
    rng = np.random.default_rng(0)
    d = rng.normal(0, 1, (3, 1)) + np.zeros((3, 50))  # every task equal within a seed
    iv = grid_interval(d)
    means = d.mean(axis=1)
    half = stats.t.ppf(0.975, 2) * means.std(ddof=1) / math.sqrt(3)
    assert iv.df == pytest.approx(2.0) and iv.hi - iv.value == pytest.approx(half)
    assert seed_interval(means).bounds() == pytest.approx(iv.bounds())


def test_with_task_noise_dominant_df_grows_to_the_tasks():
    rng = np.random.default_rng(1)
    d = rng.normal(0, 1, (1, 200)) + rng.normal(0, 0.01, (3, 200))  # shared task effects, tiny residual
    iv = grid_interval(d)
    assert iv.df > 150
    # the task term: SE^2 ~ sigma_t^2 / m
    assert iv.se == pytest.approx(d.mean(axis=0).std(ddof=1) / math.sqrt(200), rel=0.05)


def test_mde_uses_the_same_model():
    d = np.random.default_rng(2).normal(0.1, 0.5, (3, 64))
    iv = grid_interval(d)
    assert iv.mde80() == pytest.approx((stats.t.ppf(0.975, iv.df) + stats.t.ppf(0.8, iv.df)) * iv.se)


def test_one_seed_and_degenerate_grids():
    one = grid_interval(np.ones((1, 10)))
    assert math.isnan(one.lo) and verdict(one, False) == "undetermined"
    flat = grid_interval(np.zeros((3, 10)))  # both arms 0 everywhere: nothing can be said
    assert flat.degenerate and verdict(flat, False) == "degenerate"
    assert verdicts([flat])[0][0] == "degenerate"


def test_holm_by_hand():
    p = [0.01, 0.04, 0.03, 0.2]
    # sorted: 0.01 <= 0.05/4 yes; 0.03 <= 0.05/3 no -> stop
    assert holm(p) == [True, False, False, False]
    assert holm_adjusted(p) == pytest.approx([0.04, 0.09, 0.09, 0.2])
    assert holm([math.nan, 0.001]) == [False, True]


def test_the_verdict_rule():
    tight_positive = grid_interval(np.full((3, 1), 0.1) + np.array([[0.0], [0.01], [-0.01]]))
    assert verdict(tight_positive, True) == "better"
    assert verdict(tight_positive, True, higher_is_better=False) == "worse"
    near_zero = grid_interval(np.array([[0.001], [-0.002], [0.0015], [0.0], [-0.001]]))
    assert verdict(near_zero, False, margin=DEFAULT_MARGIN) == "equivalent"
    wide = grid_interval(np.array([[0.2], [-0.2], [0.05]]))
    assert verdict(wide, False) == "undetermined"
    # a contrast whose CI excludes 0 alone but not after the correction is not a finding
    ivs = [grid_interval(np.array([[0.03], [0.05], [0.04]]) + k * 0.0) for k in range(12)]
    rows = verdicts(ivs)
    assert all(v in ("better", "undetermined", "equivalent") for v, _ in rows)
