"""`harness diagnose` end to end: pool the runs, score them, print the text, draw the figure; and the
section "Which diagnostics to watch" of docs/results.md (analysis.results_doc), made the same way
from every sweep folder and records pack under the results root."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from analysis.diagnose import CUTS, FALL, MODES, Z_COLLAPSE, pooled_points, sweep_points  # noqa: E402
from analysis.diagnose_table import (  # noqa: E402
    MIN_POINTS,
    REPS,
    Claim,
    Score,
    claim_lines,
    claims,
    overview,
    score_all,
    stop_lines,
    table_lines,
)
from analysis.load import AnalysisError  # noqa: E402
from analysis.records import SUFFIX, sweep_name  # noqa: E402
from harness.store import is_sweep_dir  # noqa: E402

TITLE = "Which diagnostics to watch"
NOTES = "_diagnostics.md"
COLLAPSE_TEXT = (
    f"Collapse: the run diverged, or its final held-out success is below its start by at least {FALL:g} "
    f"and by more than noise (paired z ≤ −{Z_COLLAPSE:g} over the same held-out episodes)."
)


COLUMNS = (
    "Columns: ρ, Spearman's rank correlation of the diagnostic with the final held-out success over all "
    "runs; within sweeps, the same with ranks centred inside each sweep (differences between sweeps, such "
    "as the environment, left out); ΔR², what the standardised diagnostic adds to the R² of final ~ start; "
    "AUROC, the chance that a collapsed run reads higher than a healthy one (below 0.5: lower); intervals "
    "95%, from a bootstrap drawing sweeps, then runs inside them; LOSO, leave one sweep out: the held-out "
    "sweep's ρ or AUROC in the direction the other sweeps chose, averaged over the folds where both are "
    "defined (in brackets, the folds that agree with it)."
)


@dataclass
class Diagnosis:
    paths: list[str]
    mode: str
    runs: object  # the pooled points (pandas.DataFrame)
    scores: list[Score]
    claims: list[Claim]


def diagnose(paths: list[str | Path], mode: str = "sampled", reps: int = REPS) -> Diagnosis:
    df = pooled_points(paths, mode)
    return Diagnosis([str(p) for p in paths], mode, df, score_all(df, reps=reps), claims(df, reps))


def text_lines(dx: Diagnosis) -> list[str]:
    """Everything `harness diagnose` prints, as markdown."""
    lines = overview(dx.runs) + [f"Outcome: final held-out success, eval_{dx.mode}. {COLLAPSE_TEXT}", ""]
    lines += [COLUMNS, ""]
    for cut in CUTS:
        lines += [f"Read over the first {cut:.0%} of updates:", ""]
        lines += table_lines([s for s in dx.scores if s.cut == cut]) + [""]
    lines += claim_lines(dx.claims) + [""]
    return lines + stop_lines(dx.runs, [s for s in dx.scores if s.cut == CUTS[0]]) + [""]


# ----------------------------------------------------------------------------- figure
def figure(dx: Diagnosis) -> Figure:
    """ρ with the final success (left) and AUROC for a collapse (right), one line per diagnostic logged
    in enough runs, filled marker = first 25%, hollow = first 10%, bars = 95% clustered bootstrap."""
    names = [s.diagnostic.name for s in dx.scores if s.cut == CUTS[0] and s.points >= MIN_POINTS and not s.constant]
    fig, axes = plt.subplots(1, 2, figsize=(10, 0.32 * max(len(names), 4) + 1.4), sharey=True)
    for ax, field, centre, title in (
        (axes[0], "rho", 0.0, "Spearman ρ with final held-out success"),
        (axes[1], "auc", 0.5, "AUROC for a collapse"),
    ):
        ax.axvline(centre, color="#777777", lw=0.8)
        for k, cut in enumerate(CUTS):
            for i, name in enumerate(names):
                s = next(x for x in dx.scores if x.cut == cut and x.diagnostic.name == name)
                est = getattr(s, field)
                if not math.isfinite(est.value):
                    continue
                y = i + (0.18 if k else -0.18)
                if math.isfinite(est.low):
                    ax.plot([est.low, est.high], [y, y], color="#0072B2" if k == 0 else "#E69F00", lw=1.2)
                face = "#0072B2" if k == 0 else "white"
                ax.plot(est.value, y, "o", color="#0072B2" if k == 0 else "#E69F00", mfc=face, ms=5)
        ax.set_title(title, fontsize=10)
        if field == "auc" and not any(
            math.isfinite(s.auc.value) for s in dx.scores if s.diagnostic.name in names
        ):  # an empty panel would read as a plotting fault
            n = len(dx.runs)
            why = f"no run of the {n} collapsed:\nno AUROC to draw" if n else "no runs"
            ax.text(
                0.5,
                0.5,
                why,
                transform=ax.transAxes,
                ha="center",
                va="center",
                fontsize=9,
                color="#555555",
                bbox={"facecolor": "white", "edgecolor": "none"},
            )
        ax.set_xlim(-1.05, 1.05) if field == "rho" else ax.set_xlim(-0.02, 1.02)
        ax.grid(axis="x", alpha=0.3)
    axes[0].set_yticks(range(len(names)), names, fontsize=8)
    axes[0].invert_yaxis()
    handles = [
        plt.Line2D([], [], marker="o", color="#0072B2", label="first 25% of updates"),
        plt.Line2D([], [], marker="o", color="#E69F00", mfc="white", label="first 10%"),
    ]
    fig.legend(handles=handles, loc="lower center", ncol=2, fontsize=8, frameon=False)
    where = f"{len(dx.runs)} runs, {dx.runs['sweep'].nunique()} sweep(s), outcome eval_{dx.mode}"
    fig.suptitle(f"{where}; 95% CI of a bootstrap clustered by sweep", fontsize=10)
    fig.tight_layout(rect=(0, 0.05, 1, 0.96))
    return fig


def save_figure(dx: Diagnosis, out: str | Path) -> Path:
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig = figure(dx)
    fig.savefig(out, dpi=120, metadata={"Software": None})
    plt.close(fig)
    return out


# ----------------------------------------------------------------------------- the page's section
def records_under(root: Path) -> list[Path]:
    """Every sweep folder and records pack directly under a results root (a pack whose folder is also
    there is left out: the folder is the live copy), sorted by sweep name."""
    found = sorted(root.iterdir()) if root.is_dir() else []
    folders = [p for p in found if p.is_dir() and not p.name.startswith(".") and is_sweep_dir(p)]
    names = {p.name for p in folders}
    packs = [p for p in sorted(root.glob(f"*{SUFFIX}")) if sweep_name(p) not in names]
    return sorted(folders + packs, key=sweep_name)


def section(root: Path, out: Path, figures: Path, notes: Path, shown) -> list[str]:
    """The lines of the section: for each outcome (sampled, then greedy decoding) the command, the
    table at both cut-offs, the claims, the stop rule and the figure; then the hand-written notes
    (notes/_diagnostics.md) verbatim."""
    lines = [f"## {TITLE}", ""]
    paths = [p for p in records_under(root) if _has_runs(p)]
    if not paths:
        return lines + [f"No results under `{shown(root)}` to test the diagnostics on.", ""]
    lines += ["Each run counts once, read over its first 25% and 10% of updates. " + COLLAPSE_TEXT, ""]
    for mode in MODES:
        command = f"harness diagnose {' '.join(shown(p) for p in paths)} --outcome {mode}"
        lines += [f"### Outcome: held-out success, {mode} decoding", "", f"- Command: `{command}`", ""]
        try:
            dx = diagnose(paths, mode)
        except AnalysisError as e:
            message = str(e)
            for path in paths:  # the page names no folder of the machine that built it
                message = message.replace(str(path), shown(path))
            lines += [f"Nothing to score: {message}", ""]
            continue
        png = save_figure(dx, figures / "diagnose" / f"which_diagnostics_{mode}.png")
        body = text_lines(dx)
        lines += body[:2] + body[3:]  # the outcome line is the bullet above
        lines += [f"![{TITLE}, {mode}]({Path(os.path.relpath(png, out.parent)).as_posix()})", ""]
    note = notes / NOTES
    if note.is_file():
        lines += ["### What this says", "", note.read_text(encoding="utf-8").strip(), ""]
    return lines


def _has_runs(path: Path) -> bool:
    """A folder or pack that holds finished runs with diagnostics (others are skipped on the page)."""
    try:
        sweep_points(path)
    except AnalysisError:
        return False
    return True
