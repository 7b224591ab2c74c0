"""Per-task evaluation scores and cost curves: what the paired statistics of the table read.

`<point>/eval_tasks.jsonl` holds one row per evaluated episode:
    {"update", "mode": "greedy"|"sampled", "task", "sample", "success", "return", "turns"}
(a reward-hacking probe adds "true_success" and "exploit_rate", Sokoban with `deadlock` on adds
"deadlock_rate", 0/1 per episode) and, for a
mixture of environments (env.mixture), the member's label as "env"; a per-environment metric
(final/eval_sampled/<env>/success) is then scored on that member's tasks only.
Update 0 is the evaluation before RL (start), a point's last evaluated update is its final one.
Every point of a sweep evaluates the same tasks with the same per-(task, sample) sampling seeds,
so scores pair across points, seeds and updates by task (common random numbers).

A `Scores` object gives, per point and update, a Series over tasks (the mean over a task's
samples). Results written before per-task evaluation have no such file: `seed_scores` builds the
same interface with one pseudo-task per point from the summary and the learning curve, so the
table's statistics reduce to the per-seed ones.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from harness.store import EVAL_TASKS

MODES = ("greedy", "sampled")
# per-episode fields of some environments only: "true_success" and "exploit_rate" of the probes,
# "deadlock_rate" of Sokoban with `deadlock` on
OPTIONAL_FIELDS = ("true_success", "exploit_rate", "deadlock_rate")
FIELDS = ("success", "return", "turns", *OPTIONAL_FIELDS)
COLUMNS = ("point", "update", "mode", "task", "sample", *FIELDS, "env")
# the better direction of a task metric's field; fields not listed have none (verdict higher/lower)
HIGHER_IS_BETTER = {
    "success": True,
    "return": True,
    "true_success": True,
    "exploit_rate": False,
    "deadlock_rate": False,
}
EPISODE_KEYS = ("perf/episodes", "env/episodes")  # episodes generated per update (refills included)
TOKEN_KEYS = ("perf/rollout_tokens",)


def task_metric(name: str) -> tuple[str, str, str] | None:
    """'final/eval_greedy/success' -> ('final', 'greedy', 'success'); None for other metrics. A
    mixture's per-environment metric 'final/eval_greedy/<env>/success' gives the same triple
    (`task_env` names the environment)."""
    parts = name.split("/")
    if len(parts) == 4:
        parts = [parts[0], parts[1], parts[3]]
    if len(parts) != 3 or parts[0] not in ("final", "init") or parts[2] not in FIELDS:
        return None
    mode = parts[1].removeprefix("eval_")
    return (parts[0], mode, parts[2]) if parts[1].startswith("eval_") and mode in MODES else None


def task_env(name: str) -> str | None:
    """The environment of a per-environment task metric ('final/eval_sampled/sokoban/success')."""
    parts = name.split("/")
    return parts[2] if len(parts) == 4 and task_metric(name) is not None else None


def _rows(path: Path) -> list[dict]:
    """The JSON rows of a JSONL file; a torn last line (run still writing) or a bad line is skipped."""
    try:
        lines = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    except OSError:
        return []
    try:
        rows = json.loads("[" + ",".join(lines) + "]")  # one parse: fast for large files
    except ValueError:
        rows = []
        for line in lines:
            try:
                rows.append(json.loads(line))
            except ValueError:
                continue
    return [r for r in rows if isinstance(r, dict)]


def load_tasks(root: Path, points: list[str]) -> pd.DataFrame:
    """Rows of every point's eval_tasks.jsonl (columns COLUMNS); points without the file add nothing."""
    frames = []
    for pid in points:
        rows = _rows(Path(root) / pid / EVAL_TASKS)
        if rows:
            df = pd.DataFrame(rows).reindex(columns=COLUMNS[1:])
            df.insert(0, "point", pid)
            frames.append(df)
    if not frames:
        return pd.DataFrame(columns=list(COLUMNS))
    out = pd.concat(frames, ignore_index=True)
    for c in ("update", "task", "sample"):
        out[c] = pd.to_numeric(out[c], errors="coerce")
    return out.dropna(subset=["update", "task"])


