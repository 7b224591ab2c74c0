"""The columns of the table that show what changed: start, final, gain, Δ to the baseline, Δ at
equal episodes, cost, and the minimum detectable effect.

With per-task results (eval_tasks.jsonl) every estimate is over the seeds x tasks grid
(analysis.intervals, docs/algorithms.md#statistics), with gain (final - start, same point) and Δ
(cell - its group's baseline) the interval of the paired differences, by seed and task. Without
them the grid has one column per seed (the summary's value), and everything reduces to the t
interval over seeds.

Compute-matched comparison: when a cell's mean episode budget differs from its baseline's by
more than COST_TOLERANCE, `Δ @ equal episodes` compares both at the smaller of the two budgets,
each seed's scores interpolated linearly (task by task) between the two evaluations around it.
Matching at the smaller budget never extrapolates a curve past its last evaluation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from analysis.intervals import (
    EQUIVALENCE_CONFIDENCE,
    FAMILY_ALPHA,
    Design,
    Interval,
    grid_interval,
    pooled_design,
    seeds_for_interval,
    seeds_for_verdict,
    separate_interval,
    unpaired_interval,
    verdicts,
)
from analysis.tasks import Scores, at_budget

COST_TOLERANCE = 0.05
TOST_ALPHA = (1 - EQUIVALENCE_CONFIDENCE) / 2  # each one-sided test of the table's equivalence rule
START, FINAL, GAIN, DELTA, VERDICT, MATCHED = "start", "final", "gain", "Δ", "verdict", "Δ@"
COST = {"episodes": "cost/episodes", "tokens": "cost/generated_tokens", "wall": "cost/wall_s"}


@dataclass
class Block:
    """Estimates per cell and column, and what the notes need."""

    columns: list[str]
    est: dict[str, dict[str, Interval | None]] = field(default_factory=dict)  # cell -> column -> estimate
    paired: dict[str, bool] = field(default_factory=dict)  # cell -> Δ paired by seed
    other_tasks: set[str] = field(default_factory=set)  # cells whose held-out tasks are not the baseline's
    cost: dict[str, dict[str, float]] = field(default_factory=dict)  # cell -> episodes/tokens/wall (mean)
    budget: dict[str, float] = field(default_factory=dict)  # cell -> the budget Δ@ compares at
    base_cells: set[str] = field(default_factory=set)  # the baseline cell of each config group
    diffs: list[np.ndarray] = field(default_factory=list)  # paired Δ grids of the sweep's own group
    gain_grids: dict[str, np.ndarray] = field(default_factory=dict)  # cell -> paired gain grid
    delta_grids: dict[str, np.ndarray] = field(default_factory=dict)  # cell -> paired Δ grid at the final update
    tasks: int = 0
    verdicts: dict[str, tuple[str, float]] = field(default_factory=dict)  # cell -> (verdict, Holm-adjusted p)
    tested: str = ""  # the column the verdicts are about: Δ, else gain
    sequential: bool = False  # verdicts from a seed budget's looks (analysis.sequential_table), not Holm
    # fixed-seed tables (a seed budget's are in analysis.sequential_table.SequentialRows): cell -> the seeds its
    # undetermined contrast would need for a verdict (None: not below NEEDED_MAX)
    needed: dict[str, int | None] = field(default_factory=dict)
    needed_from_interval: set[str] = field(default_factory=set)  # the cells of `needed` projected without a grid


def _series(scores: Scores, point: str, when: str | float) -> pd.Series | None:
    return at_budget(scores, point, when) if isinstance(when, float) else scores.at(point, when)


def grids(scores: Scores, arms: list[list[tuple[str, str | float]]]) -> list[np.ndarray]:
    """One (rows, tasks) array per arm of (point, when) rows, on the tasks every row evaluated."""
    cols = [[_series(scores, p, w) for p, w in arm] for arm in arms]
    if any(s is None for arm in cols for s in arm) or not all(cols):
        return [np.empty((0, 0)) for _ in arms]
    frame = pd.concat([s for arm in cols for s in arm], axis=1, ignore_index=True).dropna()
    out, i = [], 0
    for arm in cols:
        out.append(frame.iloc[:, i : i + len(arm)].to_numpy(dtype=float).T)
        i += len(arm)
    return out


def _seeds(rows: pd.DataFrame, scores: Scores, when: str) -> dict[int, str]:
    """{seed: point} of the finished rows that have scores at `when` (a seed-less point gets a
    negative key of its own, so it never pairs)."""
    out = {}
    for i, (p, s) in enumerate(zip(rows["point"], rows["seed"])):
        if scores.at(p, when) is not None:
            out[-1 - i if pd.isna(s) else int(s)] = p
    return out


def _estimate(grid: list[np.ndarray], paired: bool) -> Interval | None:
    """One grid: its mean; two: their difference, paired by seed and task (the interval of the
    per-seed, per-task differences) or, when the seeds differ, unpaired by seed."""
    if grid[0].size == 0 or (len(grid) > 1 and grid[1].size == 0):
        return None
    if len(grid) == 1:
        return grid_interval(grid[0])
    return grid_interval(grid[0] - grid[1]) if paired else unpaired_interval(grid[0], grid[1])


def _cell(block: Block, c: str, rows: pd.DataFrame, scores: Scores) -> None:
    starts, finals = _seeds(rows, scores, "start"), _seeds(rows, scores, "final")
    e = block.est.setdefault(c, {})
    e[START] = _estimate(grids(scores, [[(p, "start") for p in starts.values()]]), True)
    e[FINAL] = _estimate(grids(scores, [[(p, "final") for p in finals.values()]]), True)
    both = [p for s, p in finals.items() if s in starts]
    gain = grids(scores, [[(p, "final") for p in both], [(p, "start") for p in both]])
    e[GAIN] = _estimate(gain, True)
    if gain[0].size:
        block.gain_grids[c] = gain[0] - gain[1]


def task_identity(row: pd.Series, neutral: frozenset[str] = frozenset()) -> str:
    """What decides a point's held-out tasks: the environment, its options and the split's size; a
    mixture's members without their weights (its held-out split takes every member equally). Two
    points pair by task only when these agree: the same task id on another map size or level
    generator is another task. `neutral`: the options the sweep's manifest lists as not deciding
    the tasks (`task_neutral`, e.g. Sokoban's deadlock handling), left out."""

    def unweighted(v):  # a mixture's member list (env.mixture, and env.options.members once resolved)
        if isinstance(v, list):
            return [{k: x for k, x in m.items() if k != "weight"} if isinstance(m, dict) else m for m in v]
        return v

    keys = sorted(k for k in row.index if k.startswith("env.options.") and k not in neutral) + [
        "env.name",
        "env.heldout_tasks",
        "env.mixture",
    ]
    return "; ".join(f"{k}={unweighted(row.get(k))!r}" for k in keys if k in row.index)


def _delta(block: Block, c: str, rows, base_rows, scores: Scores, own_group: bool, when) -> Interval | None:
    """Cell minus baseline at `when` ('final' or an episode budget); paired when the seeds match.
    A cell evaluated on other tasks than its baseline's (`task_identity`) is compared unpaired, each
    side on its own tasks (`separate_interval`), and never enters the MDE's paired differences."""
    a, b = _seeds(rows, scores, "final"), _seeds(base_rows, scores, "final")
    if c in block.other_tasks:
        block.paired[c] = False
        left = grids(scores, [[(p, when) for p in a.values()]])[0]
        right = grids(scores, [[(p, when) for p in b.values()]])[0]
        if left.size == 0 or right.size == 0:
            return None
        return separate_interval(left, right)
    paired = set(a) == set(b)
    left = [(a[s], when) for s in (sorted(a) if paired else a)]
    right = [(b[s], when) for s in (sorted(b) if paired else b)]
    grid = grids(scores, [left, right])
    if paired and grid[0].size and when == FINAL:
        block.delta_grids[c] = grid[0] - grid[1]
        if own_group:
            block.diffs.append(block.delta_grids[c])
    block.paired[c] = paired
    return _estimate(grid, paired)


def _cost(rows: pd.DataFrame, totals: dict[str, dict[str, float]]) -> dict[str, float]:
    """Mean over the cell's finished seeds of each cost total (NaN where none is known)."""
    out = {}
    for name in COST:
        vals = [totals[name].get(p, math.nan) for p in rows["point"]]
        vals = [v for v in vals if not math.isnan(v)]
        out[name] = float(np.mean(vals)) if vals else math.nan
    return out


def build_block(done: pd.DataFrame, cells: list[str], scores: Scores, totals) -> Block:
    """The start/final/gain/Δ (and Δ@ when costs differ) estimates of every cell."""
    has_start = any(scores.at(p, "start") is not None for p in done["point"])
    block = Block([START, FINAL, GAIN] if has_start else [FINAL])
    for c in cells:
        _cell(block, c, done[done["cell"] == c], scores)
        block.cost[c] = _cost(done[done["cell"] == c], totals)
    first = {c: done[done["cell"] == c].iloc[0] if (done["cell"] == c).any() else None for c in cells}
    bases = {c: (r["baseline_cell"] if r is not None else None) for c, r in first.items()}
    block.base_cells = {b for b in bases.values() if b}
    meta = done.attrs.get("sweep")
    neutral = frozenset((getattr(meta, "raw", None) or {}).get("task_neutral") or ())
    if block.base_cells:
        block.columns.append(DELTA)
    for c in cells:
        base = bases[c]
        if base is None or c == base or not (done["cell"] == base).any():
            continue
        own = not (first[c]["config_group"] or "")
        base_rows = done[done["cell"] == base]
        if task_identity(first[c], neutral) != task_identity(base_rows.iloc[0], neutral):
            block.other_tasks.add(c)
        block.est[c][DELTA] = _delta(block, c, done[done["cell"] == c], base_rows, scores, own, FINAL)
        ec, eb = block.cost[c]["episodes"], block.cost[base]["episodes"]
        if not (math.isnan(ec) or math.isnan(eb)) and abs(ec / eb - 1) > COST_TOLERANCE:
            block.budget[c] = min(ec, eb)
            when = float(block.budget[c])
            block.est[c][MATCHED] = _delta(block, c, done[done["cell"] == c], base_rows, scores, own, when)
    if block.budget:
        block.columns.append(MATCHED)
    block.tasks = scores.tasks
    return block


def add_needed(block: Block, cells: list[str], family: int, margin: float) -> None:
    """For each undetermined contrast of a fixed-seed table, the seeds a verdict would need at its
    observed Δ and variance, at the levels of this table's rule run once at that many seeds: Holm's
    strictest level over the table's `family` contrasts (0.05 / family) for a difference, the 90%
    TOST for equivalence. From the paired grid where there is one (analysis.intervals.
    seeds_for_verdict), else from the interval (`seeds_for_interval`, a lower bound)."""
    grids_of = block.delta_grids if block.tested == DELTA else block.gain_grids
    for c in cells:
        iv = block.est[c][block.tested]
        grid = grids_of.get(c)
        if grid is not None and grid.shape[0] >= 2:
            block.needed[c] = seeds_for_verdict(grid, FAMILY_ALPHA / family, TOST_ALPHA, margin)
        elif iv is not None and iv.n >= 2:
            block.needed[c] = seeds_for_interval(iv, FAMILY_ALPHA / family, TOST_ALPHA, margin)
            block.needed_from_interval.add(c)


def power(block: Block) -> tuple[Design | None, str]:
    """The design of the sweep's paired Δ grids (own config), else of the baseline's paired gain:
    its mean squares give the MDE of one more contrast (analysis.intervals, same model as the
    intervals); (None, why) when not estimable."""
    design = pooled_design(block.diffs)
    if design is not None:
        return design, "the paired Δ of every cell"
    design = pooled_design(list(block.gain_grids.values())[:1])
    if design is not None:
        return design, "the baseline's paired gain"
    return None, "needs at least 2 seeds with paired results"


def add_verdicts(block: Block, margin: float, higher_is_better: bool | None) -> None:
    """The verdict of every contrast of the table, Holm-corrected together: every cell's Δ (the
    baselines have none), or every cell's gain in a table without a Δ to test, e.g. a one-cell sweep
    (docs/algorithms.md#statistics)."""

    def tested_cells(col: str) -> list[str]:
        return [c for c, e in block.est.items() if col in block.columns and e.get(col) is not None and e[col].n > 0]

    tested = DELTA if tested_cells(DELTA) else GAIN  # a table of baselines only (one cell): its gains
    cells = tested_cells(tested)
    if not cells:
        return
    # a Δ against a baseline on other held-out tasks (‡) compares two task distributions: an established
    # difference is "higher" / "lower", never "better" / "worse", which would name a better method
    sides = [None if tested == DELTA and c in block.other_tasks else higher_is_better for c in cells]
    rows = verdicts([block.est[c][tested] for c in cells], margin, sides)
    block.verdicts = dict(zip(cells, rows))
    block.tested = tested
    add_needed(block, [c for c in cells if block.verdicts[c][0] == "undetermined"], len(cells), margin)
    at = block.columns.index(tested) + 1
    block.columns.insert(at, VERDICT)
