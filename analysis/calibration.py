"""A/A calibration: the harness's own false-verdict rate, measured on runs where nothing differs.

An A/A sweep (sweeps/aa_calibration.yaml) runs one config under several arms that change nothing:
relabelled copies on other seeds (a point's `seed_offset`) and mathematically no-op variants on the
same seeds (a correction that cannot trigger, another micro-batch split). Every contrast between
two of its arms is null, so every "better" or "worse" verdict is false. Online experimentation
platforms run such A/A tests before trusting A/B results (Kohavi, Tang & Xu 2020, "Trustworthy
Online Controlled Experiments", ch. 19): the share of significant A/A results is the real
false-positive rate of the whole pipeline, which may differ from the nominal one.

With 20 seeds and 4 arms there are only a handful of A/A contrasts, and a count over 3 of them says
nothing. Under the null the arms are exchangeable, so we draw many pseudo-sweeps from the runs
(`fixed_draws`): k seed indices out of the n every arm finished (the same indices for every arm,
as a sweep runs one seed list), one arm drawn as the baseline, the others its contrasts; each
pseudo-sweep goes through the table's own code: the Δ interval (analysis.columns' rule: paired by
seed and task when the two arms ran the same train.seed, else unpaired by seed, tasks still paired,
`analysis.intervals.unpaired_interval`) and the verdicts (`analysis.intervals.verdicts`: Holm over
the pseudo-sweep's contrasts, TOST for equivalence). `sequential_draws` does the same for the seed
budget's looks (`analysis.sequential.replay`, start 3, step 2, max 15), and for the misuse that
rule prevents: re-reading the fixed-n table at every look and stopping at the first better/worse.

The interval of a rate. Pseudo-sweeps reuse the same runs, so a binomial interval over them would
claim a precision the 20 seeds do not have. A rate over draws of k-subsets is a (Monte Carlo)
U-statistic of the n seed clusters (a cluster: the runs of every arm at one seed index), so we take
the delete-one-seed jackknife over clusters, using for each deletion the draws that do not contain
that seed; for U-statistics its variance errs on the large side (Efron & Stein 1981, Ann. Statist.
9(3)). The finite number of draws adds noise to each leave-one-out mean, which the jackknife would
count as variance due to the runs: `rate_var` takes its expected size out and adds the draws' own
Monte Carlo variance instead. The 95% interval is Wilson's score interval with the effective number
of draws this variance implies (Kish's n_eff = r (1 - r) / var), so that it stays inside [0, 1] and
is not symmetric near 0. The variance of a rate over random k-subsets of n seeds is
at most (k / n) r (1 - r) (Hoeffding 1948): n_eff is never taken below n / k, the worst case, and a
rate no draw shows (variance 0, nothing to estimate from) gets that worst case. So with 20 seeds an
interval around a rate of 0 at k = 3 still reaches about a third: the runs cannot rule out more. What
the interval covers: which seeds were run; not other configs, environments or machines.

The spread that float rounding alone induces (`chaos`): runs of the same seed differ only in the
rounding of a mathematically identical update; their per-seed |Δ| of the final metric, at every
evaluated update, against the spread of independent seeds (σ_seed of the baseline).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats

from analysis.intervals import (
    DEFAULT_MARGIN,
    DIRECTIONS,
    Interval,
    grid_interval,
    unpaired_interval,
    verdicts,
)
from analysis.load import AnalysisError, load_results, read_metrics_rows
from analysis.records import as_folder
from analysis.sequential import Plan, replay
from analysis.tasks import load_tasks, matrix, task_metric, task_scores
from harness.store import FINISHED, METRICS

SWEEP = "aa_calibration"  # the shipped A/A sweep (results_doc adds its calibration to the page)
SEED_COUNTS = (3, 5, 10)  # seeds per arm of the pseudo-sweeps: what users run
SEQUENTIAL = Plan(start=3, step=2, max=15)  # the seed budget of docs/user-guide.md#sequential-seeds
P_LEVELS = (0.05, 0.1, 0.2, 0.5)  # a calibrated test rejects a null contrast at each level at that rate
KINDS = ("paired", "unpaired")  # contrasts of two arms on the same train.seed (paired by seed), or not
Z95 = float(stats.norm.ppf(0.975))


@dataclass
class Runs:
    """The final per-task scores of an A/A sweep's arms, on the seed indices every arm finished."""

    arms: list[str]  # the sweep's cells (variant slugs), baseline first
    baseline: str
    offsets: dict[str, int]  # arm -> its seed_offset: arms with equal offsets ran the same train.seed
    index: list[int]  # seed indices (train.seed - offset) finished by every arm
    final: dict[str, np.ndarray]  # arm -> (len(index), tasks) final scores on the common tasks
    curves: dict[str, dict[int, pd.Series]]  # arm -> seed index -> task-mean score by update (finished runs)
    metric: str
    margin: float = DEFAULT_MARGIN
    rollouts: dict[str, dict[int, dict[int, tuple]]] = field(default_factory=dict)  # arm -> index -> update -> ROLLOUT


