"""Intervals with small-sample coverage, and the verdict of a contrast.

One interval method is used for every number a table or a figure band shows (docs/results.md,
"Statistics"):

- Seeds x tasks (a held-out metric with per-task rows, or a paired difference D of two arms on common
  tasks): the two-way random-effects model Y[s, t] = mu + a_s + b_t + e_st with seeds and tasks both
  random. Its mean squares (MS_seed, MS_task, MS_res, as `variance_components` computes them) give
      SE^2 = (MS_seed + max(MS_task - MS_res, 0)) / (n m)
  = the variance of the seed means (which holds the seed and residual terms) plus the task term.
  The interval is mean +- t(df) SE. While the seed-means term is the larger of the two, df = n - 1:
  the exact t interval on the n seed means when the task term is 0 (3 seeds: t = 4.30), a little
  wider otherwise. When the task term is larger, df is Satterthwaite's for the sum of mean squares
  (it grows towards m - 1). Satterthwaite's df alone under-covers when a few seeds carry most of the
  variance (92% with 3 seeds, sigma_seed 0.08 and heterogeneous tasks in our simulation); this rule
  stays within 94-97% over the regimes of the shipped sweeps (tests/analysis/test_analysis_intervals.py).
- Seeds only (a per-update training metric, KL, final greedy success without task rows): the t
  interval on the seed values, df = n - 1.
- Fewer than 2 seeds: no interval (NaN), and the cell says so.

The minimum detectable effect uses the same SE and df: MDE_80 = (t_.975 + t_.80)(df) SE.

Verdicts (`verdicts`): a sweep's contrasts against its baseline are tested together. "better" or
"worse" when the two-sided p-value of the contrast survives Holm's step-down correction across the
sweep's contrasts (family-wise error 0.05); "equivalent" when the 90% interval lies inside
(-margin, +margin) (two one-sided tests, Schuirmann 1987; the margin is the sweep's
`equivalence_margin`); "undetermined" otherwise. A contrast whose interval has zero width (every
seed and task equal, e.g. both arms at 0 or 1 everywhere) is "degenerate": no test is possible.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import stats

CONFIDENCE = 0.95
EQUIVALENCE_CONFIDENCE = 0.90  # TOST at alpha = 0.05 on each side
DEFAULT_MARGIN = 0.05  # success-rate points; a sweep overrides it with `equivalence_margin`
FAMILY_ALPHA = 0.05
VERDICTS = ("better", "worse", "equivalent", "undetermined", "degenerate")


@dataclass(frozen=True)
class Interval:
    value: float  # the mean
    se: float
    df: float  # degrees of freedom of the t quantile (inf: normal)
    n: int  # seeds
    m: int  # tasks (1 when only seed values)

    def bounds(self, confidence: float = CONFIDENCE) -> tuple[float, float]:
        if not math.isfinite(self.se) or self.n < 2:
            return math.nan, math.nan
        h = float(stats.t.ppf(0.5 + confidence / 2, self.df)) * self.se
        return self.value - h, self.value + h

    @property
    def lo(self) -> float:
        return self.bounds()[0]

    @property
    def hi(self) -> float:
        return self.bounds()[1]

    @property
    def degenerate(self) -> bool:
        """Zero width: the data cannot say anything about the variation (every value equal)."""
        return self.n >= 2 and self.se == 0.0

    def p_value(self) -> float:
        """Two-sided p of H0: mean = 0."""
        if self.n < 2 or not math.isfinite(self.se):
            return math.nan
        if self.se == 0.0:
            return 0.0 if self.value != 0 else 1.0
        return float(2 * stats.t.sf(abs(self.value) / self.se, self.df))

    def mde80(self) -> float:
        """Minimum detectable effect at 80% power, two-sided alpha 0.05, for this design."""
        if self.n < 2 or not math.isfinite(self.se):
            return math.nan
        return float(stats.t.ppf(0.975, self.df) + stats.t.ppf(0.80, self.df)) * self.se


def mean_squares(y: np.ndarray) -> tuple[float, float, float]:
    """(MS_seed, MS_task, MS_res) of an n x m grid (two-way ANOVA without replication)."""
    n, m = y.shape
    mu, rows, cols = y.mean(), y.mean(axis=1), y.mean(axis=0)
    ms_seed = m * float(((rows - mu) ** 2).sum()) / (n - 1)
    if m < 2:
        return ms_seed, 0.0, 0.0
    ms_task = n * float(((cols - mu) ** 2).sum()) / (m - 1)
    ms_res = float(((y - rows[:, None] - cols[None, :] + mu) ** 2).sum()) / ((n - 1) * (m - 1))
    return ms_seed, ms_task, ms_res


def grid_interval(y: np.ndarray) -> Interval:
    """The interval of the mean of a seeds x tasks grid (rows: seeds, columns: common tasks)."""
    y = np.asarray(y, dtype=float)
    if y.ndim == 1:
        y = y[:, None]
    n, m = y.shape
    value = float(y.mean()) if y.size else math.nan
    if n < 2:
        return Interval(value, math.nan, math.nan, n, m)
    ms_seed, ms_task, ms_res = mean_squares(y)
    parts = [(ms_seed, n - 1)]
    if m > 1 and ms_task > ms_res:
        parts += [(ms_task, m - 1), (-ms_res, (n - 1) * (m - 1))]
    total = sum(p for p, _ in parts)
    se = math.sqrt(max(total, 0.0) / (n * m))
    denom = sum(p * p / d for p, d in parts)
    task_part = total - ms_seed
    if ms_seed >= task_part or denom <= 0:
        df = float(n - 1)  # the seed means carry most of the variance: their t
    else:
        df = total * total / denom  # Satterthwaite
    return Interval(value, se, max(df, 1.0), n, m)


def seed_interval(values) -> Interval:
    """The t interval of the mean of per-seed values (NaNs dropped), df = n - 1."""
    x = np.asarray(values, dtype=float).ravel()
    x = x[~np.isnan(x)]
    return grid_interval(x[:, None]) if x.size else Interval(math.nan, math.nan, math.nan, 0, 1)


def holm(p_values: list[float], alpha: float = FAMILY_ALPHA) -> list[bool]:
    """Holm's step-down rejections (family-wise error alpha); NaN p-values are never rejected."""
    order = sorted((p, i) for i, p in enumerate(p_values) if not math.isnan(p))
    rejected = [False] * len(p_values)
    k = len(order)
    for rank, (p, i) in enumerate(order):
        if p > alpha / (k - rank):
            break
        rejected[i] = True
    return rejected


