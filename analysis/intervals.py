"""Intervals with small-sample coverage, and the verdict of a contrast.

One interval method is used for every number a table or a figure band shows
(docs/algorithms.md#statistics):

- Seeds x tasks (a held-out metric with per-task rows, or a paired difference D of two arms on common
  tasks): the two-way random-effects model Y[s, t] = mu + a_s + b_t + e_st with seeds and tasks both
  random. Its mean squares (MS_seed, MS_task, MS_res, `mean_squares`) give
      SE^2 = (MS_seed + max(MS_task - MS_res, 0)) / (n m)
  = the variance of the seed means (which holds the seed and residual terms) plus the task term.
  The interval is mean +- t(df) SE. While the seed-means term is the larger of the two, df = n - 1:
  the exact t interval on the n seed means when the task term is 0 (3 seeds: t = 4.30), a little
  wider otherwise. When the task term is larger, df is Satterthwaite's for the sum of mean squares
  (it grows towards m - 1). Satterthwaite's df alone under-covers when a few seeds carry most of the
  variance (92% with 3 seeds, sigma_seed 0.08 and heterogeneous tasks in our simulation); this rule
  stays within 94-97% over the regimes of the shipped sweeps (tests/analysis/test_analysis_intervals.py).
- Two arms on the same tasks but not the same seeds (a seed failed): each arm's seed means enter
  SE^2 on their own (Welch's df while they dominate), the task-by-arm term from the per-task
  difference of the arm means (`unpaired_interval`).
- Two arms on different tasks (another environment, map size or split): the sum of the two grids'
  SE^2 (`separate_interval`).
- Seeds only (a per-update training metric, KL, final greedy success without task rows): the t
  interval on the seed values, df = n - 1.
- Fewer than 2 seeds: no interval (NaN), and the cell says so.

The minimum detectable effect uses the same SE and df: MDE_80 = (t_.975 + t_.80)(df) SE; for a
sweep, the SE of one more paired contrast from the mean squares of its paired differences averaged
(`pooled_design`). The account in our own words: docs/algorithms.md#statistics.

Verdicts (`verdicts`): a sweep's contrasts against its baseline are tested together. "better" or
"worse" when the two-sided p-value of the contrast survives Holm's step-down correction across the
sweep's contrasts (family-wise error 0.05); "equivalent" when the 90% interval lies inside
(-margin, +margin) (two one-sided tests, Schuirmann 1987; the margin is the sweep's
`equivalence_margin`); "undetermined" otherwise. For a metric without a better direction (turns)
"higher" / "lower" stand for better / worse. A contrast whose interval has zero width (no spread
across seeds and tasks, e.g. both arms at 0 or 1 everywhere) is "degenerate": no test is possible.
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
DIRECTIONS = ("better", "worse", "higher", "lower")  # the verdicts that establish a difference
VERDICTS = (*DIRECTIONS, "equivalent", "undetermined", "degenerate")


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
    def half_width(self) -> float:
        lo, hi = self.bounds()
        return (hi - lo) / 2

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


def _interval(value: float, seed: list[tuple[float, float]], task: list[tuple[float, float]], n: int, m: int):
    """The interval from the parts of SE^2, each (contribution to SE^2, its degrees of freedom):
    `seed` the seed-means terms, `task` the task term (with its residual correction, negative).
    While the seed terms carry at least half of SE^2 the df are those of the seed terms alone
    (n - 1 for one arm, Welch's for two); else Satterthwaite's over every part
    (docs/algorithms.md#statistics)."""
    seed_sum, task_sum = sum(v for v, _ in seed), sum(v for v, _ in task)
    if task_sum <= 0:
        task, task_sum = [], 0.0
    total = seed_sum + task_sum
    parts = seed if seed_sum >= task_sum else seed + task
    denom = sum(v * v / d for v, d in parts)
    df = sum(v for v, _ in parts) ** 2 / denom if denom > 0 else float(min(d for _, d in seed))
    return Interval(value, math.sqrt(max(total, 0.0)), max(df, 1.0), n, m)


def _grid_parts(ms: tuple[float, float, float], n: int, m: int):
    """(seed parts, task parts) of SE^2 for the mean of an n x m grid with mean squares `ms`."""
    ms_seed, ms_task, ms_res = ms
    seed = [(ms_seed / (n * m), n - 1)]
    task = [(ms_task / (n * m), m - 1), (-ms_res / (n * m), (n - 1) * (m - 1))] if m > 1 else []
    return seed, task


def grid_interval(y: np.ndarray) -> Interval:
    """The interval of the mean of a seeds x tasks grid (rows: seeds, columns: common tasks)."""
    y = np.asarray(y, dtype=float)
    if y.ndim == 1:
        y = y[:, None]
    n, m = y.shape
    value = float(y.mean()) if y.size else math.nan
    if n < 2:
        return Interval(value, math.nan, math.nan, n, m)
    return _interval(value, *_grid_parts(mean_squares(y), n, m), n, m)


def interval_arrays(mean, ms_seed, ms_task, ms_res, n: int, m: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(value, se, df) of many n x m grids at once from their means and mean squares (arrays of one
    shape): the rule of `grid_interval`, vectorised for the simulations of analysis.sequential.
    n >= 2 seeds."""
    mean, ms_seed, ms_task, ms_res = (np.asarray(x, dtype=float) for x in (mean, ms_seed, ms_task, ms_res))
    seed = ms_seed / (n * m)
    if m > 1:
        t_plus, t_minus = ms_task / (n * m), ms_res / (n * m)
    else:
        t_plus = t_minus = np.zeros_like(seed)
    task = t_plus - t_minus
    has_task = task > 0  # a task term at or below 0 is dropped, as in `_interval`
    se2 = seed + np.where(has_task, task, 0.0)
    # Satterthwaite over every part only when the task term is the larger; else the seed term's n - 1
    all_parts = has_task & (seed < task)
    denom = seed**2 / (n - 1) + t_plus**2 / max(m - 1, 1) + t_minus**2 / max((n - 1) * (m - 1), 1)
    with np.errstate(divide="ignore", invalid="ignore"):
        satterthwaite = np.where(denom > 0, se2**2 / denom, n - 1.0)
    df = np.maximum(np.where(all_parts, satterthwaite, n - 1.0), 1.0)
    return mean, np.sqrt(np.maximum(se2, 0.0)), df


# ----------------------------------------------------------------------------- planning
NEEDED_MAX = 1000  # the seed projections below search up to this many seeds


def _first_decided(value: float, se_at, alpha_diff: float, alpha_eq: float, margin: float, start: int) -> int | None:
    """The fewest seeds k in (start, NEEDED_MAX] at which an interval of `value` with (se, df) =
    se_at(k) excludes 0 at two-sided level alpha_diff or, as a TOST at alpha_eq on each side, lies
    inside ±margin; None when neither happens."""
    for k in range(start + 1, NEEDED_MAX + 1):
        se, df = se_at(k)
        if se == 0:
            return None
        if abs(value) - stats.t.ppf(1 - alpha_diff / 2, df) * se > 0:
            return k
        if abs(value) + stats.t.ppf(1 - alpha_eq, df) * se < margin:
            return k
    return None


def seeds_for_verdict(grid: np.ndarray, alpha_diff: float, alpha_eq: float, margin: float) -> int | None:
    """The seeds at which a contrast, at the Δ and variance observed on its seeds x tasks `grid`
    (paired differences, or a paired gain), would reach a verdict: its interval excluding 0 at
    two-sided level `alpha_diff` or fitting inside ±margin at TOST level `alpha_eq`. The seed-means
    term of SE^2 scales as 1/k, the task term (tasks fixed) stays; the df follow `_interval`. None
    when neither happens below NEEDED_MAX seeds. A projection for planning, not a promise: the
    observed Δ and variance are themselves estimates (docs/algorithms.md#statistics)."""
    grid = np.asarray(grid, dtype=float)
    n, m = grid.shape
    ms = mean_squares(grid)
    value = float(grid.mean())
    _, task = _grid_parts(ms, n, m)  # the task term at the observed n: more seeds leave it as it is

    def at(k: int) -> tuple[float, float]:
        iv = _interval(value, _grid_parts(ms, k, m)[0], task, k, m)
        return iv.se, iv.df

    return _first_decided(value, at, alpha_diff, alpha_eq, margin, n)


def seeds_for_interval(iv: Interval, alpha_diff: float, alpha_eq: float, margin: float) -> int | None:
    """`seeds_for_verdict` for a contrast known only by its interval (no paired grid: an unpaired
    Δ, or a row read back from a page): all of SE^2 is taken as the seed-means term (SE^2 n / k) and
    the df grow as k - 1 do (df (k - 1) / (n - 1)). With a task term that stays, SE shrinks more
    slowly than this assumes, so the figure is a lower bound. None below NEEDED_MAX seeds, or
    without an interval to project."""
    if iv.n < 2 or not (math.isfinite(iv.se) and math.isfinite(iv.value)) or iv.se == 0:
        return None
    return _first_decided(
        iv.value,
        lambda k: (iv.se * math.sqrt(iv.n / k), max(iv.df * (k - 1) / (iv.n - 1), 1.0)),
        alpha_diff,
        alpha_eq,
        margin,
        iv.n,
    )


@dataclass(frozen=True)
class Design:
    """Mean squares (MS_seed, MS_task, MS_res) of n x m paired differences, averaged over a sweep's
    contrasts: what its MDE and variance components come from."""

    ms: tuple[float, float, float]
    n: int
    m: int

    def interval(self) -> Interval:
        """The interval of one more contrast of this design (value 0): its mde80 is the sweep's MDE."""
        return _interval(0.0, *_grid_parts(self.ms, self.n, self.m), self.n, self.m)

    def sigmas(self) -> tuple[float, float, float]:
        """(sigma_seed, sigma_task, sigma_residual), each floored at 0."""
        ms_seed, ms_task, ms_res = self.ms
        if self.m < 2:
            return math.sqrt(ms_seed), 0.0, 0.0
        return (
            math.sqrt(max(ms_seed - ms_res, 0.0) / self.m),
            math.sqrt(max(ms_task - ms_res, 0.0) / self.n),
            math.sqrt(ms_res),
        )


def pooled_design(grids: list[np.ndarray]) -> Design | None:
    """The mean squares of `grids` (n x m each) averaged; grids of another shape than the most
    common one are left out. None without a grid of 2 seeds or more."""
    shapes = [g.shape for g in grids if g.ndim == 2 and g.shape[0] >= 2]
    if not shapes:
        return None
    n, m = max(set(shapes), key=shapes.count)
    ms = np.mean([mean_squares(g) for g in grids if g.shape == (n, m)], axis=0)
    return Design((float(ms[0]), float(ms[1]), float(ms[2])), n, m)


def unpaired_interval(a: np.ndarray, b: np.ndarray) -> Interval:
    """mean(a) - mean(b) for two grids on the same tasks (same columns) but other seeds: each arm's
    seed means enter on their own, the tasks stay paired (the per-task difference of the arm means
    carries the task-by-arm term, less the residual it already holds)."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    (na, m), nb = a.shape, b.shape[0]  # (seeds, tasks) each, the same tasks
    value = float(a.mean() - b.mean())
    if min(na, nb) < 2:
        return Interval(value, math.nan, math.nan, min(na, nb), m)
    seed = [(float(x.mean(axis=1).var(ddof=1)) / len(x), len(x) - 1) for x in (a, b)]
    task = []
    if m > 1:
        d = a.mean(axis=0) - b.mean(axis=0)
        task = [(float(d.var(ddof=1)) / m, m - 1)]
        task += [(-mean_squares(x)[2] / (len(x) * m), (len(x) - 1) * (m - 1)) for x in (a, b)]
    return _interval(value, seed, task, min(na, nb), m)


def separate_interval(a: np.ndarray, b: np.ndarray) -> Interval:
    """mean(a) - mean(b) for two grids on different tasks (another environment or split: nothing
    pairs): SE^2 is the sum of the two grids' SE^2, the df by the same rule over all their parts."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    value = float(a.mean() - b.mean())
    n = min(a.shape[0], b.shape[0])
    if n < 2:
        return Interval(value, math.nan, math.nan, n, min(a.shape[1], b.shape[1]))
    (sa, ta), (sb, tb) = (_grid_parts(mean_squares(x), *x.shape) for x in (a, b))
    ta = ta if sum(v for v, _ in ta) > 0 else []  # each grid's task term floored at 0 on its own
    tb = tb if sum(v for v, _ in tb) > 0 else []
    return _interval(value, sa + sb, ta + tb, n, min(a.shape[1], b.shape[1]))


def independent_difference(a: Interval, b: Interval) -> Interval:
    """a - b for two estimates from independent experiments (other models, other runs): their SE^2
    add, the df by the same Satterthwaite rule over the two sides' own df (Welch's for two)."""
    parts = [(a.se**2, a.df), (b.se**2, b.df)]
    return _interval(a.value - b.value, parts, [], min(a.n, b.n), min(a.m, b.m))


def seed_interval(values) -> Interval:
    """The t interval of the mean of per-seed values (NaNs dropped), df = n - 1."""
    x = np.asarray(values, dtype=float).ravel()
    x = x[~np.isnan(x)]
    return grid_interval(x[:, None]) if x.size else Interval(math.nan, math.nan, math.nan, 0, 1)


def sig2(x: float) -> str:
    """x to two significant digits, trailing zeros kept (0.1 -> '0.10', 0.0504 -> '0.050')."""
    if not math.isfinite(x) or x == 0:
        return f"{x:g}" if not math.isfinite(x) else "0"
    r = float(f"{x:.2g}")
    return f"{r:.{max(0, 1 - math.floor(math.log10(abs(r))))}f}"


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


def verdict(
    interval: Interval, rejected: bool, margin: float = DEFAULT_MARGIN, higher_is_better: bool | None = True
) -> str:
    """The stated rule for one contrast (module docstring), given whether Holm rejected it.
    higher_is_better None (a metric with no better direction, e.g. turns): "higher" / "lower"."""
    if interval.n < 2 or not math.isfinite(interval.value):
        return "undetermined"
    if interval.degenerate:
        return "degenerate"
    if rejected:
        up = interval.value > 0
        if higher_is_better is None:
            return "higher" if up else "lower"
        return "better" if up == higher_is_better else "worse"
    lo, hi = interval.bounds(EQUIVALENCE_CONFIDENCE)
    if -margin < lo and hi < margin:
        return "equivalent"
    return "undetermined"


def verdicts(
    intervals: list[Interval], margin: float = DEFAULT_MARGIN, higher_is_better: bool | None | list = True
) -> list[tuple[str, float]]:
    """(verdict, Holm-adjusted p) of every contrast of one sweep, corrected together. `higher_is_better`:
    one direction for all, or one per contrast (None where a difference has no better side)."""
    p = [i.p_value() if not i.degenerate else math.nan for i in intervals]
    rejected = holm(p)
    adjusted = holm_adjusted(p)
    sides = higher_is_better if isinstance(higher_is_better, list) else [higher_is_better] * len(intervals)
    return [(verdict(i, r, margin, h), a) for i, r, a, h in zip(intervals, rejected, adjusted, sides)]