# what a training update's rollouts give in metrics.jsonl: equal exactly while two runs sample the same episodes
ROLLOUT = ("env/success", "env/return", "env/turns", "env/action_tokens", "perf/rollout_tokens")


def _rollouts(path: Path) -> dict[int, tuple]:
    """update -> the ROLLOUT values of that update's training rollouts (updates >= 1)."""
    rows = read_metrics_rows(path / METRICS)
    return {int(r["update"]): tuple(r.get(k) for k in ROLLOUT) for r in rows if r.get("update", 0) >= 1}


def load_runs(path: str | Path, metric: str | None = None) -> Runs:
    """The runs of an A/A results folder (or records pack) for a held-out per-task metric (default:
    the sweep's own, e.g. final/eval_sampled/success)."""
    folder = as_folder(path)
    results = load_results(folder)
    meta = results.attrs["sweep"]
    metric = metric or meta.raw.get("metric") or "final/eval_greedy/success"
    spec = task_metric(metric)
    if spec is None or spec[0] != "final":
        raise AnalysisError(f"{metric!r}: an A/A calibration needs a final held-out metric with per-task results.")
    done = results[results["status"].isin(FINISHED)]
    scores = task_scores(load_tasks(folder, list(done["point"])), spec[1], spec[2])
    offsets = {str(v["variant"]): int(v.get("seed_offset") or 0) for v in meta.raw.get("variants") or []}
    arms = list(dict.fromkeys(results["cell"]))
    baseline = str(results.loc[results["is_baseline"], "cell"].iloc[0]) if results["is_baseline"].any() else arms[0]
    ids: dict[str, dict[int, str]] = {a: {} for a in arms}
    curves: dict[str, dict[int, pd.Series]] = {a: {} for a in arms}
    rollouts: dict[str, dict[int, dict[int, tuple]]] = {a: {} for a in arms}
    for _, r in done.iterrows():
        frame = scores.frames.get(r["point"])
        if frame is None or pd.isna(r["seed"]):
            continue
        i = int(r["seed"]) - offsets.get(r["cell"], 0)
        ids[r["cell"]][i] = r["point"]
        curves[r["cell"]][i] = frame.dropna(how="all").mean(axis=1)
        rollouts[r["cell"]][i] = _rollouts(folder / r["point"])
    index = sorted(set.intersection(*(set(v) for v in ids.values()))) if arms else []
    if len(arms) < 2 or len(index) < 2:
        raise AnalysisError(
            f"{folder}: an A/A calibration needs at least 2 arms with at least 2 common seeds finished "
            f"(arms {', '.join(arms)}; common seeds {len(index)})."
        )
    points = [ids[a][i] for a in arms for i in index]
    kept, grid = matrix(scores, points, "final")
    if len(kept) != len(points):
        raise AnalysisError(f"{folder}: some finished points have no final per-task scores for {metric}.")
    n = len(index)
    final = {a: grid[j * n : (j + 1) * n] for j, a in enumerate(arms)}
    margin = meta.raw.get("equivalence_margin") or DEFAULT_MARGIN
    offsets = {a: offsets.get(a, 0) for a in arms}
    return Runs(arms, baseline, offsets, index, final, curves, metric, float(margin), rollouts)


# ----------------------------------------------------------------------------- one pseudo-sweep
def contrast(runs: Runs, arm: str, base: str, rows: np.ndarray) -> Interval:
    """arm minus base on the seed indices `rows` (positions in runs.index), as the table computes it:
    paired by seed and task when both ran the same train.seed, else unpaired by seed."""
    a, b = runs.final[arm][rows], runs.final[base][rows]
    return grid_interval(a - b) if runs.offsets[arm] == runs.offsets[base] else unpaired_interval(a, b)


