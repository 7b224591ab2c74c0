"""The outcome table, the papers' claims as verdict rows, and the early-stop check of `harness diagnose`.

Scores every diagnostic of analysis.diagnose on the pooled runs: Spearman's ρ with the final
held-out success, the R² it adds beside the start, the AUROC for a collapse, each with a 95%
interval from the bootstrap clustered by sweep, and leave-one-sweep-out (analysis.predictive).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from analysis.diagnose import CUTS, DIAGNOSTICS, Diagnostic, feature
from analysis.predictive import (
    Estimate,
    HeldOut,
    added_r2,
    auroc,
    cluster_bootstrap,
    leave_one_out,
    spearman,
    spearman_within,
)

REPS = 1000
MIN_POINTS = 4  # fewer runs with a value: the row says "not logged" instead of a number
SUPPORTED, CONTRADICTED, UNDETERMINED = "supported", "contradicted", "undetermined"
GOOD_AUROC = 0.75  # what a stop rule needs out of sample (held-out AUROC), and its interval clear of 0.5
SHIP_FOLDS = 3  # held-out sweeps (each with collapsed and healthy runs) before a rule is worth shipping


@dataclass(frozen=True)
class Score:
    diagnostic: Diagnostic
    cut: float
    points: int
    positives: int  # collapses among the runs with a value
    constant: bool  # the same value in every run (a flag that never fired): nothing to rank
    rho: Estimate
    rho_within: Estimate
    r2: float
    auc: Estimate
    rho_loso: HeldOut
    auc_loso: HeldOut


def _arrays(df: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    return (
        df["final"].to_numpy(dtype=float),
        df["start"].to_numpy(dtype=float),
        df["collapsed"].to_numpy(dtype=bool),
        df["sweep"].to_numpy(),
    )


def score(df: pd.DataFrame, d: Diagnostic, cut: float, reps: int = REPS, seed: int = 0) -> Score:
    x = feature(df, d, cut)
    y, start, pos, clusters = _arrays(df)
    ok = np.isfinite(x)
    points, positives = int(ok.sum()), int(pos[ok].sum())
    constant = points > 0 and bool(np.nanmin(x) == np.nanmax(x))
    if points < MIN_POINTS or constant:
        nan, none = Estimate(math.nan, math.nan, math.nan, 0), HeldOut(math.nan, 0, 0)
        return Score(d, cut, points, positives, constant, nan, nan, math.nan, nan, none, none)
    rho = lambda i: spearman(x[i], y[i])  # noqa: E731
    within = lambda i: spearman_within(x[i], y[i], clusters[i])  # noqa: E731
    auc = lambda i: auroc(x[i], pos[i])  # noqa: E731
    both = 0 < positives < points  # an AUROC needs collapsed and healthy runs; else skip its bootstrap
    return Score(
        d,
        cut,
        points,
        positives,
        constant,
        cluster_bootstrap(rho, clusters, reps, seed),
        cluster_bootstrap(within, clusters, reps, seed),
        added_r2(x, y, start),
        cluster_bootstrap(auc, clusters, reps, seed) if both else Estimate(math.nan, math.nan, math.nan, 0),
        leave_one_out(rho, rho, clusters, 0.0),
        leave_one_out(auc, auc, clusters, 0.5) if both else HeldOut(math.nan, 0, 0),
    )


def score_all(df: pd.DataFrame, cuts: tuple[float, ...] = CUTS, reps: int = REPS) -> list[Score]:
    return [score(df, d, cut, reps) for cut in cuts for d in DIAGNOSTICS]


def overview(df: pd.DataFrame) -> list[str]:
    """What the pooled runs are: sweeps, runs, collapses, the outcome's spread."""
    per = df.groupby("sweep", sort=False).agg(runs=("point", "size"), collapses=("collapsed", "sum"))
    parts = [f"{s} ({int(r.runs)} runs, {int(r.collapses)} collapsed)" for s, r in per.iterrows()]
    final = f"{df['final'].min():.3f} to {df['final'].max():.3f}"
    start = f"{df['start'].min():.3f} to {df['start'].max():.3f}"
    return [
        f"Runs: {len(df)} from {len(per)} sweep(s): {'; '.join(parts)}.",
        f"Collapses: {int(df['collapsed'].sum())} of {len(df)}. Final success: {final} (start {start}).",
    ]


HEADER = (
    "| diagnostic | read | runs | ρ with final [95% CI] | ρ within sweeps [95% CI] | ΔR² beside start "
    "| AUROC for collapse [95% CI] | LOSO ρ (agree) | LOSO AUROC (agree) |"
)


