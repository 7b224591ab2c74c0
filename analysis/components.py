"""Variance components of each paired Δ of a table, and what would narrow its interval
(`harness table --components`).

The table's Δ is already the crossed estimator. Every arm plays the same held-out tasks with the same
sampling streams (common random numbers: harness.rl.evaluate seeds episode (task j, sample k) by
(j, k) alone), so for seed s and task j the paired difference D[s, j] = arm - baseline removes
the tasks' common difficulty, and analysis.intervals fits the two-way random-effects model
D[s, j] = Δ + a_s + b_j + e_sj to it (seeds and tasks crossed, both random). Its mean squares give
the components by the method of moments (each floored at 0):

    σ_res² = MS_res,  σ_seed² = (MS_seed - MS_res) / m,  σ_task² = (MS_task - MS_res) / n
    SE² = σ_seed² / n + σ_task² / m + σ_res² / (n m)

(the interval's SE² is MS_seed / (n m) + (MS_task - MS_res) / (n m), the same sum before flooring).
This module reports, per contrast:

- the three terms' shares of SE², and the half-width the same model expects at twice the seeds or
  twice the held-out tasks (the expected mean squares at the new design, E[MS_seed] = m σ_seed² +
  σ_res², E[MS_task] = n σ_task² + σ_res², through the table's own df rule). More seeds shrink
  every term and raise the df; more tasks shrink the task and residual terms. More samples per task
  (sampled metrics only; greedy decoding is deterministic, its residual is the seed-by-task
  interaction) shrink only the episode-noise part of the residual and of the task term, so at equal
  evaluation episodes they narrow the interval at most as much as more tasks: they are the lever
  only where the task pool is fixed (a folder of games).
- for comparison, the same Δ without the crossing: with nothing paired (each arm's grid on its own,
  `separate_interval`: what independent task draws per arm and independent seeds would give), and
  with the seeds not paired (each arm's seed means on their own, Welch's df, tasks still paired:
  `unpaired_interval`).
  The latter is valid when an arm's seed effect is not negatively correlated with its baseline's
  for the same seed (runs of one seed share their start and first rollout); the correlation of the
  arms' seed means, `rho`, is shown beside it. The table keeps the paired-by-seed interval, whose
  coverage needs no such assumption.

The account in our own words: docs/algorithms.md#statistics; the ANOVA estimates follow
Searle, Casella & McCulloch, *Variance Components* (1992), ch. 4 (two-way crossed, no replication).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from analysis.columns import grids
from analysis.intervals import (
    Design,
    Interval,
    grid_interval,
    mean_squares,
    separate_interval,
    sig2,
    unpaired_interval,
)
from analysis.load import AnalysisError, load_results
from analysis.table import default_metrics
from analysis.tasks import load_tasks, task_metric, task_scores
from harness.store import FINISHED

LEVERS = ("seeds", "tasks")


@dataclass(frozen=True)
class Components:
    """The variance components of an n x m grid of paired differences (module docstring)."""

    n: int
    m: int
    var_seed: float
    var_task: float
    var_res: float

    @classmethod
    def of(cls, d: np.ndarray) -> Components:
        d = np.asarray(d, dtype=float)
        n, m = d.shape
        if n < 2 or m < 2:
            raise ValueError(f"variance components need at least 2 seeds and 2 tasks, got a {n} x {m} grid")
        ms_seed, ms_task, ms_res = mean_squares(d)
        return cls(n, m, max(ms_seed - ms_res, 0.0) / m, max(ms_task - ms_res, 0.0) / n, ms_res)

    @property
    def sigmas(self) -> tuple[float, float, float]:
        return math.sqrt(self.var_seed), math.sqrt(self.var_task), math.sqrt(self.var_res)

    def terms(self, n: int | None = None, m: int | None = None) -> tuple[float, float, float]:
        """(σ_seed²/n, σ_task²/m, σ_res²/(n m)) at n seeds and m tasks (default: the grid's)."""
        n, m = n or self.n, m or self.m
        return self.var_seed / n, self.var_task / m, self.var_res / (n * m)

    def shares(self) -> tuple[float, float, float]:
        """Each term's share of SE² (NaN when SE² is 0)."""
        t = self.terms()
        total = sum(t)
        return tuple(x / total for x in t) if total > 0 else (math.nan,) * 3

    def expected(self, n: int | None = None, m: int | None = None) -> Interval:
        """The interval (value 0) the model expects at n seeds and m tasks: the table's rule applied to
        the expected mean squares there."""
        n, m = n or self.n, m or self.m
        ms = (m * self.var_seed + self.var_res, n * self.var_task + self.var_res, self.var_res)
        return Design(ms, n, m).interval()

    def narrowing(self, n: int | None = None, m: int | None = None) -> float:
        """Expected half-width at (n, m) over the expected half-width at the grid's own design."""
        now = self.expected().half_width
        return self.expected(n, m).half_width / now if now > 0 else math.nan

    def lever(self) -> str:
        """'seeds' or 'tasks': which doubling narrows the expected interval more."""
        by_seeds, by_tasks = self.narrowing(n=2 * self.n), self.narrowing(m=2 * self.m)
        return "tasks" if by_tasks < by_seeds else "seeds"


def seed_correlation(a: np.ndarray, b: np.ndarray) -> float:
    """Pearson correlation of the two arms' seed means (row s of a and of b: the same seed)."""
    x, y = np.asarray(a, dtype=float).mean(axis=1), np.asarray(b, dtype=float).mean(axis=1)
    if len(x) < 3 or x.std() == 0 or y.std() == 0:
        return math.nan
    return float(np.corrcoef(x, y)[0, 1])


@dataclass(frozen=True)
class Contrast:
    """One paired Δ: arm grid `a` minus baseline grid `b` (rows: the same seeds, columns: the same tasks)."""

    label: str
    baseline: str
    a: np.ndarray
    b: np.ndarray

    @property
    def crossed(self) -> Interval:
        """The table's interval (paired by seed and task)."""
        return grid_interval(self.a - self.b)

    @property
    def tasks_unpaired(self) -> Interval:
        return separate_interval(self.a, self.b)

    @property
    def seeds_unpaired(self) -> Interval:
        return unpaired_interval(self.a, self.b)

    @property
    def components(self) -> Components:
        return Components.of(self.a - self.b)


def contrasts(path: str | Path, metric: str | None = None) -> tuple[str, list[Contrast]]:
    """(the metric, every Δ of the sweep's own config in `path` that pairs by seed and task on it).
    `metric`: a final/eval_<mode>/<field> metric with per-task results (a bare eval_... key means its
    final value); None: the table's first metric. An AnalysisError when it has no per-task results."""
    results = load_results(path)
    metric = metric or default_metrics(results)[0]
    metric = metric if "/" in metric and metric.split("/")[0] in ("final", "init", "best") else f"final/{metric}"
    spec = task_metric(metric)
    if spec is None or spec[0] != "final":
        raise AnalysisError(
            f"--components needs a held-out metric with per-task results, final/eval_greedy/<field> or "
            f"final/eval_sampled/<field>; the table's first metric is {metric!r} (choose one with -m)"
        )
    done = results[results["status"].isin(FINISHED) & (results["config_group"].fillna("") == "")]
    tasks = load_tasks(Path(path), list(done["point"]))
    if tasks.empty:
        raise AnalysisError(f"{path}: no finished point has per-task results (eval_tasks.jsonl) for --components")
    scores = task_scores(tasks, spec[1], spec[2])
    label = dict(zip(done["cell"], done["label"]))
    out = []
    for cell, rows in done.groupby("cell", sort=False):
        base = rows["baseline_cell"].iloc[0]
        if base is None or cell == base:
            continue
        arm = {int(s): p for s, p in zip(rows["seed"], rows["point"]) if scores.has(p)}
        ref = {int(s): p for s, p in zip(*(done.loc[done["cell"] == base, k] for k in ("seed", "point")))}
        seeds = sorted(s for s in arm if s in ref and scores.has(ref[s]))
        a, b = grids(scores, [[(arm[s], "final") for s in seeds], [(ref[s], "final") for s in seeds]])
        if a.shape[0] >= 2 and a.shape[1] >= 2:
            out.append(Contrast(label[cell], label[base], a, b))
    return metric, out


def _pct(x: float) -> str:
    return "–" if not math.isfinite(x) else f"{100 * x:.0f}%"


def _ratio(new: float, old: float) -> str:
    return "–" if not (math.isfinite(new) and old > 0) else f"{sig2(new)} (×{new / old:.2f})"


def report_lines(found: list[Contrast], metric: str) -> list[str]:
    """The markdown section `harness table --components` prints under the table."""
    sampled = task_metric(metric)[1] == "sampled"
    head = [
        f"### Variance components of the Δ ({metric}, paired by seed and task)",
        "",
        "| contrast | seeds x tasks | Δ ± now | σ_seed | σ_task | σ_res | SE² seed / task / res | "
        "± at 2x seeds | ± at 2x tasks | narrows most | ± nothing paired | ± seeds unpaired (Welch) | ρ seeds |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    rows = []
    for c in found:
        iv, comp = c.crossed, c.components
        now = iv.half_width
        expected = comp.expected().half_width
        scale = now / expected if expected > 0 else math.nan  # the observed width over the model's at (n, m)
        s_seed, s_task, s_res = comp.sigmas
        shares = " / ".join(_pct(x) for x in comp.shares())
        rows.append(
            f"| {c.label} vs {c.baseline} | {comp.n} x {comp.m} | {iv.value:+.3f} ± {sig2(now)} | {sig2(s_seed)} | "
            f"{sig2(s_task)} | {sig2(s_res)} | {shares} | {_ratio(scale * comp.expected(n=2 * comp.n).half_width, now)}"
            f" | {_ratio(scale * comp.expected(m=2 * comp.m).half_width, now)} | {comp.lever() if now > 0 else '–'} | "
            f"{_ratio(c.tasks_unpaired.half_width, now)} | {_ratio(c.seeds_unpaired.half_width, now)} | "
            f"{'–' if math.isnan(seed_correlation(c.a, c.b)) else f'{seed_correlation(c.a, c.b):+.2f}'} |"
        )
    if not rows:
        return head[:1] + ["", "No contrast pairs by seed and task with at least 2 seeds and 2 tasks."]
    samples = (
        "More samples per task shrink only the episode-noise part of the task and residual terms: at equal "
        "evaluation episodes never more than more tasks do, so they are the lever only where the task pool is fixed."
        if sampled
        else "Greedy decoding is deterministic: more samples per task change nothing; the residual is the "
        "seed-by-task interaction."
    )
    return (
        head
        + rows
        + [
            "",
            "Components by the method of moments of the two-way crossed ANOVA of D = arm - baseline (seeds and "
            "tasks random, each σ² floored at 0); SE² = σ_seed²/n + σ_task²/m + σ_res²/(nm). '± at 2x' is the "
            "half-width the same model and df rule expect at twice the seeds or tasks, scaled to the observed one; "
            "seeds cost a training run each, tasks only evaluation. " + samples + " 'Nothing paired': the interval "
            "if each arm had drawn its own tasks and seeds (no common random numbers); 'seeds unpaired': each "
            "arm's seed means on their own with Welch's df, valid only when ρ (the correlation of the arms' seed "
            "means) is not negative; the table uses neither (docs/algorithms.md#statistics).",
        ]
    )


def pooled(found: list[Contrast]) -> tuple[Components, int] | None:
    """The components averaged over the contrasts of the most common design (n seeds x m tasks), and
    how many contrasts that is; None without one."""
    shapes = [c.a.shape for c in found]
    if not shapes:
        return None
    n, m = max(set(shapes), key=shapes.count)
    comps = [c.components for c in found if c.a.shape == (n, m)]
    mean = [float(np.mean([getattr(c, k) for c in comps])) for k in ("var_seed", "var_task", "var_res")]
    return Components(n, m, *mean), len(comps)


def page_lines(path: str | Path) -> list[str]:
    """One paragraph for a sweep's section of docs/results.md: the pooled components of its paired Δs
    and which doubling, of seeds or of held-out tasks, would narrow its intervals more; [] when the
    sweep has no paired Δ with per-task results."""
    try:
        metric, found = contrasts(path)
    except AnalysisError:
        return []
    got = pooled(found)
    if got is None or got[0].expected().half_width <= 0:
        return []
    comp, k = got
    s_seed, s_task, s_res = (sig2(x) for x in comp.sigmas)
    shares = ", ".join(f"{w} {_pct(x)}" for w, x in zip(("seeds", "tasks", "residual"), comp.shares()))
    by_seeds, by_tasks = comp.narrowing(n=2 * comp.n), comp.narrowing(m=2 * comp.m)
    sampled = task_metric(metric)[1] == "sampled"
    samples = " (more samples per task: at most what more tasks give)" if sampled else ""
    return [
        f"Variance of its paired Δs ({k} contrast{'s' if k > 1 else ''} of {comp.n} seeds x {comp.m} tasks, "
        f"averaged; `harness table --components` per contrast): σ_seed {s_seed}, σ_task {s_task}, σ_res {s_res}; "
        f"of SE², {shares}. Twice the seeds would bring the intervals to ×{by_seeds:.2f} of their width, twice the "
        f"held-out tasks to ×{by_tasks:.2f}{samples}: more {comp.lever()} narrow them most.",
        "",
    ]