def holm_adjusted(p_values: list[float]) -> list[float]:
    """Holm-adjusted p-values (max over earlier steps of (k - rank) p, capped at 1)."""
    order = sorted((p, i) for i, p in enumerate(p_values) if not math.isnan(p))
    out = [math.nan] * len(p_values)
    k, running = len(order), 0.0
    for rank, (p, i) in enumerate(order):
        running = max(running, min(1.0, (k - rank) * p))
        out[i] = running
    return out


def verdict(interval: Interval, rejected: bool, margin: float = DEFAULT_MARGIN, higher_is_better: bool = True) -> str:
    """The stated rule for one contrast (module docstring), given whether Holm rejected it."""
    if interval.n < 2 or not math.isfinite(interval.value):
        return "undetermined"
    if interval.degenerate:
        return "degenerate"
    if rejected:
        up = interval.value > 0
        return "better" if up == higher_is_better else "worse"
    lo, hi = interval.bounds(EQUIVALENCE_CONFIDENCE)
    if -margin < lo and hi < margin:
        return "equivalent"
    return "undetermined"


def verdicts(
    intervals: list[Interval], margin: float = DEFAULT_MARGIN, higher_is_better: bool = True
) -> list[tuple[str, float]]:
    """(verdict, Holm-adjusted p) of every contrast of one sweep, corrected together."""
    p = [i.p_value() if not i.degenerate else math.nan for i in intervals]
    rejected = holm(p)
    adjusted = holm_adjusted(p)
    return [(verdict(i, r, margin, higher_is_better), a) for i, r, a in zip(intervals, rejected, adjusted)]
