"""Sequential seeds: the verdict rule of a sweep that adds seeds until its contrasts are decided.

A sweep may declare a seed budget instead of a list (`seeds: {start: 3, step: 2, max: 15,
spending: obrien_fleming}`): the contrasts (each arm's paired Δ to the baseline) are looked at
after `start` seeds, then every `step` more, and at `max` (the looks n_1 < ... < n_K). At each
look the contrasts still open are tested; a decided contrast keeps its verdict and the seeds it
used, and only the open arms (and their baseline) get the next look's seeds
(harness.experiments.sequential schedules them). Reading a fixed-n table after every batch of
seeds and stopping at the first "better" inflates the false-positive rate (about 14% of null
contrasts at 3, 5, ..., 15 seeds in the FrozenLake sweeps' variance); this rule does not.

The rule is group-sequential (Lan & DeMets 1983; Jennison & Turnbull 2000, "Group Sequential
Methods with Applications to Clinical Trials", ch. 7): an alpha-spending function alpha(tau) of
the information fraction tau_k = n_k / n_max, declared in the sweep before its seeds run,
gives look k the increment a_k = alpha(tau_k) - alpha(tau_(k-1)), so sum_k a_k = alpha = 0.05.

- better / worse: at look k, Holm's step-down at level a_k over the family of every contrast not
  yet declared better / worse (open ones with their p-value at n_k seeds; ones frozen as
  equivalent count in the family with p = 1, i.e. they are never tested again but still take
  their share). The p-value is the table's: the two-sided t test of the paired Δ over the seeds x
  tasks grid of the first n_k seeds (analysis.intervals, df = n - 1 while the seed means dominate).
- equivalent: at look k, the (1 - 2 b_k) interval of an open contrast lies inside ±margin (two
  one-sided tests at b_k each), b_k the increments of the same spending function with total 0.05,
  the error of the fixed-n table's 90% TOST.
- undetermined: still open after the look at `max`.
- degenerate: the paired Δ has no spread at a look (every seed and task of the arm scores as the
  baseline's, as when an arm changes nothing its runs can see): no test is possible, so the contrast
  is frozen there with no verdict and gets no more seeds. It claims nothing, so stopping it spends no
  error; it stays in the better / worse family (p = 1), as an equivalent contrast does. Kept open
  instead, such an arm would run to `max` for nothing (the model judge of sweeps/process_reward.yaml,
  whose runs equal the outcome-only runs bit for bit, costs 7 minutes a point).

Why it is valid whatever the correlation between looks. The looks' statistics share seeds, so
exact boundaries would need their joint law (recursive integration, and with t statistics, Holm
and a data-dependent family, no closed form). We do without it: spending alpha as Bonferroni over
the looks is conservative under any dependence (Jennison & Turnbull 2000, sec. 7.2, the union
bound the Lan-DeMets boundaries refine). Family-wise, the procedure is a shortcut of a closed test
(Marcus, Peritz & Gabriel 1976) whose intersection test for a set J of contrasts rejects when some
contrast j of J at some look k has p_jk <= a_k / |J|; by the union bound over looks and J its level
is sum_k a_k = alpha, with every p_jk the fixed-n_k p-value (n_k is fixed by the design, not by the
data; a contrast not tested at look k has p = 1). Holm at look k over the contrasts not yet
rejected rejects only what that closed test rejects (Maurer & Bretz 2013, "Multiple testing in
group sequential trials using graphical approaches", for the general form), so the family-wise
rate of a false better / worse over all looks is <= alpha. A contrast frozen as equivalent stays in
the family count: dropping it would make later families depend on earlier data in a way the
argument does not cover. For equivalence: P(declared equivalent at some look | |Δ| >= margin)
<= sum_k P(TOST at b_k passes) <= sum_k b_k = 0.05 per contrast. tests/analysis/test_sequential.py
checks both by simulation at the variance of the shipped sweeps.

The price is power: the union bound ignores the correlation between looks, so the last look is
tested at a_K (0.015 for O'Brien-Fleming spending over 3, 5, ..., 15 seeds) rather than at the
~0.04 of exact boundaries. `seeds_needed` says, for a contrast undetermined at `max`, how many
seeds a verdict would need at the observed variance.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from scipy import stats

from analysis.intervals import (
    DEFAULT_MARGIN,
    FAMILY_ALPHA,
    Interval,
    grid_interval,
    seeds_for_verdict,
)
from analysis.tasks import Scores, matrix

EQUIVALENCE_ALPHA = 0.05  # each one-sided test of the TOST, over all looks (the fixed-n table's 90% interval)
OPEN, UP, DOWN, EQUIVALENT = 0, 1, 2, 3  # what a look decides for one contrast


def obrien_fleming(tau: np.ndarray, alpha: float) -> np.ndarray:
    """Lan-DeMets O'Brien-Fleming type: 2 - 2 Phi(z_(1 - alpha/2) / sqrt(tau)); spends almost nothing early."""
    return 2.0 - 2.0 * stats.norm.cdf(stats.norm.ppf(1 - alpha / 2) / np.sqrt(tau))


