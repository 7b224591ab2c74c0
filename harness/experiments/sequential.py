"""Run a sweep with a seed budget look by look (harness.experiments.seed_budget for the file's side).

Each round: decide every look whose points have finished (analysis.sequential.decide, from the
points' per-task results: the table's statistics), record the decisions in results/<sweep>/looks.json
(atomically, through harness.store), then run the points of the next look, seeds 0 .. n_k - 1 of
the variants still open and of the baseline, with whatever runs points (the local pool, `--workers
N`, or Ray: the same `run_points` a sweep with a list of seeds uses, one call per look). A decided
variant keeps its verdict and its seeds; it gets no more points.

Resuming: the decisions are a function of the finished points, so after Ctrl-C or a kill the next
run replays them, finds the same look and runs (or resumes) the same points. looks.json records
the plan (budget, spending, margin, metric, baseline) with the looks: a run whose sweep file has
changed any of them after a look was taken stops with an error, since the error rates hold only for
looks and a margin fixed before the seeds ran.

A time cap (`harness sweep --max-minutes`, harness.experiments.runner): once it has passed, no new
look and no new point starts; the points in flight finish. sweep.json's `sequential` entry then
records `capped` (the cap, the look it stopped in, the variants still open), which the table reports
with the seeds each open row would need; the next run of the same command resumes that look and
drops the record (its manifest is written afresh).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from analysis.tasks import HIGHER_IS_BETTER, load_tasks, task_metric, task_scores
from harness.config.errors import ConfigError
from harness.experiments.point import RunOptions, past_deadline, point_dir, point_state
from harness.experiments.sweep import Point, Sweep
from harness.store import FINISHED, LOOKS, SWEEP_MANIFEST, atomic_write_json

PLAN_KEYS = ("start", "step", "max", "spending", "margin", "metric", "baseline")


def _by_variant(sweep: Sweep) -> dict[str, dict[int, Point]]:
    out: dict[str, dict[int, Point]] = {}
    for p in sweep.points:
        out.setdefault(p.variant, {})[p.seed] = p
    return out


def decide_looks(sweep: Sweep, results: Path):
    """(plan, outcome, grids) of the looks the finished points of `sweep` decide (analysis.sequential)."""
    from analysis.sequential import decide

    plan = sweep.budget.plan(sweep.equivalence_margin)
    folder = Path(results) / sweep.name
    finished = {p.id for p in sweep.points if point_state(point_dir(results, sweep.name, p)) in FINISHED}
    by_variant = _by_variant(sweep)
    ids = {v: {s: p.id for s, p in seeds.items() if p.id in finished} for v, seeds in by_variant.items()}
    _, mode, field = task_metric(f"final/{sweep.metric}")
    scores = task_scores(load_tasks(folder, sorted(finished)), mode, field)
    arms = {v: ids[v] for v in by_variant if v != sweep.baseline}
    outcome, grids = decide(plan, arms, ids[sweep.baseline], scores, HIGHER_IS_BETTER.get(field))
    return plan, outcome, grids


def look_points(sweep: Sweep, plan: Any, outcome: Any) -> list[Point]:
    """Every point up to the next look: a decided variant's seeds as decided, the open ones' and
    the baseline's seeds 0 .. n_k - 1 of the next look (of the last look taken when none is left:
    a sweep decided early never runs its baseline further)."""
    if outcome.next_look is not None:
        n = plan.looks[outcome.next_look]
    else:
        n = outcome.looks[-1]["seeds"] if outcome.looks else plan.looks[0]
    seeds = {v: n for v in _by_variant(sweep)}
    for arm, d in outcome.decisions.items():
        if d.verdict != "open":
            seeds[arm] = d.seeds
    return [p for p in sweep.points if p.seed < seeds[p.variant]]


def _plan_record(sweep: Sweep, plan: Any) -> dict[str, Any]:
    return {**plan.as_dict(), "metric": sweep.metric, "baseline": sweep.baseline}


def check_recorded(sweep: Sweep, plan: Any, folder: Path) -> None:
    """A ConfigError when looks.json records another plan than the file's now and a point of the
    sweep has finished (its data may have been seen): the plan is fixed before the seeds run."""
    path = folder / LOOKS
    try:
        old = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return
    if not isinstance(old, dict):
        return
    now, then = _plan_record(sweep, plan), old.get("plan") or {}
    changed = [k for k in PLAN_KEYS if then.get(k) != now.get(k)]
    if not changed:
        return
    ran = sum(point_state(point_dir(folder.parent, sweep.name, p)) in FINISHED for p in sweep.points)
    if ran or old.get("looks"):
        diff = ", ".join(f"{k} {then.get(k)!r} -> {now.get(k)!r}" for k in changed)
        raise ConfigError(
            f"{sweep.path}: the seed budget of sweep {sweep.name} changed after {len(old.get('looks') or [])} "
            f"look(s) were taken and {ran} of its points finished ({path}: {diff}). Its looks, spending, "
            f"equivalence margin, metric and baseline are fixed before its seeds run (the error rates hold only "
            f"then): restore them, or run it under another name (a new results folder)."
        )


def record(sweep: Sweep, plan: Any, outcome: Any, folder: Path) -> None:
    """results/<sweep>/looks.json: the plan, every look taken with its levels and verdicts, and each
    variant's current decision."""
    decisions = {
        arm: {"verdict": d.verdict, "look": d.look + 1 if d.look >= 0 else None, "seeds": d.seeds, "p": d.p}
        | ({"delta": d.interval.value, "se": d.interval.se, "df": d.interval.df} if d.interval else {})
        for arm, d in outcome.decisions.items()
    }
    next_look = outcome.next_look + 1 if outcome.next_look is not None else None
    body = {"plan": _plan_record(sweep, plan), "looks": outcome.looks, "next_look": next_look, "decisions": decisions}
    atomic_write_json(folder / LOOKS, body)