def _false(words: list[str]) -> np.ndarray:
    return np.array([w in DIRECTIONS for w in words], dtype=float)


@dataclass
class Draws:
    """Pseudo-sweeps drawn from one A/A sweep: which seed indices each used and what it found.
    outcomes: name -> (R,) values in [0, 1] (a draw's share of contrasts, or 0/1 for a family)."""

    label: str
    members: np.ndarray  # (R, n) bool: the seed indices a draw's data came from
    outcomes: dict[str, np.ndarray] = field(default_factory=dict)
    seeds_used: float = math.nan  # sequential: mean seeds per contrast at its decision


def fixed_draws(runs: Runs, k: int, draws: int, rng: np.random.Generator) -> Draws:
    """`draws` pseudo-sweeps of k seeds per arm (fixed n, the table's rule)."""
    n = len(runs.index)
    if not 2 <= k <= n:
        raise AnalysisError(f"pseudo-sweeps of {k} seeds need 2 <= k <= {n}, the seeds every arm finished.")
    members = np.zeros((draws, n), dtype=bool)
    names = ("family", "contrast", "single", "equivalent", "undetermined")
    out = {name: np.zeros(draws) for name in names}
    out.update({f"{name}_{kind}": np.full(draws, np.nan) for name in ("single", "equivalent") for kind in KINDS})
    out.update({f"p<{a:g}": np.full(draws, np.nan) for a in P_LEVELS})
    for r in range(draws):
        rows = rng.choice(n, size=k, replace=False)
        members[r, rows] = True
        base = runs.arms[rng.integers(len(runs.arms))]
        arms = [a for a in runs.arms if a != base]
        ivs = [contrast(runs, a, base, rows) for a in arms]
        words = [w for w, _ in verdicts(ivs, runs.margin)]
        alone = [verdicts([iv], runs.margin)[0][0] for iv in ivs]  # each contrast as a table's only one
        out["family"][r] = float(_false(words).any())
        out["contrast"][r] = _false(words).mean()
        out["single"][r] = _false(alone).mean()
        out["equivalent"][r] = np.mean([w == "equivalent" for w in words])
        out["undetermined"][r] = np.mean([w in ("undetermined", "degenerate") for w in words])
        p = np.array([iv.p_value() for iv in ivs if not iv.degenerate])  # unadjusted, as a test alone
        p = p[np.isfinite(p)]
        for a in P_LEVELS:
            out[f"p<{a:g}"][r] = np.mean(p < a) if p.size else np.nan
        for kind in KINDS:  # the same, apart for contrasts on the baseline's seeds and on other seeds
            mine = [i for i, a in enumerate(arms) if (runs.offsets[a] == runs.offsets[base]) == (kind == "paired")]
            if mine:
                out[f"single_{kind}"][r] = _false([alone[i] for i in mine]).mean()
                out[f"equivalent_{kind}"][r] = np.mean([words[i] == "equivalent" for i in mine])
    return Draws(f"{k} seeds", members, out)


def sequential_draws(runs: Runs, draws: int, rng: np.random.Generator, plan: Plan = SEQUENTIAL) -> Draws:
    """`draws` pseudo-sweeps under a seed budget: a random order of plan.max seed indices, the looks
    of analysis.sequential on its first n_k; also the naive rule on the same order (the fixed-n
    table's verdicts re-read at every look, a contrast stopping at its first better / worse)."""
    n = len(runs.index)
    if plan.max > n:
        raise AnalysisError(f"the seed budget's max ({plan.max}) exceeds the {n} seeds every arm finished.")
    members = np.zeros((draws, n), dtype=bool)
    names = ("family", "contrast", "equivalent", "undetermined", "naive", "naive_family")
    out = {name: np.zeros(draws) for name in names}
    used = []
    for r in range(draws):
        order = rng.choice(n, size=plan.max, replace=False)
        members[r, order] = True
        base = runs.arms[rng.integers(len(runs.arms))]
        arms = [a for a in runs.arms if a != base]
        outcome = replay(plan, arms, lambda a, k, base=base, order=order: contrast(runs, a, base, order[:k]))
        words = [outcome.decisions[a].verdict for a in arms]
        used += [outcome.decisions[a].seeds for a in arms]
        out["family"][r] = float(_false(words).any())
        out["contrast"][r] = _false(words).mean()
        out["equivalent"][r] = np.mean([w == "equivalent" for w in words])
        out["undetermined"][r] = np.mean([w in ("undetermined", "degenerate") for w in words])
        peeked = np.zeros(len(arms))
        for k in plan.looks:
            ivs = [contrast(runs, a, base, order[:k]) for a in arms]
            peeked = np.maximum(peeked, _false([w for w, _ in verdicts(ivs, runs.margin)]))
        out["naive"][r] = peeked.mean()
        out["naive_family"][r] = float(peeked.any())
    looks = ", ".join(map(str, plan.looks))
    return Draws(f"sequential (looks at {looks})", members, out, float(np.mean(used)))