def pocock(tau: np.ndarray, alpha: float) -> np.ndarray:
    """Lan-DeMets Pocock type: alpha ln(1 + (e - 1) tau); spends more early, less at the end."""
    return alpha * np.log1p((math.e - 1) * tau)


SPENDING: dict[str, Callable[[np.ndarray, float], np.ndarray]] = {"obrien_fleming": obrien_fleming, "pocock": pocock}


def look_sizes(start: int, step: int, most: int) -> tuple[int, ...]:
    """The seeds at each look: start, start + step, ..., and `most` (also when the steps skip it)."""
    sizes = list(range(start, most + 1, step))
    return tuple(sizes if sizes[-1] == most else [*sizes, most])


@dataclass(frozen=True)
class Plan:
    """A sweep's seed budget and what its looks test at."""

    start: int
    step: int
    max: int
    spending: str = "obrien_fleming"
    margin: float = DEFAULT_MARGIN
    alpha: float = FAMILY_ALPHA
    equivalence_alpha: float = EQUIVALENCE_ALPHA

    @property
    def looks(self) -> tuple[int, ...]:
        return look_sizes(self.start, self.step, self.max)

    def increments(self, total: float) -> np.ndarray:
        """Per look, what it spends of `total`: alpha(tau_k) - alpha(tau_(k-1)), summing to `total`."""
        tau = np.asarray(self.looks, dtype=float) / self.max
        spent = SPENDING[self.spending](tau, total)
        spent[-1] = total  # both functions reach `total` at tau = 1; exactly, not to rounding
        return np.diff(spent, prepend=0.0)

    def levels(self, k: int) -> tuple[float, float]:
        """(better / worse level, each one-sided equivalence test's level) at look k."""
        return float(self.increments(self.alpha)[k]), float(self.increments(self.equivalence_alpha)[k])

    def as_dict(self) -> dict:
        return {
            "start": self.start,
            "step": self.step,
            "max": self.max,
            "spending": self.spending,
            "margin": self.margin,
        }