@dataclass
class Scores:
    """Per point: a frame indexed by update with one column per task (NaN where not evaluated).
    `start`/`final` override the values at update 0 / the last update (the summary's, per seed)."""

    frames: dict[str, pd.DataFrame]
    per_task: bool
    tasks: int = 1
    samples: int = 1
    start: dict[str, float] = field(default_factory=dict)
    final: dict[str, float] = field(default_factory=dict)
    episodes: dict[str, pd.Series] = field(default_factory=dict)  # cumulative episodes by update (`cumulative`)
    note: str = ""  # why the scores are per seed, for the caption

    def has(self, point: str) -> bool:
        return point in self.frames or point in self.final

    def updates(self, point: str) -> list[int]:
        frame = self.frames.get(point)
        return [] if frame is None else [int(u) for u in frame.dropna(how="all").index]

    def at(self, point: str, when: str | int) -> pd.Series | None:
        """Scores over tasks at 'start', 'final' or an update number; None when not evaluated."""
        override = {"start": self.start, "final": self.final}.get(when) if isinstance(when, str) else None
        if override is not None and point in override:
            value = override[point]
            return None if math.isnan(value) else pd.Series([value], index=[0])
        frame = self.frames.get(point)
        if frame is None:
            return None
        frame = frame.dropna(how="all")
        if frame.empty:
            return None
        if when == "start":
            return frame.loc[0] if 0 in frame.index else None
        return frame.iloc[-1] if when == "final" else frame.loc[when] if when in frame.index else None


def task_scores(tasks: pd.DataFrame, mode: str, metric: str, env: str | None = None) -> Scores:
    """Scores of one decoding mode and field: the mean over each task's samples (of one member of
    a mixture when `env` is given)."""
    sub = tasks[tasks["mode"] == mode]
    if env is not None:
        sub = sub[sub["env"] == env]
    values = pd.to_numeric(sub[metric], errors="coerce")
    means = values.groupby([sub["point"], sub["update"], sub["task"]]).mean()
    frames = {
        str(p): g.droplevel(0).unstack("task").sort_index().astype(float) for p, g in means.groupby(level=0, sort=False)
    }
    n_tasks = int(sub.groupby(["point", "update"])["task"].nunique().max()) if len(sub) else 0
    samples = int(sub.groupby(["point", "update", "task"])["sample"].nunique().max()) if len(sub) else 0
    return Scores(frames, True, n_tasks, samples)


def seed_scores(curves: pd.DataFrame, metric: str, start: dict[str, float], final: dict[str, float]) -> Scores:
    """One pseudo-task per point: the learning curve of `metric` (e.g. eval_greedy/success), with
    start and final taken from the summary's init/ and final/ values where recorded."""
    c = curves[curves["metric"] == metric]
    frames = {
        str(p): g.groupby("update")["value"].last().sort_index().to_frame(0).astype(float)
        for p, g in c.groupby("point", sort=False)
    }
    return Scores(frames, False, 1, 1, dict(start), dict(final))


def matrix(scores: Scores, points: list[str], when: str | int | dict[str, float]) -> tuple[list[str], np.ndarray]:
    """(points kept, (n, m) scores on the tasks every kept point evaluated). `when` is 'start',
    'final', an update, or {point: episode budget} (see `at_budget`); points without scores drop."""
    cols, kept = [], []
    for p in points:
        s = at_budget(scores, p, when[p]) if isinstance(when, dict) else scores.at(p, when)
        if s is not None and s.notna().any():
            cols.append(s.rename(p))
            kept.append(p)
    if not cols:
        return [], np.empty((0, 0))
    grid = pd.concat(cols, axis=1).dropna()  # rows: tasks common to every kept point
    return kept, grid.to_numpy(dtype=float).T


# ----------------------------------------------------------------------------- cost
def cumulative(curves: pd.DataFrame, keys: tuple[str, ...]) -> dict[str, pd.Series]:
    """Per point: the running total of the first of `keys` it logged, indexed by update (0 at update 0)."""
    out: dict[str, pd.Series] = {}
    for key in keys:
        c = curves[curves["metric"] == key]
        for p, g in c.groupby("point", sort=False):
            if p in out:
                continue
            per_update = g.groupby("update")["value"].last().sort_index()
            total = per_update[per_update.index > 0].cumsum()
            out[str(p)] = pd.concat([pd.Series([0.0], index=[0]), total])
    return out


def at_budget(scores: Scores, point: str, budget: float) -> pd.Series | None:
    """Scores at `budget` cumulative episodes: linear interpolation (per task) between the two
    evaluations around it; a point that ended before the budget keeps its final scores."""
    x = scores.episodes.get(point)
    evals = scores.updates(point)
    if x is None or not evals:
        return scores.at(point, "final")
    xs = [float(x.get(u, math.nan)) for u in evals]
    pairs = [(u, e) for u, e in zip(evals, xs) if not math.isnan(e)]
    if not pairs or budget >= pairs[-1][1]:
        return scores.at(point, "final")
    for (u0, e0), (u1, e1) in zip(pairs, pairs[1:]):
        if e0 <= budget <= e1:
            w = 0.0 if e1 == e0 else (budget - e0) / (e1 - e0)
            return (1 - w) * scores.at(point, u0) + w * scores.at(point, u1)
    return scores.at(point, pairs[0][0])