# ----------------------------------------------------------------------------- rates and their intervals
@dataclass(frozen=True)
class Rate:
    value: float
    lo: float
    hi: float
    events: float  # draws (or contrast shares) that count, summed
    draws: int
    n_eff: float  # the effective number of independent draws behind the interval

    def text(self, digits: int = 1) -> str:
        return f"{100 * self.value:.{digits}f}% [{100 * self.lo:.{digits}f}, {100 * self.hi:.{digits}f}]"


def wilson(p: float, n: float, z: float = Z95) -> tuple[float, float]:
    """Wilson's score interval for a proportion p observed on n (possibly fractional) trials."""
    if not n > 0 or not math.isfinite(n):
        return 0.0, 1.0
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return max(0.0, centre - half), min(1.0, centre + half)


def jackknife_var(values: np.ndarray, members: np.ndarray) -> float:
    """Delete-one-seed jackknife variance of mean(values) over draws, a draw left out with every
    seed index it used (module docstring); raw, with the Monte Carlo noise of the draws in it."""
    n = members.shape[1]
    loo = np.array([values[~members[:, i]].mean() for i in range(n) if (~members[:, i]).any()])
    if loo.size < 2:
        return math.nan
    return float((loo.size - 1) / loo.size * ((loo - loo.mean()) ** 2).sum())


def rate_var(values: np.ndarray, members: np.ndarray) -> float:
    """The variance of a rate over draws: the jackknife's (the seeds that were run) less the part the
    finite number of draws puts into it, plus the draws' own Monte Carlo variance s^2 / R.

    The Monte Carlo part: given the runs, the leave-one-out means theta_(-i) average R_i draws each
    (the draws without seed i; k seeds a draw out of n) and two of them share a fraction
    rho = (n - 1 - k) / (n - 1) of their draws, so sum_i (theta_(-i) - mean)^2 holds
    (n - 1)(1 - rho) s^2 / R_i = k s^2 / R_i of draw noise on average; the jackknife scales the sum by
    (n - 1) / n. What is left estimates the variance due to the runs (floored at 0)."""
    jack = jackknife_var(values, members)
    if not math.isfinite(jack):
        return math.nan
    draws, n = members.shape
    s2 = float(np.var(values, ddof=1)) if draws > 1 else 0.0
    k = float(members.sum(axis=1).mean())
    kept = float(np.mean([(~members[:, i]).sum() for i in range(n)]))
    noise = (n - 1) / n * k * s2 / kept if kept > 0 else 0.0
    return max(jack - noise, 0.0) + s2 / draws


def least_neff(members: np.ndarray) -> float:
    """n / k: the fewest effective draws a rate over random k-subsets of n seeds can have. Hoeffding
    (1948, Ann. Math. Statist. 19(3)) bounds the variance of a U-statistic of degree k by
    (k / n) Var(h), and a rate's kernel h in [0, 1] has Var(h) <= p (1 - p)."""
    k = float(members.sum(axis=1).mean()) if members.size else 0.0
    return members.shape[1] / k if k > 0 else math.nan


def rate(values: np.ndarray, members: np.ndarray) -> Rate:
    """The mean of `values` over draws with its 95% interval (module docstring); NaN values (a draw
    without the kind of contrast the outcome counts) are left out."""
    keep = ~np.isnan(values)
    values, members = values[keep], members[keep]
    if not values.size:
        return Rate(math.nan, math.nan, math.nan, 0.0, 0, math.nan)
    p = float(np.mean(values))
    var = rate_var(values, members)
    least = least_neff(members)
    n_eff = max(p * (1 - p) / var, least) if 0 < p < 1 and var > 0 else least
    lo, hi = wilson(p, n_eff)
    return Rate(p, lo, hi, float(np.sum(values)), len(values), n_eff)