def plan_lines(sweep: Sweep, results: Path) -> tuple[list[str], list[Point]]:
    """What `--dry-run` prints for a sweep with a budget (the decisions so far, the next look and
    which variants get seeds), and the points up to that look."""
    check_recorded(sweep, sweep.budget.plan(sweep.equivalence_margin), Path(results) / sweep.name)
    plan, outcome, _ = decide_looks(sweep, results)
    looks = ", ".join(map(str, plan.looks))
    lines = [
        f"sweep {sweep.name}: sequential seeds, looks at {looks} seeds ({plan.spending} spending, "
        f"family-wise α {plan.alpha:g}, equivalence margin ±{plan.margin:g}); baseline: {sweep.baseline}"
    ]
    for arm, d in outcome.decisions.items():
        if d.verdict != "open":
            lines.append(f"  {arm}: {d.verdict} at look {d.look + 1} ({d.seeds} seeds)")
    if outcome.next_look is None:
        lines.append("  every look is decided: nothing to run")
    else:
        k, open_arms = outcome.next_look, outcome.open_arms()
        lines.append(
            f"  next: look {k + 1} of {len(plan.looks)} ({plan.looks[k]} seeds) for {', '.join(open_arms)} "
            f"and the baseline {sweep.baseline}"
        )
    return lines, look_points(sweep, plan, outcome)


def _finished(sweep: Sweep, results: Path, p: Point) -> bool:
    return point_state(point_dir(results, sweep.name, p)) in FINISHED


def _blocked(sweep: Sweep, results: Path, points: list[Point]) -> str:
    waiting = [p for p in points if point_state(point_dir(results, sweep.name, p)) not in FINISHED]
    if waiting:
        states = ", ".join(f"{p.id} ({point_state(point_dir(results, sweep.name, p)) or 'new'})" for p in waiting[:4])
        return f"its points did not all finish: {states}; `harness sweep FILE --retry-failed` runs failed ones again"
    return "its finished points lack per-task results (eval_tasks.jsonl) for the sweep's metric"


def note_cap(sweep: Sweep, opts: RunOptions, plan: Any, folder: Path) -> None:
    """sweep.json's `sequential.capped`: the time cap stopped this run before the looks were decided."""
    outcome = decide_looks(sweep, opts.results)[1]
    if outcome.next_look is None:
        return
    path = folder / SWEEP_MANIFEST
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return
    if not isinstance(manifest, dict) or not isinstance(manifest.get("sequential"), dict):
        return
    k = outcome.next_look
    manifest["sequential"]["capped"] = {
        "max_minutes": opts.max_minutes,
        "look": k + 1,
        "seeds": plan.looks[k],
        "open": outcome.open_arms(),
    }
    atomic_write_json(path, manifest)


def run_looks(sweep: Sweep, opts: RunOptions, run_points: Callable[[Sweep], Any]) -> Any:
    """Run the looks of `sweep` until every variant is decided, the budget is spent or the time cap
    has passed (module doc); `run_points(sub_sweep)` runs the points of one look and returns a
    runner.SweepResult."""
    folder = Path(opts.results) / sweep.name
    folder.mkdir(parents=True, exist_ok=True)
    plan = sweep.budget.plan(sweep.equivalence_margin)
    check_recorded(sweep, plan, folder)
    total = None
    while True:
        plan, outcome, _ = decide_looks(sweep, opts.results)
        record(sweep, plan, outcome, folder)
        if outcome.next_look is None:
            break
        if past_deadline(opts) and total is not None:  # no new look after the cap
            total.counts["capped"] = total.counts.get("capped", 0) + len(
                [p for p in look_points(sweep, plan, outcome) if not _finished(sweep, opts.results, p)]
            )
            note_cap(sweep, opts, plan, folder)
            break
        k, points = outcome.next_look, look_points(sweep, plan, outcome)
        print(
            f"look {k + 1} of {len(plan.looks)}: {plan.looks[k]} seeds for {', '.join(outcome.open_arms())} "
            f"and the baseline {sweep.baseline}",
            flush=True,
        )
        look = dataclasses.replace(sweep, points=points, seeds=list(range(plan.looks[k])))
        result = run_points(look)
        ran = sum(result.counts.get(c, 0) for c in ("done", "diverged", "failed", "elsewhere"))
        if total is None:
            total = result
        else:
            _add(total, result)
        if result.interrupted or not result.ok:
            break
        if result.counts.get("capped"):  # the cap passed inside this look
            note_cap(sweep, opts, plan, folder)
            break
        if not ran and decide_looks(sweep, opts.results)[1].next_look == k:
            total.counts["blocked"] = total.counts.get("blocked", 0) + 1
            total.errors[LOOKS] = f"look {k + 1} cannot be decided: {_blocked(sweep, opts.results, points)}"
            break
    if total is None:  # decided before this run: nothing ran
        total = run_points(dataclasses.replace(sweep, points=look_points(sweep, plan, outcome)))
    return total


def _add(total: Any, result: Any) -> None:
    """Counts of a later look added to the first's (its `skipped` are earlier looks' points: not again)."""
    for key, value in result.counts.items():
        if key != "skipped":
            total.counts[key] = total.counts.get(key, 0) + value
    total.errors.update(result.errors)
    total.busy += result.busy
    total.interrupted = total.interrupted or result.interrupted
