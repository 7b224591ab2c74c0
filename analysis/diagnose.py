"""Diagnostics put to the test: what each logged diagnostic, read early, says about how the run ends.

    harness diagnose results/smollm2_learning_frozenlake results/clipping.records.jsonl.gz ...

One row per finished run, pooled over any number of results folders or records packs
(analysis.records): the run's diagnostics read over its first `cut` of updates (the first 25% and
10% of the planned updates) and its outcome. A run that appears in several sweeps (a shared
baseline: same config hash) counts once, in the first sweep given.

Outcome: the final held-out success (default `eval_sampled`, the policy RL trains; `eval_greedy`
on request) and the start (the evaluation before RL, update 0).

Collapse, defined once: the run diverged (status `diverged`: a non-finite loss stopped it), or its
final held-out success is below its start by at least `fall` (0.05) and by more than noise, a paired
z <= -2 over the held-out episodes, which every evaluation plays with the same tasks and sampling
seeds (eval_tasks.jsonl; without those rows, a two-proportion z on the summary's rates). Every
point's start and final are its own, so this is a per-run test, needing no other seed. The
detectors' own flags (KL blow-up, echo trap) are predictors here, not part of the outcome: an
outcome defined by a flag cannot test that flag. The onset of a collapse is the first evaluation
after update 0 that passes the test (only the final one where a run evaluates only at the end).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from analysis.load import AnalysisError, load_results, read_metrics_rows
from analysis.records import as_folder, sweep_name
from harness.store import EVAL_TASKS, FINISHED, METRICS


@dataclass(frozen=True)
class Diagnostic:
    """One row of the table: a metrics.jsonl key reduced over the early window."""

    name: str
    key: str
    reduce: str  # mean | max | sum | slope (least-squares change per update over the window)
    source: str  # who recommends watching it, and for what


PAPERS = {
    "ragen": "RAGEN (Wang et al. 2025)",
    "ragen2": "RAGEN-2 (Wang et al. 2026)",
    "arlarena": "ARLArena",
}
DIAGNOSTICS = (
    Diagnostic("KL k1", "diag/kl_k1", "mean", "ARLArena: KL to the reference rises before a collapse"),
    Diagnostic("KL k3", "diag/kl_k3", "mean", "ARLArena"),
    Diagnostic("KL k3 max", "diag/kl_k3_max", "max", "ARLArena: per-token KL outliers"),
    Diagnostic("KL spikes", "diag/kl_spike", "sum", "ARLArena: KL spikes precede a collapse"),
    Diagnostic("IS ratio max", "diag/ratio_max", "max", "clipping literature: ratio outliers"),
    Diagnostic("clip fraction", "diag/clip_frac", "mean", "clipping literature"),
    Diagnostic("entropy", "diag/entropy", "mean", "RAGEN-2: can stay stable during template collapse"),
    Diagnostic("entropy slope", "diag/entropy", "slope", "RAGEN-2"),
    Diagnostic("entropy, constrained", "diag/entropy_constrained", "mean", "entropy over the allowed actions"),
    Diagnostic("MI estimate", "diag/mi_estimate", "mean", "RAGEN-2: input dependence predicts success"),
    Diagnostic("MI slope", "diag/mi_estimate", "slope", "RAGEN-2: falling MI = template collapse"),
    Diagnostic("retrieval acc@1", "diag/retrieval_acc@1", "mean", "RAGEN-2"),
    Diagnostic("cross-prompt similarity", "diag/cross_prompt_similarity", "mean", "RAGEN: rising = echo trap"),
    Diagnostic("similarity slope", "diag/cross_prompt_similarity", "slope", "RAGEN"),
    Diagnostic("in-group reward std", "env/group_reward_std", "mean", "RAGEN: falling = echo trap"),
    Diagnostic("reward std slope", "env/group_reward_std", "slope", "RAGEN"),
    Diagnostic("echo-trap flag", "diag/echo_trap", "max", "RAGEN: stop training when it fires"),
    Diagnostic("zero-variance groups", "env/zero_var_group_frac", "mean", "RAGEN, DAPO"),
    Diagnostic("sampler-trainer mismatch", "diag/logprob_mismatch", "mean", "rollout-training mismatch"),
    Diagnostic("mismatch k3", "diag/mismatch_k3", "mean", "rollout-training mismatch"),
    Diagnostic("mean abs advantage", "diag/adv_abs_mean", "mean", "advantage statistics"),
    Diagnostic("grad norm", "diag/grad_norm", "mean", "gradient statistics"),
    Diagnostic("grad norm max", "diag/grad_norm", "max", "gradient statistics"),
    Diagnostic("SAMPO kept fraction", "diag/seq_mask_kept_frac", "mean", "ARLArena (SAMPO)"),
    Diagnostic("training success", "env/success", "mean", "reference: the reward itself"),
)
CUTS = (0.25, 0.10)
FALL, Z_COLLAPSE = 0.05, 2.0
MODES = ("sampled", "greedy")


def feature_column(d: Diagnostic, cut: float) -> str:
    return f"{d.name}@{cut:g}"


# ----------------------------------------------------------------------------- reading one run
def _reduce(values: list[tuple[int, float]], how: str) -> float:
    """Reduce (update, value) pairs; NaN where nothing finite was logged."""
    pts = [(u, v) for u, v in values if math.isfinite(v)]
    if not pts:
        return math.nan
    v = np.array([p[1] for p in pts])
    if how == "mean":
        return float(v.mean())
    if how == "max":
        return float(v.max())
    if how == "sum":
        return float(v.sum())
    u = np.array([p[0] for p in pts], dtype=float)
    if len(pts) < 2 or u.std() == 0:
        return math.nan
    return float(np.polyfit(u, v, 1)[0])


def early_features(rows: list[dict], planned: int, cuts: tuple[float, ...] = CUTS) -> dict[str, float]:
    """Every diagnostic over updates 1..ceil(cut * planned) (update 0 is the evaluation before RL)."""
    out = {}
    for cut in cuts:
        last = max(1, math.ceil(cut * planned))
        window = [r for r in rows if 1 <= _update(r) <= last]
        for d in DIAGNOSTICS:
            pairs = [(_update(r), float(r[d.key])) for r in window if _number(r.get(d.key))]
            out[feature_column(d, cut)] = _reduce(pairs, d.reduce)
    return out


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _update(row: dict) -> int:
    u = row.get("update")
    return int(u) if _number(u) else -1


def first_flag(rows: list[dict], keys: tuple[str, ...]) -> float:
    """The first update at which any of `keys` is 1 (NaN if never)."""
    for r in sorted(rows, key=_update):
        if any(_number(r.get(k)) and r[k] >= 1 for k in keys):
            return float(_update(r))
    return math.nan


MI_KEY, ENTROPY_KEY = "diag/mi_estimate", "diag/entropy"


def first_mi(rows: list[dict]) -> dict[str, float]:
    """The MI proxy at its first reading after update 0 (it is logged every train.mi_every updates, so
    in a short run the first reading can fall after the early cut-offs), the update it was read at, and
    the mean entropy over updates 1 to that one: the two readings RAGEN-2's claim compares."""
    readings = sorted((_update(r), float(r[MI_KEY])) for r in rows if _number(r.get(MI_KEY)) and _update(r) >= 1)
    if not readings:
        return {"mi_first": math.nan, "mi_at": math.nan, "entropy_to_mi": math.nan}
    at, mi = readings[0]
    ent = [float(r[ENTROPY_KEY]) for r in rows if 1 <= _update(r) <= at and _number(r.get(ENTROPY_KEY))]
    return {"mi_first": mi, "mi_at": float(at), "entropy_to_mi": float(np.mean(ent)) if ent else math.nan}


