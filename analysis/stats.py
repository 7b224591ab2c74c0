"""Statistics across seeds and tasks: bootstrap confidence intervals, IQM, differences to the
baseline, and the minimum detectable effect of a paired design.

Definitions (all deterministic: a fixed-seed numpy Generator, percentile intervals):
- `mean`: the sample mean over seeds; CI = percentile bootstrap over seeds (default 10,000 resamples).
- `iqm`: interquartile mean, `scipy.stats.trim_mean(x, 0.25)` over all runs (Agarwal et al. 2021,
  "Deep RL at the Edge of the Statistical Precipice", rliable); CI = stratified bootstrap: runs
  are resampled with replacement within each stratum (task), as rliable does. A table cell is one
  task, so there it reduces to the ordinary bootstrap over seeds. With 3 seeds IQM = mean
  (trim_mean cuts int(0.25 * n) runs from each end).
- Difference to the baseline: statistic(cell) - statistic(baseline). When both have the same
  seeds, the interval is a *paired* bootstrap (the same resampled seeds on both sides, so seed-level
  noise shared by both cancels); otherwise an *unpaired* one (each side resampled independently),
  and `Difference.paired` is False so the table can say so.
- Seeds x tasks (`crossed_bootstrap`): with per-task results on common tasks, seeds and tasks are
  resampled independently (Owen 2007, the pigeonhole bootstrap) and the statistic is taken over the
  crossed grid; differences pair by seed and task (common random numbers).
- Power (`variance_components`, `mde80`): a two-way ANOVA of the paired differences D (seeds x
  tasks) gives sigma_seed^2, sigma_task^2 and sigma_residual^2; SE of the mean difference =
  sqrt(s_s^2/n + s_t^2/m + s_e^2/(n m)); MDE_80 = (1.96 + 0.84) SE, with t quantiles (df = n - 1)
  when the seed term dominates SE^2.
- Fewer than 2 values: the point estimate only; the interval is NaN (a bootstrap of one value
  would show a misleading zero width).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from scipy.stats import trim_mean

N_BOOT = 10_000
CONFIDENCE = 0.95
STATISTICS = ("mean", "iqm")


@dataclass(frozen=True)
class Estimate:
    value: float
    lo: float
    hi: float
    n: int

    @property
    def half_width(self) -> float:
        return (self.hi - self.lo) / 2


@dataclass(frozen=True)
class Difference:
    value: float
    lo: float
    hi: float
    n: int  # pairs when paired, else min(n_cell, n_baseline)
    paired: bool

    @property
    def half_width(self) -> float:
        return (self.hi - self.lo) / 2


def iqm(x: np.ndarray, axis: int | None = None) -> np.ndarray | float:
    """Interquartile mean (25% trimmed on each side), rliable's aggregate."""
    return trim_mean(x, proportiontocut=0.25, axis=axis)


def _stat_rows(samples: np.ndarray, statistic: str) -> np.ndarray:
    """(n_boot, n) resampled values -> (n_boot,) statistic per resample."""
    if statistic == "mean":
        return samples.mean(axis=1)
    if statistic == "iqm":
        return iqm(samples, axis=1)
    raise ValueError(f"statistic {statistic!r}: expected one of {', '.join(STATISTICS)}")


def _point(x: np.ndarray, statistic: str) -> float:
    return float(_stat_rows(x[None, :], statistic)[0])


def _clean(values: Sequence[float] | np.ndarray) -> np.ndarray:
    x = np.asarray(values, dtype=float).ravel()
    return x[~np.isnan(x)]


def _percentiles(boot: np.ndarray, confidence: float) -> tuple[float, float]:
    alpha = (1 - confidence) / 2 * 100
    lo, hi = np.percentile(boot, [alpha, 100 - alpha])
    return float(lo), float(hi)


def stratified_bootstrap_ci(
    strata: Sequence[Sequence[float]],
    statistic: str = "iqm",
    n_boot: int = N_BOOT,
    confidence: float = CONFIDENCE,
    seed: int = 0,
) -> Estimate:
    """Estimate over all runs of all strata (tasks); runs resampled within each stratum (rliable).
    NaNs are dropped per stratum; strata may have different numbers of runs."""
    xs = [s for s in (_clean(v) for v in strata) if s.size]
    n = sum(s.size for s in xs)
    if n == 0:
        return Estimate(math.nan, math.nan, math.nan, 0)
    value = _point(np.concatenate(xs), statistic)
    if n < 2:
        return Estimate(value, math.nan, math.nan, n)
    rng = np.random.default_rng(seed)
    parts = [s[rng.integers(0, s.size, size=(n_boot, s.size))] for s in xs]  # each (n_boot, n_s)
    boot = _stat_rows(np.concatenate(parts, axis=1), statistic)  # (n_boot,)
    return Estimate(value, *_percentiles(boot, confidence), n)


def bootstrap_ci(
    values: Sequence[float] | np.ndarray,
    statistic: str = "mean",
    n_boot: int = N_BOOT,
    confidence: float = CONFIDENCE,
    seed: int = 0,
) -> Estimate:
    """Statistic over seeds with a percentile bootstrap interval (NaNs dropped)."""
    return stratified_bootstrap_ci([values], statistic, n_boot, confidence, seed)