def table_lines(scores: list[Score]) -> list[str]:
    """The table, one row per diagnostic and cut, then one line naming the diagnostics logged in too few
    runs and those with the same value in every run (a flag that never fired): nothing to rank there.
    An AUROC without a collapse among the runs says 'no collapse'."""
    lines = [HEADER, "| --- | --- | ---: | --- | --- | ---: | --- | --- | --- |"]
    absent = [s.diagnostic.name for s in scores if s.points < MIN_POINTS]
    flat = [s.diagnostic.name for s in scores if s.points >= MIN_POINTS and s.constant]
    for s in scores:
        if s.points < MIN_POINTS or s.constant:
            continue
        read = f"{s.diagnostic.reduce} of first {s.cut:.0%}"
        r2 = f"{s.r2:+.2f}" if math.isfinite(s.r2) else "—"
        auc = s.auc.text() if s.positives else "no collapse"
        cells = [s.rho.text(), s.rho_within.text(), r2, auc, s.rho_loso.text(), s.auc_loso.text()]
        lines.append(f"| {s.diagnostic.name} | {read} | {s.points} | " + " | ".join(cells) + " |")
    if absent:
        lines += ["", f"Not logged in {MIN_POINTS} runs or more: {', '.join(absent)}."]
    if flat:
        lines += ["", f"The same value in every run (nothing to rank): {', '.join(flat)}."]
    return lines


# ----------------------------------------------------------------------------- claims
@dataclass(frozen=True)
class Claim:
    claim: str
    source: str
    evidence: str
    verdict: str
    scale: str


def _verdict(est: Estimate, defined: bool) -> str:
    if not defined or not (math.isfinite(est.low) and math.isfinite(est.high)):
        return UNDETERMINED
    if est.low > 0:
        return SUPPORTED
    if est.high <= 0:
        return CONTRADICTED
    return UNDETERMINED


def _by_name(name: str) -> Diagnostic:
    return next(d for d in DIAGNOSTICS if d.name == name)


def mi_claim(df: pd.DataFrame, scale: str, reps: int = REPS) -> Claim:
    """RAGEN-2: the MI proxy correlates with final success more strongly than entropy, |ρ_MI| - |ρ_H|,
    read over the first 25% of updates; where the MI is not logged that early, at its first reading
    (entropy averaged over the updates up to it)."""
    cut = CUTS[0]
    mi, ent = feature(df, _by_name("MI estimate"), cut), feature(df, _by_name("entropy"), cut)
    read = "first 25%"
    if (np.isfinite(mi) & np.isfinite(ent)).sum() < MIN_POINTS:
        mi, ent = df["mi_first"].to_numpy(dtype=float), df["entropy_to_mi"].to_numpy(dtype=float)
        at = df["mi_at"].dropna()
        read = f"MI at its first reading, update {at.min():.0f}-{at.max():.0f}" if len(at) else read
    y, _, _, clusters = _arrays(df)
    text = f"MI proxy predicts final success better than entropy (abs ρ_MI − abs ρ_entropy, {read})"
    both = np.isfinite(mi) & np.isfinite(ent)
    if both.sum() < MIN_POINTS:
        why = f"MI proxy logged in {int(both.sum())} of {len(df)} runs (train.mi_every: 0 turns it off)"
        return Claim(text, "RAGEN-2", why, UNDETERMINED, scale)
    stat = lambda i: abs(spearman(mi[i], y[i])) - abs(spearman(ent[i], y[i]))  # noqa: E731
    est = cluster_bootstrap(stat, clusters, reps)
    rhos = f"ρ_MI {spearman(mi, y):.2f}, ρ_entropy {spearman(ent, y):.2f}"
    return Claim(text, "RAGEN-2", f"{rhos}; difference {est.text()}", _verdict(est, True), scale)


def precedes_claim(df: pd.DataFrame, at: str, text: str, source: str, scale: str, reps: int = REPS) -> Claim:
    """A flag precedes collapse: hit rate (fired at or before the collapse onset, among collapses) minus
    false-alarm rate (fired at all, among the others), with the median lead time of the hits."""
    flag, onset = df[at].to_numpy(dtype=float), df["onset"].to_numpy(dtype=float)
    end = df["updates"].to_numpy(dtype=float)
    pos, clusters = df["collapsed"].to_numpy(dtype=bool), df["sweep"].to_numpy()
    when = np.where(np.isinf(onset), end, onset)
    hit = np.isfinite(flag) & (flag <= when)
    fired = np.isfinite(flag)

    def stat(i: np.ndarray) -> float:
        p, n = pos[i], ~pos[i]
        if p.sum() == 0 or n.sum() == 0:
            return math.nan
        return float(hit[i][p].mean() - fired[i][n].mean())

    n_pos, n_neg = int(pos.sum()), int((~pos).sum())
    rates = f"hits {int(hit[pos].sum())}/{n_pos}, false alarms {int(fired[~pos].sum())}/{n_neg}"
    rates += "" if fired.any() else " (it fired in no run)"
    if n_pos < 2 or n_neg < 2:
        return Claim(text, source, f"{rates}: too few collapses to test", UNDETERMINED, scale)
    lead = when[pos & hit] - flag[pos & hit]
    lead_text = f", median lead {np.median(lead):.0f} updates" if len(lead) else ""
    est = cluster_bootstrap(stat, clusters, reps)
    verdict = _verdict(est, True) if n_pos >= 3 else UNDETERMINED
    return Claim(text, source, f"{rates}{lead_text}; hit − false-alarm rate {est.text()}", verdict, scale)


