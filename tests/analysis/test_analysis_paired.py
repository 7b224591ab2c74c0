"""analysis.stats over seeds x tasks: the two-level bootstrap, variance components and the MDE."""

import numpy as np
import pytest
from scipy.stats import t

from analysis.stats import (
    Components,
    bootstrap_ci,
    crossed_bootstrap,
    mde80,
    paired_difference,
    pooled_components,
    variance_components,
)


def test_one_task_column_is_the_seed_bootstrap():
    base = {0: 0.1, 1: 0.5, 2: 0.9}
    cell = {0: 0.35, 1: 0.8, 2: 1.0}
    a, b = np.array([[cell[s]] for s in (0, 1, 2)]), np.array([[base[s]] for s in (0, 1, 2)])
    d = crossed_bootstrap(a, b)
    p = paired_difference(cell, base)
    assert (d.value, d.lo, d.hi) == pytest.approx((p.value, p.lo, p.hi))
    e, ci = crossed_bootstrap(a), bootstrap_ci(list(cell.values()))
    assert (e.value, e.lo, e.hi) == pytest.approx((ci.value, ci.lo, ci.hi))
    u = crossed_bootstrap(a, np.array([[0.1], [0.5]]), paired=False)
    pu = paired_difference(cell, {0: 0.1, 5: 0.5})
    assert not u.paired and (u.value, u.lo, u.hi) == pytest.approx((pu.value, pu.lo, pu.hi))


def test_tasks_are_resampled_too():
    # every seed scores the same per task: no seed variance, but the tasks differ, so the mean is
    # uncertain; a bootstrap over seeds alone would report a zero-width interval
    y = np.tile(np.array([0.0, 1.0] * 8), (3, 1))
    e = crossed_bootstrap(y)
    assert e.value == 0.5 and e.lo < 0.4 and e.hi > 0.6
    assert crossed_bootstrap(y) == e  # seeded: deterministic


def test_paired_difference_cancels_what_both_arms_share():
    rng = np.random.default_rng(0)
    shared = rng.normal(size=(3, 64)) + rng.normal(size=(3, 1))  # task and seed effects common to both
    d = crossed_bootstrap(shared + 0.2, shared)
    assert d.value == pytest.approx(0.2) and d.lo == pytest.approx(0.2) and d.hi == pytest.approx(0.2)
    u = crossed_bootstrap(shared + 0.2, shared, paired=False)
    assert u.hi - u.lo > 0.1


def test_iqm_over_the_grid():
    y = np.array([[0.0, 1.0, 2.0, 3.0], [4.0, 5.0, 6.0, 100.0]])
    e = crossed_bootstrap(y, statistic="iqm", n_boot=500)
    assert e.value == pytest.approx(3.5)  # trim 2 of 8 values each side: mean of 2, 3, 4, 5
    assert e.lo <= e.value <= e.hi


def test_variance_components_of_an_additive_design_are_exact():
    a, b = np.array([0.0, 0.3, -0.1]), np.linspace(-1, 1, 9)
    c = variance_components(a[:, None] + b[None, :])
    assert c.seed == pytest.approx(a.var(ddof=1)) and c.task == pytest.approx(b.var(ddof=1))
    assert c.residual == pytest.approx(0.0, abs=1e-12)
    e = np.array([[1.0, -1.0], [-1.0, 1.0]])  # pure interaction: MS_res = 4 / 1, seed and task floored at 0
    assert variance_components(e) == Components(0.0, 0.0, pytest.approx(4.0))
    assert variance_components(np.ones((1, 5))) is None  # one seed: no seed variance


def test_mde_uses_t_quantiles_when_the_seed_term_dominates():
    n, m = 3, 256
    dominated = mde80(Components(seed=0.01, task=0.01, residual=0.01), n, m)
    assert dominated.df == 2
    assert dominated.multiplier == pytest.approx(t.ppf(0.975, 2) + t.ppf(0.8, 2))  # 4.30 + 1.06
    se = np.sqrt(0.01 / n + 0.01 / m + 0.01 / (n * m))
    assert dominated.se == pytest.approx(se) and dominated.mde == pytest.approx(dominated.multiplier * se)
    tasks = mde80(Components(seed=0.0, task=0.04, residual=0.2), n, m)
    assert tasks.df is None and tasks.multiplier == pytest.approx(2.8, abs=0.01)  # 1.96 + 0.84
    assert pooled_components([Components(1, 2, 3), Components(3, 4, 5)]) == Components(2, 3, 4)


def test_bootstrap_width_agrees_with_the_analytic_se():
    rng = np.random.default_rng(7)
    n, m, s_seed, s_task, s_res = 30, 40, 0.1, 0.2, 0.05
    d = rng.normal(0, s_seed, (n, 1)) + rng.normal(0, s_task, (1, m)) + rng.normal(0, s_res, (n, m))
    se = np.sqrt(s_seed**2 / n + s_task**2 / m + s_res**2 / (n * m))
    e = crossed_bootstrap(d, n_boot=4000)
    assert (e.hi - e.lo) / (2 * 1.96) == pytest.approx(se, rel=0.35)
    c = variance_components(d)
    assert np.sqrt(c.residual) == pytest.approx(s_res, rel=0.1)
    assert mde80(c, n, m).se == pytest.approx(se, rel=0.35)