def _eval_pairs(path: Path, mode: str) -> dict[int, dict[tuple, float]]:
    """{update: {(task, sample): success}} of one decoding mode from eval_tasks.jsonl."""
    out: dict[int, dict[tuple, float]] = {}
    for r in read_metrics_rows(path):
        if r.get("mode") == mode and _number(r.get("success")) and _number(r.get("update")):
            out.setdefault(int(r["update"]), {})[(r.get("task"), r.get("sample"))] = float(r["success"])
    return out


def paired_drop(start: dict[tuple, float], later: dict[tuple, float]) -> tuple[float, float]:
    """(mean change, its z) over the episodes both evaluations played; z = 0 with no spread."""
    d = np.array([later[k] - start[k] for k in start if k in later])
    if len(d) < 2:
        return math.nan, math.nan
    sd = d.std(ddof=1)
    return float(d.mean()), float(d.mean() / (sd / math.sqrt(len(d)))) if sd > 0 else 0.0


def _two_proportion_z(p0: float, p1: float, n: float) -> float:
    se = math.sqrt((p0 * (1 - p0) + p1 * (1 - p1)) / n) if n > 0 else 0.0
    return (p1 - p0) / se if se > 0 else 0.0


def collapse_onset(pdir: Path, mode: str, start: float, final: float, episodes: float) -> float:
    """The first evaluated update where success is below the start by >= FALL with z <= -Z_COLLAPSE
    (NaN if none). Paired over eval_tasks.jsonl when it is there, else the final from the summary."""
    evals = _eval_pairs(pdir / EVAL_TASKS, mode)
    if 0 in evals and len(evals) > 1:
        later = sorted(k for k in evals if k > 0)

        def fell(u: int) -> bool:
            change, z = paired_drop(evals[0], evals[u])
            return change <= -FALL and z <= -Z_COLLAPSE

        if not fell(later[-1]):  # a dip the run recovered from is not a collapse: the final decides
            return math.nan
        return float(next(u for u in later if fell(u)))
    if math.isfinite(start) and math.isfinite(final) and start - final >= FALL:
        if _two_proportion_z(start, final, episodes) <= -Z_COLLAPSE:
            return math.inf  # collapsed by the end; the update is not known
    return math.nan