def claims(df: pd.DataFrame, reps: int = REPS) -> list[Claim]:
    scale = scale_of(df)
    return [
        mi_claim(df, scale, reps),
        precedes_claim(df, "echo_at", "the echo-trap flag precedes collapse", "RAGEN", scale, reps),
        precedes_claim(df, "kl_spike_at", "KL spikes precede collapse", "ARLArena", scale, reps),
    ]


def scale_of(df: pd.DataFrame) -> str:
    return f"{len(df)} runs, {df['sweep'].nunique()} sweep(s), {int(df['collapsed'].sum())} collapses"


def claim_lines(found: list[Claim]) -> list[str]:
    lines = ["| claim | source | evidence | verdict | scale |", "| --- | --- | --- | --- | --- |"]
    return lines + [f"| {c.claim} | {c.source} | {c.evidence} | {c.verdict} | {c.scale} |" for c in found]


# ----------------------------------------------------------------------------- early stop
def stop_candidates(scores: list[Score]) -> list[Score]:
    """Diagnostics good enough out of sample to consider for a stop rule: held-out AUROC >= GOOD_AUROC
    in at least two folds, all of them agreeing, and the pooled interval clear of 0.5. Shipping one
    takes SHIP_FOLDS held-out sweeps (stop_lines says which candidates fall short)."""
    return [
        s
        for s in scores
        if s.auc_loso.folds >= 2
        and s.auc_loso.agree == s.auc_loso.folds
        and s.auc_loso.value >= GOOD_AUROC
        and (s.auc.low > 0.5 or s.auc.high < 0.5)  # either direction: leave-one-out orients it
    ]


def stop_check(df: pd.DataFrame, s: Score) -> str:
    """The rule 'stop when the diagnostic crosses t at the cut-off', t chosen on the other sweeps (the
    largest hit minus false-alarm rate, midway between two of their values; among ties the lowest, the
    most sensitive), applied to each held-out sweep: collapses caught, healthy runs
    stopped wrongly, and the updates saved (the rest of every stopped run) out of all updates."""
    x, pos, clusters = feature(df, s.diagnostic, s.cut), df["collapsed"].to_numpy(bool), df["sweep"].to_numpy()
    updates = df["updates"].to_numpy(float)
    caught = wrong = 0
    saved = 0.0
    for c in np.unique(clusters):
        train, test = clusters != c, clusters == c
        sign = 1.0 if auroc(x[train], pos[train]) >= 0.5 else -1.0
        values = np.unique(sign * x[train & np.isfinite(x)])
        cuts = (values[1:] + values[:-1]) / 2 if len(values) > 1 else values  # midway between neighbours
        best = max((np.mean(sign * x[train & pos] >= t) - np.mean(sign * x[train & ~pos] >= t), -t) for t in cuts)
        stop = test & np.isfinite(x) & (sign * x >= -best[1])
        caught += int((stop & pos).sum())
        wrong += int((stop & ~pos).sum())
        saved += float(((1 - s.cut) * updates)[stop].sum())
    return (
        f"`{s.diagnostic.key}` ({s.diagnostic.reduce} of the first {s.cut:.0%}): held out, it stops "
        f"{caught} of {int(pos.sum())} collapses and {wrong} of {int((~pos).sum())} healthy runs, saving "
        f"{saved / updates.sum():.0%} of all updates"
    )


def stop_lines(df: pd.DataFrame, scores: list[Score]) -> list[str]:
    found = stop_candidates(scores)
    if not found:
        return [
            "No early-stop rule: no diagnostic predicts a collapse out of sample (a held-out AUROC of at "
            f"least {GOOD_AUROC} in two or more left-out sweeps, every one agreeing, and a pooled interval "
            "clear of 0.5). `train.stop_on` is not offered; the echo-trap stop RAGEN uses stays available as "
            "`train.early_stop_on_collapse`, untested here."
        ]
    lines = ["Candidates for an early-stop rule, checked on held-out sweeps:", ""]
    for s in found:
        short = s.auc_loso.folds < SHIP_FOLDS
        why = f" (not enough: held out in {s.auc_loso.folds} sweeps with both outcomes, {SHIP_FOLDS} needed)"
        lines.append(f"- {stop_check(df, s)}{why if short else ''}")
    if all(s.auc_loso.folds < SHIP_FOLDS for s in found):
        lines += ["", "No candidate has been held out in enough sweeps: `train.stop_on` is not offered."]
    return lines
