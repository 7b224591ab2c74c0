"""The A/A calibration (analysis.calibration) as text: `harness calibrate` prints it, docs/results.md
puts it in the A/A sweep's section and quotes its headline in the findings."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from analysis.calibration import KINDS, P_LEVELS, SEED_COUNTS, Calibration, Chaos, Draws, Rate, calibrate
from analysis.intervals import FAMILY_ALPHA
from analysis.load import AnalysisError

FINDING_PREFIX = "**A/A calibration of this harness.**"
P_INTRO = (
    "A finer check of the same draws, which a rare event cannot give: under the null a calibrated test's p-values "
    "are uniform, so the share of contrasts (tested alone, degenerate ones left out) with p below each level "
    "should be that level:"
)
KINDS_INTRO = (
    "The same draws, contrasts on the baseline's own seeds (paired by seed and task, as the table pairs them) "
    "apart from contrasts of arms on other seeds (unpaired by seed):"
)  # results_doc reads a kept finding back by it

COLUMNS = (
    ("family", "false better/worse, any contrast of the sweep"),
    ("contrast", "false better/worse, per contrast (Holm)"),
    ("single", "per contrast tested alone (α 0.05)"),
    ("equivalent", "equivalent (correct here)"),
    ("undetermined", "undetermined"),
)


def _cell(rates: dict[str, Rate], key: str) -> str:
    return rates[key].text() if key in rates and math.isfinite(rates[key].value) else "—"


def rates_table(cal: Calibration) -> list[str]:
    """One row per pseudo-sweep design: the share of draws (or contrasts) with each verdict."""
    contrasts = len(cal.runs.arms) - 1
    head = ["pseudo-sweeps", "draws", *(name for _, name in COLUMNS)]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    rows = list(cal.fixed) + ([cal.sequential] if cal.sequential else [])
    for d, r in rows:
        label = f"{d.label}, {contrasts} contrasts"
        if math.isfinite(d.seeds_used):
            label += f" (mean {d.seeds_used:.1f} seeds a contrast)"
        lines.append(f"| {label} | {len(d.members)} | " + " | ".join(_cell(r, k) for k, _ in COLUMNS) + " |")
    return lines


def _quantiles(x: np.ndarray) -> str:
    if x.size == 0:
        return "—"
    q = np.quantile(x, [0.5, 0.9])
    return f"{q[0]:.3f} / {q[1]:.3f} / {x.max():.3f}"


def _diverged(updates: list[int | None]) -> str:
    """'18 / 27 / 30 (2 never)': median / min / max of the first differing update, and runs that never differ."""
    seen = [u for u in updates if u is not None]
    never = len(updates) - len(seen)
    if not seen:
        return f"never ({never} runs)" if never else "—"
    text = f"{np.median(seen):g} / {min(seen)} / {max(seen)}"
    return text + (f" ({never} never)" if never else "")


def chaos_table(ch: Chaos, labels: dict[str, str]) -> list[str]:
    """Per arm: |Δ| to the baseline of the task-mean score at each evaluated update (median / 90th
    percentile / max over seed indices), the correlation of the finals and, for an arm on the
    baseline's seeds, the first update whose training rollouts differ (median / min / max)."""
    updates = sorted({u for g in ch.gaps.values() for u in g})
    head = ["arm", "seeds", *(f"\\|Δ\\| at update {u}" for u in updates), "r (final)", "rollouts differ from update"]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for arm, by_update in ch.gaps.items():
        kind = "same train.seed" if ch.same_seed[arm] else "other seeds"
        n = max((len(v) for v in by_update.values()), default=0)
        cells = [_quantiles(by_update.get(u, np.array([]))) for u in updates]
        r = f"{ch.corr[arm]:.2f}" if math.isfinite(ch.corr[arm]) else "—"
        split = _diverged(ch.diverged[arm]) if arm in ch.diverged else "— (independent runs)"
        lines.append(f"| {labels.get(arm, arm)} ({kind}) | {n} | " + " | ".join(cells) + f" | {r} | {split} |")
    return lines


def p_table(cal: Calibration) -> list[str]:
    """The share of (non-degenerate) null contrasts whose unadjusted p-value falls below each level:
    for a calibrated test each share equals its level (uniform p-values, Kohavi, Tang & Xu 2020)."""
    head = ["pseudo-sweeps", *(f"p < {a:g}" for a in P_LEVELS)]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for d, r in cal.fixed:
        lines.append(f"| {d.label} | " + " | ".join(_cell(r, f"p<{a:g}") for a in P_LEVELS) + " |")
    return lines


def kinds_table(cal: Calibration) -> list[str]:
    """The fixed-n rates apart for contrasts paired by seed (two arms on the same train.seeds) and
    unpaired (a copy on other seeds): each tested alone, and equivalent within the sweep's family."""
    head = ["pseudo-sweeps", *(f"{w}, {k}" for k in KINDS for w in ("false better/worse alone", "equivalent"))]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for d, r in cal.fixed:
        cells = [_cell(r, f"{w}_{k}") for k in KINDS for w in ("single", "equivalent")]
        lines.append(f"| {d.label} | " + " | ".join(cells) + " |")
    return lines


def _rate_at(cal: Calibration, key: str) -> list[tuple[Draws, Rate]]:
    return [(d, r[key]) for d, r in cal.fixed if key in r]


