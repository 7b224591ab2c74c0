"""analysis.intervals for contrasts that do not pair: other seeds on the same tasks (a seed failed:
`unpaired_interval`) and other tasks (another environment or split: `separate_interval`). Checked
by simulation like the paired interval: they cover at least 93% (a little conservative, up to 98%)
over the regimes of the shipped sweeps, and reduce to the textbook intervals by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from analysis.intervals import separate_interval, unpaired_interval

# (sigma_seed, sigma of the effect across tasks, seeds of arm a, seeds of arm b, tasks)
REGIMES = [
    (0.0, 0.0, 3, 2, 256),
    (0.056, 0.0, 3, 2, 256),
    (0.08, 0.2, 3, 2, 128),
    (0.056, 0.0, 3, 3, 256),
    (0.0, 0.2, 3, 3, 128),
]


def _difficulties(rng, m: int) -> np.ndarray:
    return 1 / (1 + np.exp(-rng.normal(0.5, 1.5, m)))


def _arm(rng, p, effect, sigma_seed: float, n: int) -> np.ndarray:
    seed = rng.normal(0, sigma_seed, n)
    return (rng.random((n, len(p))) < np.clip(p + effect + seed[:, None], 0, 1)).astype(float)


def _truth(rng, sigma_effect: float, delta: float = 0.05, k: int = 400_000) -> float:
    p = _difficulties(rng, k)
    return float(np.clip(rng.normal(delta, sigma_effect, k), -p, 1 - p).mean())


@pytest.mark.parametrize("same_tasks", [True, False], ids=["unpaired seeds", "other tasks"])
@pytest.mark.parametrize("regime", REGIMES)
def test_coverage_by_simulation(regime, same_tasks):
    sigma_seed, sigma_effect, na, nb, m = regime
    rng = np.random.default_rng(hash((regime, same_tasks)) % 2**32)
    truth, covered, reps = _truth(rng, sigma_effect), 0, 1000
    for _ in range(reps):
        p = _difficulties(rng, m)
        effect = np.clip(rng.normal(0.05, sigma_effect, m), -p, 1 - p)
        a = _arm(rng, p, effect, sigma_seed, na)
        b = _arm(rng, p if same_tasks else _difficulties(rng, m), 0.0, sigma_seed, nb)
        lo, hi = (unpaired_interval if same_tasks else separate_interval)(a, b).bounds()
        covered += lo <= truth <= hi
    # 1000 draws: the standard error of a true 95% coverage is 0.007
    assert 0.93 <= covered / reps <= 0.985, (regime, covered / reps)


def test_one_task_column_is_welchs_interval():
    a, b = np.array([[0.2], [0.4], [0.3]]), np.array([[0.6], [0.9]])
    va, vb = a.var(ddof=1) / 3, b.var(ddof=1) / 2
    df = (va + vb) ** 2 / (va**2 / 2 + vb**2 / 1)
    iv = unpaired_interval(a, b)
    assert iv.value == pytest.approx(-0.45) and iv.se == pytest.approx(math.sqrt(va + vb))
    assert iv.df == pytest.approx(max(df, 1.0))
    assert iv.hi - iv.value == pytest.approx(stats.t.ppf(0.975, iv.df) * iv.se)


def test_arms_that_share_their_task_effects_keep_them_out_of_the_se():
    """Both arms see the same task difficulties, shifted by 0.2, different seeds: the task spread
    (large) cancels in the per-task difference; only the seeds' and the residual's spread remain."""
    rng = np.random.default_rng(0)
    tasks = rng.normal(0, 1, 200)
    a = tasks + 0.2 + rng.normal(0, 0.05, (3, 1)) + rng.normal(0, 0.01, (3, 200))
    b = tasks + rng.normal(0, 0.05, (2, 1)) + rng.normal(0, 0.01, (2, 200))
    same, other = unpaired_interval(a, b), separate_interval(a, b)
    assert same.value == pytest.approx(other.value) and same.se < other.se / 3
