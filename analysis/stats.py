"""Statistics across seeds: bootstrap confidence intervals, IQM, differences to the baseline.

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
- Fewer than 2 values: the point estimate only; the interval is NaN (a bootstrap of one value
  would show a misleading zero width).
"""

from __future__ import annotations

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