def markdown(cal: Calibration, labels: dict[str, str] | None = None) -> list[str]:
    """The calibration section: what was drawn, the rates table, the chaos table, in words."""
    labels = labels or {}
    runs, ch = cal.runs, cal.chaos
    arms = ", ".join(f"`{labels.get(a, a)}`" for a in runs.arms)
    lines = [
        f"A/A calibration (`harness calibrate`, analysis/calibration.py): {len(runs.arms)} arms ({arms}) that "
        f"differ in nothing that changes the mathematics, {len(runs.index)} seed indices finished by every arm, "
        f"metric `{runs.metric}`. Every contrast between them is null, so every better / worse verdict is false. "
        f"Pseudo-sweeps draw k of the seed indices (the same for every arm) and one arm as the baseline at "
        f"random, and go through the table's own interval and verdict code ({cal.draws} draws per k, numpy "
        f"seed {cal.seed}). Intervals: 95% Wilson at the effective number of draws that a delete-one-seed "
        "jackknife over the runs gives, never fewer than n / k (the worst case a U-statistic allows, which a rate "
        "no draw shows gets): pseudo-sweeps reuse the same runs, and the interval covers which seeds were run, not "
        "other configs or machines. The nominal rate of a false better/worse is at most "
        f"{FAMILY_ALPHA:g} for a sweep (Holm over its contrasts) and {FAMILY_ALPHA:g} for a contrast tested alone.",
        "",
    ]
    if not cal.fixed:
        lines += [f"No pseudo-sweep yet: fewer than {min(SEED_COUNTS)} seeds finished by every arm.", ""]
    else:
        lines += [*rates_table(cal), "", KINDS_INTRO, "", *kinds_table(cal), "", P_INTRO, "", *p_table(cal), ""]
    if cal.sequential:
        d, r = cal.sequential
        lines += [
            f"Re-reading the fixed-n table at every look of the same draws ({d.label.split('(')[1].rstrip(')')}) "
            f"and stopping a contrast at its first better / worse, the misuse the seed budget replaces: "
            f"{r['naive'].text()} of contrasts, {r['naive_family'].text()} of sweeps.",
            "",
        ]
    lo, hi = ch.sigma_ci
    lines += [
        f"Spread that float rounding alone induces. Across independent seeds the baseline's final "
        f"`{runs.metric}` has SD {ch.sigma_seed:.3f} [{lo:.3f}, {hi:.3f}] ({ch.seeds} seeds). Between runs of "
        "the same train.seed whose updates are mathematically identical (same seed, same math, other rounding), "
        "|Δ| of the task-mean score to the baseline, median / 90th percentile / max over seeds:",
        "",
        *chaos_table(ch, labels),
        "",
    ]
    starts = [g[0] for g in ch.gaps.values() if 0 in g]
    if starts and not any(x.any() for x in starts):
        lines += [
            "Every |Δ| is 0 at update 0, whatever the seed: every run starts from the same policy (a fresh LoRA "
            "adapter leaves the base model unchanged) and is evaluated on the same sampling streams. Two runs of one "
            "seed then sample the same episodes until a rounding difference flips a sampled token.",
            "",
        ]
    return lines


def finding(cal: Calibration, sweep: str = "aa_calibration") -> str:
    """The findings section's sentence: the measured false-verdict rates with their intervals."""
    if not cal.fixed:
        return (
            f"{FINDING_PREFIX} [{sweep}](#{sweep}) has {len(cal.runs.index)} seeds finished by every arm, too few for "
            f"pseudo-sweeps of {min(SEED_COUNTS)} seeds: no measured rate yet."
        )
    fam = "; ".join(f"{r.text()} at {d.label}" for d, r in _rate_at(cal, "family"))
    single = "; ".join(f"{r.text()} at {d.label}" for d, r in _rate_at(cal, "single"))
    half = "; ".join(f"{r.text()} at {d.label}" for d, r in _rate_at(cal, "p<0.5"))
    seq = ""
    if cal.sequential:
        d, r = cal.sequential
        seq = f"; under the seed budget's looks {r['family'].text()} of sweeps"
        seq += f" (re-reading the fixed-n table at each look: {r['naive_family'].text()})"
    same = [g[max(g)] for a, g in cal.chaos.gaps.items() if cal.chaos.same_seed[a] and g]
    drift = ""
    if same:
        gaps = np.concatenate(same)
        drift = (
            f" Float rounding alone moves a seed's final by a median |Δ| of {np.median(gaps):.3f} (max "
            f"{gaps.max():.3f}), against an SD of {cal.chaos.sigma_seed:.3f} across seeds."
        )
    return (
        f"{FINDING_PREFIX} On [{sweep}](#{sweep}), {len(cal.runs.arms)} arms of one config ({len(cal.runs.index)} "
        f"seeds each) whose contrasts are all null, pseudo-sweeps of {len(cal.runs.arms) - 1} contrasts got a false "
        f"better / worse in {fam} (nominal ≤ {FAMILY_ALPHA:g}, 95% intervals over the runs){seq}; a contrast tested "
        f"alone: {single}; its p-value below 0.5 in {half} (uniform, i.e. calibrated: 50%).{drift}"
    )


PAGE_DRAWS = 2000  # pseudo-sweeps per seed count on docs/results.md (a quarter as many sequential ones)


def page_lines(folder: Path) -> list[str]:
    """The A/A sweep's calibration for its section of docs/results.md, ending with the findings
    sentence (results_doc quotes the line that starts with FINDING_PREFIX in the findings)."""
    try:
        cal = calibrate(folder, draws=PAGE_DRAWS)
    except AnalysisError as e:
        return [f"No A/A calibration: {e}", ""]
    return markdown(cal) + [finding(cal, Path(folder).name), ""]