def rates(d: Draws) -> dict[str, Rate]:
    """Every outcome's rate with its interval."""
    return {name: rate(v, d.members) for name, v in d.outcomes.items()}


# ----------------------------------------------------------------------------- float-path chaos
@dataclass
class Chaos:
    """How far runs of one config drift apart. sigma_seed: SD over seeds of the baseline's final metric
    (task mean), with its 95% chi-square interval; gaps: per arm, |arm - baseline| of the task-mean
    score at every evaluated update (update -> one value per seed index both finished), for arms on
    the baseline's own seeds (rounding alone) and on other seeds (independent runs)."""

    sigma_seed: float
    sigma_ci: tuple[float, float]
    seeds: int
    gaps: dict[str, dict[int, np.ndarray]]
    same_seed: dict[str, bool]
    corr: dict[str, float]  # Pearson r of the final metric between arm and baseline over seed indices
    diverged: dict[str, list[int | None]] = field(default_factory=dict)  # same-seed arms: first differing update


def first_difference(a: dict[int, tuple], b: dict[int, tuple]) -> int | None:
    """The first update whose training rollouts differ between two runs of one seed (ROLLOUT), None
    when every update both logged agrees."""
    return next((u for u in sorted(set(a) & set(b)) if a[u] != b[u]), None)


def chaos(runs: Runs) -> Chaos:
    base = runs.curves[runs.baseline]
    finals = np.array([c.iloc[-1] for c in base.values()])
    n = len(finals)
    sd = float(finals.std(ddof=1)) if n > 1 else math.nan
    ci = (
        (
            math.sqrt((n - 1) * sd**2 / stats.chi2.ppf(0.975, n - 1)),
            math.sqrt((n - 1) * sd**2 / stats.chi2.ppf(0.025, n - 1)),
        )
        if n > 1
        else (math.nan, math.nan)
    )
    gaps, same, corr, diverged = {}, {}, {}, {}
    for arm in runs.arms:
        if arm == runs.baseline:
            continue
        common = sorted(set(runs.curves[arm]) & set(base))
        by_update: dict[int, list[float]] = {}
        for i in common:
            d = (runs.curves[arm][i] - base[i]).dropna()
            for u, v in d.items():
                by_update.setdefault(int(u), []).append(abs(float(v)))
        gaps[arm] = {u: np.array(v) for u, v in sorted(by_update.items())}
        same[arm] = runs.offsets[arm] == runs.offsets[runs.baseline]
        if same[arm] and runs.rollouts:
            mine, theirs = runs.rollouts.get(arm, {}), runs.rollouts.get(runs.baseline, {})
            logged = [i for i in common if mine.get(i) and theirs.get(i)]  # both logged their rollouts
            diverged[arm] = [first_difference(mine[i], theirs[i]) for i in logged]
        a = np.array([runs.curves[arm][i].iloc[-1] for i in common])
        b = np.array([base[i].iloc[-1] for i in common])
        corr[arm] = float(np.corrcoef(a, b)[0, 1]) if len(common) > 2 and a.std() > 0 and b.std() > 0 else math.nan
    return Chaos(sd, ci, n, gaps, same, corr, diverged)


# ----------------------------------------------------------------------------- the whole calibration
@dataclass
class Calibration:
    runs: Runs
    fixed: list[tuple[Draws, dict[str, Rate]]]
    sequential: tuple[Draws, dict[str, Rate]] | None
    chaos: Chaos
    draws: int
    seed: int


def calibrate(
    path: str | Path,
    seed_counts: tuple[int, ...] = SEED_COUNTS,
    draws: int = 2000,
    seed: int = 0,
    metric: str | None = None,
    plan: Plan | None = SEQUENTIAL,
) -> Calibration:
    """The A/A calibration of a results folder: pseudo-sweeps at each seed count (those the finished
    seeds allow), the sequential rule's when plan.max seeds are there, and the chaos spread.
    Deterministic for a given `seed` (numpy's PCG64)."""
    runs = load_runs(path, metric)
    rng = np.random.default_rng(seed)
    n = len(runs.index)
    fixed = []
    for k in seed_counts:
        if k <= n:
            d = fixed_draws(runs, k, draws, rng)
            fixed.append((d, rates(d)))
    seq = None
    if plan is not None and plan.max <= n:
        d = sequential_draws(runs, max(draws // 4, 1), rng, plan)
        seq = (d, rates(d))
    return Calibration(runs, fixed, seq, chaos(runs), draws, seed)