# ----------------------------------------------------------------------------- one look, vectorised
def look_codes(value, se, df, tested, family, alpha: float, alpha_eq: float, margin: float) -> np.ndarray:
    """What one look decides, for R replicates x C contrasts at once (arrays (R, C)): OPEN, UP, DOWN
    or EQUIVALENT. `tested`: the contrasts open at this look; `family`: the contrasts not yet declared
    better / worse (tested ones and those frozen as equivalent), Holm's family at level `alpha`.
    A contrast without spread (se 0) or estimate stays open."""
    value, se, df = (np.atleast_2d(np.asarray(x, dtype=float)) for x in (value, se, df))
    tested, family = np.atleast_2d(tested) & np.atleast_2d(family), np.atleast_2d(family)
    usable = tested & np.isfinite(value) & np.isfinite(se) & (se > 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        p = np.where(usable, 2 * stats.t.sf(np.abs(value) / se, df), 1.0)
    p = np.where(family, p, np.inf)  # outside the family: neither counted nor tested
    order = np.argsort(p, axis=1, kind="stable")
    ranked = np.take_along_axis(p, order, axis=1)
    size = family.sum(axis=1, keepdims=True)
    room = size - np.arange(p.shape[1])[None, :]  # Holm: the r-th smallest p against alpha / (size - r)
    with np.errstate(divide="ignore"):
        passes = (room > 0) & (ranked <= alpha / np.maximum(room, 1)) & np.isfinite(ranked)
    rejected = np.zeros_like(passes)
    np.put_along_axis(rejected, order, np.cumprod(passes, axis=1).astype(bool), axis=1)
    rejected &= usable
    with np.errstate(invalid="ignore"):
        reach = np.abs(value) + stats.t.ppf(1 - alpha_eq, df) * se
    inside = usable & ~rejected & (reach < margin)
    return np.where(rejected, np.where(value > 0, UP, DOWN), np.where(inside, EQUIVALENT, OPEN))


# ----------------------------------------------------------------------------- the looks of one sweep
@dataclass(frozen=True)
class Decision:
    """One contrast after the looks taken so far. verdict: better | worse | higher | lower |
    equivalent | degenerate (frozen at `look`), undetermined (open after the last look), or open
    (a look still to come); seeds: the seeds its estimate used; p: its p-value at that look."""

    verdict: str
    look: int
    seeds: int
    p: float
    interval: Interval | None


@dataclass
class Outcome:
    decisions: dict[str, Decision] = field(default_factory=dict)
    looks: list[dict] = field(default_factory=list)  # per look taken: seeds, levels, verdicts (looks.json)
    next_look: int | None = 0  # the look whose seeds are still to run; None when the sweep is decided

    def open_arms(self) -> list[str]:
        return [a for a, d in self.decisions.items() if d.verdict == "open"]


def _word(code: int, higher_is_better: bool | None) -> str:
    if code == EQUIVALENT:
        return "equivalent"
    if higher_is_better is None:
        return "higher" if code == UP else "lower"
    return "better" if (code == UP) == higher_is_better else "worse"


def replay(
    plan: Plan,
    arms: list[str],
    estimate: Callable[[str, int], Interval | None],
    higher_is_better: bool | None = True,
) -> Outcome:
    """Take the looks in order from the data: `estimate(arm, n)` is the arm's paired Δ over the
    first n seeds, None while one of those points has not finished (the look is not complete).
    The same data always gives the same decisions, so a sweep resumes at the same look."""
    out = Outcome({a: Decision("open", -1, 0, math.nan, None) for a in arms})
    rejected: set[str] = set()
    for k, n in enumerate(plan.looks):
        tested = out.open_arms()
        if not tested:
            out.next_look = None
            return out
        est = {a: estimate(a, n) for a in tested}
        if any(e is None for e in est.values()):
            out.next_look = k
            return out
        family = [a for a in arms if a not in rejected]
        alpha, alpha_eq = plan.levels(k)
        row = [est.get(a) for a in family]
        codes = look_codes(
            [e.value if e else 0.0 for e in row],
            [e.se if e else math.nan for e in row],
            [e.df if e else 1.0 for e in row],
            [a in est for a in family],
            [True] * len(family),
            alpha,
            alpha_eq,
            plan.margin,
        )[0]
        last = k == len(plan.looks) - 1
        verdicts = {}
        for a, code in zip(family, codes):
            if a not in est:
                continue
            e = est[a]
            word = _word(int(code), higher_is_better) if code != OPEN else "open"
            if code == OPEN and e.degenerate:  # no spread: no test now, and the rule claims nothing for it
                word = "degenerate"
            elif code == OPEN and last:
                word = "undetermined"
            if code in (UP, DOWN):
                rejected.add(a)
            out.decisions[a] = Decision(word, k, n, e.p_value(), e)
            verdicts[a] = word
        out.looks.append(
            {"look": k + 1, "seeds": n, "alpha": alpha, "equivalence_alpha": alpha_eq, "verdicts": verdicts}
        )
    out.next_look = None
    return out


# ----------------------------------------------------------------------------- planning
def seeds_needed(grid: np.ndarray, plan: Plan, family: int) -> int | None:
    """For a contrast undetermined at `max`: the seeds at which its interval, at the observed Δ and
    variance (the seed-means term scaling as 1/n, the task term fixed), would exclude 0 at the last
    look's Holm level for its family (a_K / family) or fit inside ±margin at the last look's TOST
    level b_K; None when neither happens below NEEDED_MAX seeds (analysis.intervals.seeds_for_verdict)."""
    alpha, alpha_eq = plan.levels(len(plan.looks) - 1)
    return seeds_for_verdict(grid, alpha / max(family, 1), alpha_eq, plan.margin)


# ----------------------------------------------------------------------------- from a results folder
def paired_grid(scores: Scores, arm: list[str], base: list[str]) -> np.ndarray | None:
    """The paired Δ (arm minus baseline, seed by seed: arm[i] pairs with base[i]) on the held-out
    tasks every one of these points evaluated at its final update; None when one has no scores."""
    kept, grid = matrix(scores, arm + base, "final")
    if len(kept) != len(arm) + len(base) or grid.size == 0:
        return None
    return grid[: len(arm)] - grid[len(arm) :]


def decide(
    plan: Plan,
    arms: dict[str, dict[int, str]],
    base: dict[int, str],
    scores: Scores,
    higher_is_better: bool | None = True,
) -> tuple[Outcome, dict[str, np.ndarray]]:
    """The looks of a sweep from its points' per-task scores: `arms` maps each arm to {seed: point}
    of its finished points, `base` the baseline's. A look's estimate of an arm pairs seeds
    0 .. n - 1 (a budget's seeds); missing ones leave the look incomplete. Returns the outcome and,
    per arm, the paired Δ grid of the last look that tested it (for `seeds_needed`)."""
    last: dict[str, np.ndarray] = {}

    def estimate(arm: str, n: int) -> Interval | None:
        seeds = range(n)
        if any(s not in arms[arm] or s not in base for s in seeds):
            return None
        grid = paired_grid(scores, [arms[arm][s] for s in seeds], [base[s] for s in seeds])
        if grid is None:
            return None
        last[arm] = grid
        return grid_interval(grid)

    out = replay(plan, list(arms), estimate, higher_is_better)
    return out, {a: last[a] for a, d in out.decisions.items() if a in last and d.seeds == last[a].shape[0]}