# ----------------------------------------------------------------------------- all runs
def _planned(row: pd.Series, rows: list[dict]) -> int:
    planned = row.get("train.updates")
    if _number(planned) and planned > 0:
        return int(planned)
    return max([_update(r) for r in rows] + [1])


def sweep_points(path: str | Path, mode: str = "sampled") -> pd.DataFrame:
    """One row per finished run of one results folder or pack (see the module doc for the columns'
    meaning). An empty folder, or one whose runs log no diagnostics, is an AnalysisError naming it."""
    folder = as_folder(path)
    results = load_results(folder)  # raises, naming the path, when it is no results folder
    name = sweep_name(path)
    done = results[results["status"].isin(FINISHED)]
    if done.empty:
        raise AnalysisError(f"{path} has no finished point (status done or diverged): nothing to score.")
    out = []
    for _, r in done.iterrows():
        rows = read_metrics_rows(folder / r["point"] / METRICS)
        start = _float(r.get(f"init/eval_{mode}/success"))
        final = _float(r.get(f"final/eval_{mode}/success"))
        diverged = r["status"] == "diverged"
        onset = collapse_onset(folder / r["point"], mode, start, final, _float(r.get(f"final/eval_{mode}/episodes")))
        planned = _planned(r, rows)
        if diverged and not math.isfinite(onset):
            onset = float(max([_update(x) for x in rows] + [0]))
        row = {
            "sweep": name,
            "point": r["point"],
            "config_hash": r.get("config_hash") or f"{name}/{r['point']}",
            "seed": r.get("seed"),
            "status": r["status"],
            "updates": planned,
            "start": start,
            "final": final,
            "collapsed": bool(diverged or not math.isnan(onset)),
            "onset": onset,
            "echo_at": first_flag(rows, ("diag/echo_trap",)),
            "kl_spike_at": first_flag(rows, ("diag/kl_spike", "diag/kl_blowup")),
        }
        row.update(early_features(rows, planned))
        row.update(first_mi(rows))
        out.append(row)
    df = pd.DataFrame(out)
    logged = [feature_column(d, CUTS[0]) for d in DIAGNOSTICS if d.key.startswith("diag/")]
    if df[logged].isna().all().all():
        raise AnalysisError(
            f"{path} holds runs but no per-update diagnostics (no diag/... key in any metrics.jsonl): "
            "nothing to test. Runs of `harness sweep` log them every update."
        )
    return df


def _float(v) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        return math.nan


def pooled_points(paths: list[str | Path], mode: str = "sampled") -> pd.DataFrame:
    """Every finished run of every folder or pack, a run shared by several sweeps once (first given)."""
    if not paths:
        raise AnalysisError("no results given: name one or more results folders or records packs.")
    if mode not in MODES:
        raise AnalysisError(f"outcome mode {mode!r} is not one of {', '.join(MODES)}.")
    frames = [sweep_points(p, mode) for p in paths]
    df = pd.concat(frames, ignore_index=True)
    if df["final"].isna().all():
        other = next(m for m in MODES if m != mode)
        raise AnalysisError(
            f"no run of {', '.join(map(str, paths))} records final/eval_{mode}/success (a held-out evaluation "
            f"with {mode} decoding): nothing to predict; try --outcome {other}."
        )
    return df.drop_duplicates("config_hash", keep="first").reset_index(drop=True)


def feature(df: pd.DataFrame, d: Diagnostic, cut: float) -> np.ndarray:
    return df[feature_column(d, cut)].to_numpy(dtype=float)