def paired_difference(
    cell: Mapping[int, float],
    baseline: Mapping[int, float],
    statistic: str = "mean",
    n_boot: int = N_BOOT,
    confidence: float = CONFIDENCE,
    seed: int = 0,
) -> Difference:
    """statistic(cell) - statistic(baseline), both given as {seed: value} (NaN values dropped).
    Paired bootstrap when the seed sets are identical, unpaired otherwise."""
    a = {s: float(v) for s, v in cell.items() if not math.isnan(float(v))}
    b = {s: float(v) for s, v in baseline.items() if not math.isnan(float(v))}
    if not a or not b:
        return Difference(math.nan, math.nan, math.nan, 0, False)
    paired = set(a) == set(b)
    if paired:
        seeds = sorted(a)
        xa, xb = np.array([a[s] for s in seeds]), np.array([b[s] for s in seeds])
    else:
        xa, xb = np.array([a[s] for s in sorted(a)]), np.array([b[s] for s in sorted(b)])
    value = _point(xa, statistic) - _point(xb, statistic)
    n = xa.size if paired else min(xa.size, xb.size)
    if n < 2:
        return Difference(value, math.nan, math.nan, n, paired)
    rng = np.random.default_rng(seed)
    ia = rng.integers(0, xa.size, size=(n_boot, xa.size))  # (n_boot, n_a)
    ib = ia if paired else rng.integers(0, xb.size, size=(n_boot, xb.size))
    boot = _stat_rows(xa[ia], statistic) - _stat_rows(xb[ib], statistic)
    return Difference(value, *_percentiles(boot, confidence), n, paired)


# ----------------------------------------------------------------------------- seeds x tasks
def _counts(idx: np.ndarray, size: int) -> np.ndarray:
    """(n_boot, k) resampled indices -> (n_boot, size) how often each index was drawn."""
    rows = idx.shape[0]
    flat = (idx + (np.arange(rows) * size)[:, None]).ravel()
    return np.bincount(flat, minlength=rows * size).reshape(rows, size).astype(float)


@dataclass(frozen=True)
class _Draws:
    """Resampled seed and task indices of one bootstrap, with how often each index was drawn."""

    seeds: np.ndarray  # (n_boot, n) indices
    tasks: np.ndarray  # (n_boot, m) indices
    seed_counts: np.ndarray  # (n_boot, n_rows)
    task_counts: np.ndarray  # (n_boot, m)


@functools.lru_cache(maxsize=8)
def _draws(seed: int, n_boot: int, na: int, nb: int | None, m: int) -> tuple[_Draws, _Draws | None]:
    """The draws of `crossed_bootstrap` (cached: every cell of a table with the same design
    draws the same indices, so they are computed once). nb None: paired or one arm."""
    rng = np.random.default_rng(seed)
    ia = rng.integers(0, na, size=(n_boot, na))
    ib = None if nb is None else rng.integers(0, nb, size=(n_boot, nb))
    it = rng.integers(0, m, size=(n_boot, m))
    wt = _counts(it, m).astype(np.float32)  # small whole numbers: exact in float32
    a = _Draws(ia, it, _counts(ia, na), wt)
    return a, None if ib is None else _Draws(ib, it, _counts(ib, nb), wt)


def _grid_stat(y: np.ndarray, d: _Draws, statistic: str) -> np.ndarray:
    """Statistic over the resampled crossed grid y[seeds_b][:, tasks_b] for every resample b."""
    if statistic == "mean":  # the mean over the grid is a count-weighted sum: no grid is built
        return ((d.seed_counts @ y) * d.task_counts).sum(axis=1) / (d.seeds.shape[1] * d.tasks.shape[1])
    out = np.empty(d.seeds.shape[0])
    for lo in range(0, d.seeds.shape[0], 1000):  # chunks bound the memory of the materialized grids
        s, t = d.seeds[lo : lo + 1000], d.tasks[lo : lo + 1000]
        grid = y[s[:, :, None], t[:, None, :]].reshape(len(s), -1)
        out[lo : lo + 1000] = _stat_rows(grid, statistic)
    return out


