"""The verdict column of a sweep with a seed budget (sweep.json's `sequential`): analysis.sequential's
looks replayed from the finished points instead of one fixed-n Holm family.

Each cell of the sweep's own config gets the Δ and verdict of the look that decided it (its seeds
paired with the baseline's first seeds), or of the last look taken while it is open; the seeds
column shows the seeds each row used. A row still undetermined after the look at `max`, or still
open in a sweep that has not taken its looks (the time cap of `harness sweep --max-minutes` stopped
it: sweep.json's `sequential.capped`), gets, in the notes, the seeds a verdict would need at the
observed variance (`seeds_needed`). Cells of another base config have no sequential design and get
no verdict.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from analysis.columns import DELTA, VERDICT, Block
from analysis.intervals import DEFAULT_MARGIN
from analysis.sequential import Plan, decide, seeds_needed
from analysis.tasks import Scores

KEY = "sequential"


@dataclass
class SequentialRows:
    plan: Plan
    looks_taken: int = 0
    complete: bool = False  # every look decided or the last one taken
    look: dict[str, int] = field(default_factory=dict)  # cell -> look (1-based) of its verdict
    seeds: dict[str, int] = field(default_factory=dict)  # cell -> seeds its estimate used
    needed: dict[str, int | None] = field(default_factory=dict)  # undetermined or open -> seeds a verdict needs
    open: set[str] = field(default_factory=set)  # cells whose looks are still to come
    capped: dict | None = None  # sweep.json's sequential.capped: the time cap stopped the last run


def plan_of(raw: dict, margin: float | None) -> Plan | None:
    """The Plan of sweep.json's `sequential` entry (None for a sweep with a list of seeds)."""
    seq = (raw or {}).get(KEY)
    if not isinstance(seq, dict):
        return None
    return Plan(int(seq["start"]), int(seq["step"]), int(seq["max"]), str(seq["spending"]), margin or DEFAULT_MARGIN)


def capped_of(raw: dict) -> dict | None:
    """sweep.json's `sequential.capped` (the time cap stopped the last run), else None."""
    capped = ((raw or {}).get(KEY) or {}).get("capped")
    return capped if isinstance(capped, dict) else None


def capped_early(raw: dict) -> list[str]:
    """The note of a sweep the time cap stopped before any contrast had a finished point (no looks to
    show), else []."""
    capped = capped_of(raw)
    if capped is None:
        return []
    return [
        f"Sequential seeds: the time cap of its last run ({capped.get('max_minutes')} minutes) stopped it in look "
        f"{capped.get('look')} ({capped.get('seeds')} seeds) before its contrasts had results; the same command "
        "resumes it."
    ]


def _points(rows: pd.DataFrame) -> dict[int, str]:
    return {int(s): p for s, p in zip(rows["seed"], rows["point"]) if not pd.isna(s)}


def add_sequential_verdicts(
    block: Block, done: pd.DataFrame, scores: Scores, plan: Plan, higher_is_better: bool | None
) -> SequentialRows | None:
    """Replace the Δ and verdict of every cell of the sweep's own config by its sequential decision."""
    own = done[done["config_group"] == ""]
    if DELTA not in block.columns or own.empty:
        return None
    base = own["baseline_cell"].iloc[0]
    arms = {c: _points(g) for c, g in own.groupby("cell", sort=False) if c != base}
    if not arms or base not in set(own["cell"]):
        return None
    outcome, grids = decide(plan, arms, _points(own[own["cell"] == base]), scores, higher_is_better)
    info = SequentialRows(plan, len(outcome.looks), outcome.next_look is None)
    block.diffs = list(grids.values())
    family = len(arms)
    for c, d in outcome.decisions.items():
        if d.interval is not None:
            block.est[c][DELTA] = d.interval
            block.paired[c] = True
        # p: unadjusted, at the look that decided it (no Holm-adjusted p in a sequential design)
        block.verdicts[c] = ("undetermined" if d.verdict == "open" else d.verdict, math.nan)
        info.look[c], info.seeds[c] = d.look + 1, d.seeds
        if d.verdict == "open":
            info.open.add(c)
        if d.verdict in ("undetermined", "open") and c in grids:
            info.needed[c] = seeds_needed(grids[c], plan, family)
    block.tested, block.sequential = DELTA, True
    block.columns.insert(block.columns.index(DELTA) + 1, VERDICT)
    return info


