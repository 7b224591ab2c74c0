"""How well one number per run predicts an outcome: rank correlation, added R², AUROC, with intervals
from a bootstrap clustered by sweep and a leave-one-sweep-out check (docs/algorithms.md#statistics).

Points of one sweep share a baseline, an environment and often the same start checkpoint, so they
are not independent draws: the bootstrap resamples whole sweeps (with replacement), then points
inside each drawn sweep (a two-stage cluster bootstrap). With k sweeps the first stage has at most
C(2k-1, k) distinct draws (10 for k = 3), so with few sweeps the interval mostly says how much the
answer moves with the choice of sweeps, and a single sweep gives the within-sweep bootstrap only.
Leave-one-sweep-out fixes the direction (and, for a stop rule, a threshold) on the other sweeps and
scores the held-out sweep with it: a signal that works only inside one sweep fails there.

All functions take plain numpy arrays; NaN in a predictor drops that point.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

Stat = Callable[[np.ndarray], float]  # takes an array of point indices, returns a statistic or NaN


def ranks(x: np.ndarray) -> np.ndarray:
    """Ranks 1..n with ties given their average rank."""
    order = np.argsort(x, kind="mergesort")
    r = np.empty(len(x), dtype=float)
    r[order] = np.arange(1, len(x) + 1)
    vals = x[order]
    i = 0
    while i < len(x):  # average the ranks of each run of ties
        j = i
        while j + 1 < len(x) and vals[j + 1] == vals[i]:
            j += 1
        if j > i:
            r[order[i : j + 1]] = (i + j + 2) / 2.0
        i = j + 1
    return r


def spearman(x: np.ndarray, y: np.ndarray) -> float:
    """Spearman's rank correlation; NaN with fewer than 3 points or a constant side."""
    ok = np.isfinite(x) & np.isfinite(y)
    x, y = x[ok], y[ok]
    if len(x) < 3:
        return math.nan
    rx, ry = ranks(x), ranks(y)
    if rx.std() == 0 or ry.std() == 0:
        return math.nan
    return float(np.corrcoef(rx, ry)[0, 1])


def spearman_within(x: np.ndarray, y: np.ndarray, clusters: np.ndarray) -> float:
    """Spearman's ρ inside each cluster, pooled: the correlation of ranks centred and scaled within
    their cluster (ranks / n - mean), so differences between clusters (environment, start checkpoint)
    do not count. NaN with fewer than 3 points in every cluster or nothing varying inside one."""
    ok = np.isfinite(x) & np.isfinite(y)
    cx, cy = [], []
    for c in np.unique(clusters[ok]):
        m = ok & (clusters == c)
        if m.sum() < 3:
            continue
        rx, ry = ranks(x[m]) / m.sum(), ranks(y[m]) / m.sum()
        cx.append(rx - rx.mean())
        cy.append(ry - ry.mean())
    if not cx:
        return math.nan
    a, b = np.concatenate(cx), np.concatenate(cy)
    den = math.sqrt((a * a).sum() * (b * b).sum())
    return float((a * b).sum() / den) if den > 0 else math.nan


def auroc(score: np.ndarray, positive: np.ndarray) -> float:
    """P(score of a positive > score of a negative), ties counted one half (Mann-Whitney U / n+ n-);
    NaN without at least one positive and one negative."""
    ok = np.isfinite(score)
    score, positive = score[ok], positive[ok].astype(bool)
    n_pos, n_neg = int(positive.sum()), int((~positive).sum())
    if n_pos == 0 or n_neg == 0:
        return math.nan
    r = ranks(score)
    return float((r[positive].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def _r2(design: np.ndarray, y: np.ndarray) -> float:
    coef, *_ = np.linalg.lstsq(design, y, rcond=None)
    resid = y - design @ coef
    tss = ((y - y.mean()) ** 2).sum()
    return float(1.0 - (resid**2).sum() / tss) if tss > 0 else math.nan


def added_r2(x: np.ndarray, y: np.ndarray, start: np.ndarray) -> float:
    """R² of y ~ 1 + start + x minus R² of y ~ 1 + start (least squares, in-sample): what the
    predictor adds beside the evaluation before RL. NaN with fewer than 4 points or a constant x."""
    ok = np.isfinite(x) & np.isfinite(y) & np.isfinite(start)
    x, y, start = x[ok], y[ok], start[ok]
    if len(x) < 4 or x.std() == 0:
        return math.nan
    one = np.ones_like(y)
    base = np.column_stack([one, start]) if start.std() > 0 else one[:, None]
    return _r2(np.column_stack([base, (x - x.mean()) / x.std()]), y) - _r2(base, y)


@dataclass(frozen=True)
class Estimate:
    """A statistic on all points, its 95% percentile interval, and how many bootstrap draws had it."""

    value: float
    low: float
    high: float
    draws: int  # draws where the statistic was defined (degenerate draws, e.g. no positive, are dropped)

    def text(self, digits: int = 2) -> str:
        if not math.isfinite(self.value):
            return "—"
        if not (math.isfinite(self.low) and math.isfinite(self.high)):
            return f"{self.value:.{digits}f}"
        return f"{self.value:.{digits}f} [{self.low:.{digits}f}, {self.high:.{digits}f}]"


def cluster_bootstrap(stat: Stat, clusters: np.ndarray, reps: int = 2000, seed: int = 0) -> Estimate:
    """`stat` on every point and its 95% percentile interval over a two-stage bootstrap: draw as many
    clusters as there are, with replacement, then points inside each drawn cluster, with replacement.
    An interval needs at least 100 defined draws, else it is NaN (the value alone is reported)."""
    rng = np.random.default_rng(seed)
    names = np.unique(clusters)
    members = [np.flatnonzero(clusters == c) for c in names]
    value = stat(np.arange(len(clusters)))
    draws = []
    for _ in range(reps):
        picked = rng.integers(len(names), size=len(names))
        idx = np.concatenate([rng.choice(members[c], size=len(members[c])) for c in picked])
        s = stat(idx)
        if math.isfinite(s):
            draws.append(s)
    if len(draws) < 100:
        return Estimate(value, math.nan, math.nan, len(draws))
    low, high = np.percentile(draws, [2.5, 97.5])
    return Estimate(value, float(low), float(high), len(draws))


@dataclass(frozen=True)
class HeldOut:
    """Leave-one-sweep-out: the mean over folds of the held-out sweep's statistic, oriented by the
    direction the other sweeps chose (above the centre = the direction holds), and how many folds scored."""

    value: float
    folds: int
    agree: int  # folds where the held-out statistic points the way the others chose

    def text(self) -> str:
        if not self.folds:
            return "—"
        return f"{self.value:.2f} ({self.agree}/{self.folds})"


def leave_one_out(
    fit: Callable[[np.ndarray], float], score: Callable[[np.ndarray], float], clusters: np.ndarray, centre: float
) -> HeldOut:
    """For each cluster: the direction d = sign(fit(other points) - centre), then the held-out score
    oriented by it, centre + d * (score(held-out points) - centre). `centre` is 0 for a correlation,
    0.5 for an AUROC. Folds where either side is undefined are skipped."""
    scored = []
    for c in np.unique(clusters):
        train, test = np.flatnonzero(clusters != c), np.flatnonzero(clusters == c)
        direction = fit(train) - centre if len(train) else math.nan
        held = score(test) - centre
        if math.isfinite(direction) and direction != 0 and math.isfinite(held):
            scored.append(centre + math.copysign(1.0, direction) * held)
    if not scored:
        return HeldOut(math.nan, 0, 0)
    return HeldOut(float(np.mean(scored)), len(scored), sum(s > centre for s in scored))