def crossed_bootstrap(
    a: np.ndarray,
    b: np.ndarray | None = None,
    paired: bool = True,
    statistic: str = "mean",
    n_boot: int = N_BOOT,
    confidence: float = CONFIDENCE,
    seed: int = 0,
) -> Difference:
    """Two-level bootstrap over a seeds x tasks grid (Owen's pigeonhole bootstrap): seeds and
    tasks are resampled independently with replacement and the statistic is taken over the
    crossed grid of the resample; percentile interval.

    `a` is (seeds, tasks). With `b` (the same tasks, in the same column order) the estimate is
    statistic(a) - statistic(b): `paired` (the same seeds in the same row order) resamples one set
    of seed indices for both, otherwise each side's seeds are resampled on their own; the task
    indices are shared either way (the tasks are common). With one task column this is the
    ordinary bootstrap over seeds (the same draws as `paired_difference`). Fewer than 2 seeds:
    the point estimate only."""
    a = np.asarray(a, dtype=float)
    value = _point(a.ravel(), statistic) - (_point(np.asarray(b, float).ravel(), statistic) if b is not None else 0.0)
    n = a.shape[0] if b is None or paired else min(a.shape[0], b.shape[0])
    if n < 2:
        return Difference(value, math.nan, math.nan, n, paired)
    nb = None if b is None or paired else b.shape[0]
    da, db = _draws(seed, n_boot, a.shape[0], nb, a.shape[1])
    boot = _grid_stat(a, da, statistic)
    if b is not None:
        boot = boot - _grid_stat(np.asarray(b, dtype=float), db or da, statistic)
    return Difference(value, *_percentiles(boot, confidence), n, paired)


def separate_bootstrap(
    a: np.ndarray,
    b: np.ndarray,
    statistic: str = "mean",
    n_boot: int = N_BOOT,
    confidence: float = CONFIDENCE,
    seed: int = 0,
) -> Difference:
    """statistic(a) - statistic(b) for two grids on *different* tasks (another environment, map size
    or level generator: the held-out splits differ, so nothing pairs): each side's seeds and tasks
    are resampled on their own (a two-level bootstrap per side), and the difference of the two
    resampled statistics gives the percentile interval. Wider than the paired interval, as it must
    be: the task-to-task variation no longer cancels. Fewer than 2 seeds on a side: the point
    estimate only."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    value = _point(a.ravel(), statistic) - _point(b.ravel(), statistic)
    n = min(a.shape[0], b.shape[0])
    if n < 2:
        return Difference(value, math.nan, math.nan, n, False)
    da, _ = _draws(seed, n_boot, a.shape[0], None, a.shape[1])
    db, _ = _draws(seed + 1, n_boot, b.shape[0], None, b.shape[1])
    boot = _grid_stat(a, da, statistic) - _grid_stat(b, db, statistic)
    return Difference(value, *_percentiles(boot, confidence), n, False)


# ----------------------------------------------------------------------------- power
T_DOMINANT = 0.5  # the seed term's share of SE^2 above which t quantiles (df = seeds - 1) are used


@dataclass(frozen=True)
class Components:
    """Variance components of paired differences D (seeds x tasks), two-way ANOVA without replication."""

    seed: float  # sigma_s^2 = (MS_seed - MS_res) / m, floored at 0
    task: float  # sigma_t^2 = (MS_task - MS_res) / n, floored at 0
    residual: float  # sigma_e^2 = MS_res


@dataclass(frozen=True)
class Power:
    """Minimum detectable effect at 80% power, two-sided alpha = 0.05, for n seeds x m tasks."""

    mde: float
    se: float
    multiplier: float  # 1.96 + 0.84 with normal quantiles, t_{.975} + t_{.80} with df = n - 1
    df: int | None  # None: normal quantiles
    components: Components
    n: int
    m: int


def variance_components(d: np.ndarray) -> Components | None:
    """sigma^2 of seed, task and residual from D (n seeds x m tasks); None with fewer than 2 seeds.
    With one task column there is no task or residual term: sigma_s^2 is the variance over seeds."""
    d = np.asarray(d, dtype=float)
    n, m = d.shape
    if n < 2:
        return None
    mu, rows, cols = d.mean(), d.mean(axis=1), d.mean(axis=0)
    ms_seed = m * ((rows - mu) ** 2).sum() / (n - 1)
    if m < 2:
        return Components(float(ms_seed), 0.0, 0.0)
    ms_task = n * ((cols - mu) ** 2).sum() / (m - 1)
    ms_res = ((d - rows[:, None] - cols[None, :] + mu) ** 2).sum() / ((n - 1) * (m - 1))
    return Components(max(0.0, float(ms_seed - ms_res) / m), max(0.0, float(ms_task - ms_res) / n), float(ms_res))


def pooled_components(parts: Sequence[Components]) -> Components:
    """The mean of each variance component over several comparisons of the same design."""
    k = len(parts)
    return Components(*(sum(getattr(p, f) for p in parts) / k for f in ("seed", "task", "residual")))


def mde80(c: Components, n: int, m: int) -> Power:
    """MDE_80 = (z_.975 + z_.80) SE, SE = sqrt(sigma_s^2/n + sigma_t^2/m + sigma_e^2/(n m)); t
    quantiles with df = n - 1 when the seed term is more than half of SE^2 (few seeds dominate)."""
    from scipy.stats import norm, t

    seed_term = c.seed / n
    se2 = seed_term + c.task / m + c.residual / (n * m)
    se = math.sqrt(se2)
    df = n - 1 if se2 > 0 and seed_term / se2 > T_DOMINANT else None
    q = (lambda p: float(t.ppf(p, df))) if df else (lambda p: float(norm.ppf(p)))
    mult = q(0.975) + q(0.80)
    return Power(mult * se, se, mult, df, c, n, m)