def requested(results: pd.DataFrame, cells: list[str]) -> dict[str, int]:
    """Seeds scheduled per cell: the points sweep.json lists for it (the looks it took part in)."""
    counts = results.groupby("cell")["point"].count()
    return {c: int(counts.get(c, 0)) for c in cells}


def notes(info: SequentialRows, labels: dict[str, str]) -> list[str]:
    """How the verdicts were reached, and what each row's seeds were."""
    plan = info.plan
    looks = ", ".join(map(str, plan.looks))
    if info.complete:
        state = "every look is decided"
    elif info.capped:
        state = (
            f"{info.looks_taken} of {len(plan.looks)} looks taken: the time cap of its last run "
            f"({info.capped.get('max_minutes')} minutes) stopped it in look {info.capped.get('look')} "
            f"({info.capped.get('seeds')} seeds); the same command resumes it"
        )
    else:
        state = f"{info.looks_taken} of {len(plan.looks)} looks taken (the sweep is still running)"
    spending = plan.spending.replace("_", "-")
    out = [
        f"Sequential seeds: looks at {looks} seeds with {spending} alpha spending (Lan-DeMets); "
        f"at each look Holm across the contrasts not yet better / worse at that look's share of the family-wise "
        f"{plan.alpha:g}, and the TOST at its share of {plan.equivalence_alpha:g} (docs/algorithms.md#statistics); "
        f"a decided row keeps its verdict and seeds, so the seeds column shows the seeds each row used; {state}."
    ]
    rows = []
    for c, look in info.look.items():
        if look <= 0:
            continue
        where = "still open after" if c in info.open else "at"
        text = f"{labels.get(c, c)} {where} look {look} ({info.seeds[c]} seeds)"
        if c in info.needed:
            need = info.needed[c]
            text += (
                f", a verdict would need about {need} seeds at the observed Δ and variance"
                if need is not None
                else ", no verdict below 1000 seeds at the observed Δ and variance"
            )
        rows.append(text)
    if rows:
        out.append("Looks: " + "; ".join(rows) + ".")
    return out


def decided_line(info: SequentialRows, verdicts: dict[str, tuple[str, float]]) -> str:
    """'Verdicts: k of N contrasts decided (...)': what a run of the sweep reached."""
    words = [v for v, _ in verdicts.values()]
    decided = [w for w in words if w not in ("undetermined", "degenerate")]
    counts = ", ".join(f"{words.count(w)} {w}" for w in dict.fromkeys(decided))
    still = len(info.open)
    return (
        f"Verdicts: {len(decided)} of {len(words)} contrasts decided{f' ({counts})' if counts else ''}"
        + (f"; {still} still open (more looks to come)" if still else "")
        + "."
    )


def finding(info: SequentialRows, cell: str) -> dict:
    """What a findings row adds for a contrast with a projection: the seeds a verdict would need and,
    while its looks are still to come, where it stands (look, looks, seeds)."""
    if cell not in info.needed:
        return {}
    out: dict = {"needed": info.needed[cell]}
    if cell in info.open:
        out["open_look"] = (info.look[cell], len(info.plan.looks), info.seeds[cell])
    return out


def record(info: SequentialRows, cell: str) -> dict:
    """The CSV columns of a row of a sequential table."""
    if cell not in info.look:
        return {}
    need = info.needed.get(cell)
    return {"sequential:look": info.look[cell], "sequential:seeds_needed": need if need is not None else np.nan}
