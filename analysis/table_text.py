"""The words around a table: row keys, caption, the lines under it (MDE, warnings), notes and
provenance. Every text says what the numbers are: which split, how many tasks, greedy or
sampled, episodes per evaluation, how the intervals were computed."""

from __future__ import annotations

import math

import pandas as pd

from analysis.cells import axis_label, format_value, short_axis_names
from analysis.columns import DELTA, GAIN, MATCHED, START, Block, power
from analysis.stats import CONFIDENCE
from analysis.tasks import Scores, task_env, task_metric
from harness.store import FINISHED

FIELD_WORDS = {
    "success": "success rate",
    "return": "episode return",
    "turns": "turns per episode",
    "true_success": "true success rate (the outcome a probe's proxy reward stands for)",
    "exploit_rate": "exploit rate (episodes whose trace shows the probe's exploit)",
    "deadlock_rate": "deadlock rate (Sokoban episodes that end with a box on a dead cell)",
}
MIN_SEEDS_WARNING = 3


def _done(results: pd.DataFrame) -> pd.DataFrame:
    return results[results["status"].isin(FINISHED)]


def keys_and_header(results: pd.DataFrame, cells: list[str]) -> tuple[list[str], dict[str, list[str]]]:
    """Key columns: a `setting` column when the sweep named its cells, one column per axis, and a
    `config` column (the keys that differ from the sweep's base) when the folder mixes configs."""
    meta = results.attrs["sweep"]
    short = short_axis_names(meta.axes)
    first = {c: results[results["cell"] == c].iloc[0] for c in cells}
    suffix = {c: f" [{first[c]['group_label']}]" if first[c]["group_label"] else "" for c in cells}
    named = not meta.axes or any(first[c]["label"] != axis_label(first[c], meta.axes) + suffix[c] for c in cells)
    mixed = bool(meta.other_configs)
    header = (["setting"] if named else []) + [short[a] for a in meta.axes] + (["config"] if mixed else [])
    keys = {
        c: ([first[c]["label"].removesuffix(suffix[c])] if named else [])
        + [format_value(first[c][a]) for a in meta.axes]
        + ([first[c]["group_label"] or "sweep"] if mixed else [])
        for c in cells
    }
    return header, keys


def code_versions(done: pd.DataFrame) -> str:
    counts = done["code_version"].dropna().value_counts(sort=False)
    if counts.empty:
        return "unknown"
    return ", ".join(f"{v}" if len(counts) == 1 else f"{v} ({n} points)" for v, n in counts.items())


def _setting(results: pd.DataFrame, key: str) -> str | None:
    vals = pd.to_numeric(_done(results).get(key, pd.Series(dtype=float)), errors="coerce").dropna().unique()
    return None if not len(vals) else "/".join(f"{v:g}" for v in sorted(vals))


def _what(results: pd.DataFrame, scores: Scores | None, primary: str) -> str:
    """Which metric on which split, decoding, tasks and episodes per evaluation."""
    spec = task_metric(primary)
    if spec is None:
        return f"{primary} (the summary value of each point)"
    _, mode, fld = spec
    env = task_env(primary)
    where = f"held-out {FIELD_WORDS[fld]}{f' on {env}' if env else ''}, {mode} decoding"
    if scores is not None and scores.per_task:
        k = f"{scores.samples} samples" if scores.samples != 1 else "1 sample"
        episodes = scores.tasks * scores.samples
        return f"{where}, {scores.tasks} held-out tasks x {k} each ({episodes} episodes per evaluation)"
    tasks, episodes = _setting(results, "env.heldout_tasks"), _setting(results, "train.eval_episodes")
    budget = f", {episodes} episodes per evaluation" if episodes else ""
    return f"{where}{budget}" + (f" drawn from {tasks} held-out tasks" if tasks else "")


def _final_updates(results: pd.DataFrame, scores: Scores | None) -> str:
    done = _done(results)
    done = done[done["config_group"] == ""]
    if scores is not None and scores.per_task:
        ups = sorted({scores.updates(p)[-1] for p in done["point"] if scores.updates(p)})
    else:
        ups = sorted({int(v) for v in pd.to_numeric(done.get("train.updates"), errors="coerce").dropna()})
    if not ups:
        return "the last evaluation"
    return f"after update {ups[0]}" if len(ups) == 1 else f"after updates {ups[0]}-{ups[-1]}"


def caption(results, block: Block, scores: Scores | None, primary: str | None, statistic, interval, n_boot) -> str:
    meta = results.attrs["sweep"]
    stat = "Mean" if statistic == "mean" else "IQM (interquartile mean, rliable)"
    form = "± half-width (differences: [lo, hi])" if interval == "pm" else "[lo, hi]"
    parts = [f"Sweep {meta.name}."]
    if block.columns and primary:
        parts.append(f"Metric: {_what(results, scores, primary)}.")
        if START in block.columns:
            parts.append(
                f"start = before RL (update 0); final = {_final_updates(results, scores)}; gain = final - start."
            )
    boot = f"{CONFIDENCE:.0%} percentile bootstrap CI ({n_boot:,} resamples)"
    if scores is not None and scores.per_task and block.columns:
        parts.append(
            f"{stat} over seeds x tasks with a {boot} from a two-level bootstrap that resamples seeds "
            f"and tasks independently, shown as {form}; gain and Δ are paired by seed and task (common random numbers)."
        )
    else:
        why = f" {scores.note}" if block.columns and scores is not None and scores.note else ""
        parts.append(f"{why} {stat} over seeds with a {boot}, shown as {form}.".strip())
    if DELTA in block.columns:
        base = results.loc[results["is_baseline"], "label"]
        parts.append(
            f"Δ = final minus the final of the baseline ({base.iloc[0] if len(base) else '?'}) of the same config."
        )
    seeds = ", ".join(str(s) for s in meta.seeds) or "unknown"
    return " ".join(parts) + f" Seeds {seeds}. Code {code_versions(_done(results))}."


def summary_lines(results: pd.DataFrame, block: Block, scores: Scores | None, statistic: str) -> list[str]:
    """The minimum detectable effect and the few-seeds warning, printed right under the table."""
    meta = results.attrs["sweep"]
    done = _done(results)
    own = done[done["config_group"] == ""]
    n = len(meta.seeds) or int(own.groupby("cell")["point"].count().max() if len(own) else 0)
    m = next((d.shape[1] for d in block.diffs), next((g.shape[1] for g in block.gain_grids.values()), 1))
    lines = []
    if GAIN in block.columns or DELTA in block.columns:
        pw, source = power(block, n, m)
        per_task = scores is not None and scores.per_task
        design = f"{n} seeds x {m} tasks" if per_task else f"{n} seeds (seed-level values)"
        if pw is None:
            lines.append(f"Minimum detectable effect (80% power): not available for {design}: {source}.")
        else:
            q = f"t quantiles with {pw.df} df (the seed variance dominates)" if pw.df else "normal quantiles"
            c = {k: f"{math.sqrt(getattr(pw.components, k)):.3g}" for k in ("seed", "task", "residual")}
            mean_only = " The MDE is for the mean, not the IQM." if statistic != "mean" else ""
            lines.append(
                f"Minimum detectable effect (80% power, two-sided α = 0.05) for {design}: "
                f"{pw.mde:.3g} = {pw.multiplier:.2f} x SE {pw.se:.3g} ({q}); variance components from {source}: "
                f"σ_seed {c['seed']}, σ_task {c['task']}, σ_residual {c['residual']}." + mean_only
            )
    if n < MIN_SEEDS_WARNING:
        lines.append(
            f"Warning: {n} seed(s) per point; below {MIN_SEEDS_WARNING} seeds the seed variance is barely "
            f"estimated and the intervals are unreliable (run more with --seeds)."
        )
    return lines


def notes(
    results, block: Block, columns: list[str], requested, min_seeds: int, shown: str, seeds: list[str] = ()
) -> list[str]:
    """Footnotes for the marks actually shown, corrupt and diverged runs, and the definitions of the columns."""
    done = _done(results)
    meta = results.attrs["sweep"]
    out = []
    if "†" in shown:
        out.append("† fewer than the requested seeds (see the seeds column).")
    if "‡" in shown:
        tasks = " (tasks stay paired)" if block.tasks > 1 else ""
        seeds_differ = [c for c, p in block.paired.items() if not p and c not in block.other_tasks]
        if seeds_differ:
            out.append(f"‡ unpaired interval: the cell's seeds differ from the baseline's{tasks}.")
        if block.other_tasks:
            out.append(
                "‡ unpaired interval: the cell's held-out tasks are not the baseline's (another environment, "
                "options or split size), so nothing pairs: each side's seeds and tasks are resampled on their "
                "own, and Δ compares two task distributions, not one policy against another on the same tasks."
            )
    if "(n=" in shown:
        out.append(f"— (n=k): fewer than {min_seeds} seeds (--min-seeds); no estimate shown.")
    if any("corrupt" in text for text in seeds):
        out.append(
            "(k corrupt): seeds whose result files are damaged are not counted; `harness check` lists them "
            "and `harness sweep --retry-failed` runs them again."
        )
    diverged = done[done["status"] == "diverged"]
    if len(diverged):
        runs = ", ".join(f"{r['label']} seed {r['seed']}" for _, r in diverged.iterrows())
        out.append(f"Diverged runs count as results, with the metrics they had when stopped: {runs}.")
    if "collapsed_at" in columns:
        out.append(
            "collapse (update): mean update at which the collapse detector fired, over the runs "
            "that collapsed (collapsed/finished); never = no run collapsed."
        )
    if any(c in columns for c in ("episodes", "tokens", "wall")):
        out.append(
            "episodes, gen. tokens (generated, refills included) and wall (wall-clock time) are totals per run, mean "
            "over seeds; (×r) = r times the baseline of the same config, shown when r differs from 1 by more than 5%."
        )
    if MATCHED in columns:
        out.append(
            "Δ @ equal episodes: cell and baseline compared at the smaller of their two mean episode budgets, "
            "each seed's scores interpolated linearly between the evaluations around that budget (never "
            "extrapolated); shown where the budgets differ by more than 5%."
        )
    if meta.other_configs:
        out.append(
            "config: points of another base config found in this folder, named by the keys that differ from the "
            "sweep's base; they are never pooled with the sweep's points and their Δ is to the baseline of their "
            "own config. Differences: " + "; ".join(meta.other_configs) + "."
        )
    return out


def provenance(results: pd.DataFrame) -> list[str]:
    meta = results.attrs["sweep"]
    done = _done(results)
    lines = [
        f"sweep: {meta.name} ({meta.source}); axes: {', '.join(meta.axes) or 'none'}; "
        f"baseline: {', '.join(f'{k}={format_value(v)}' for k, v in meta.baseline.items()) or 'first point'}"
    ]
    if meta.raw.get("command"):
        lines.append(f"command: {meta.raw['command']}")
    hashes = []
    for label, g in done.groupby("label", sort=False):
        hs = [
            f"{h}" + ("" if pd.isna(s) else f" (seed {int(s)})")
            for h, s in zip(g["config_hash"].fillna("?"), g["seed"])
        ]
        hashes.append(f"{label}: {', '.join(hs)}")
    if hashes:
        lines.append("config hashes: " + "; ".join(hashes))
    lines.append(f"code versions: {code_versions(done)}")
    pkgs = done["packages"].dropna().unique()
    if len(pkgs) > 1:
        lines.append(f"package versions differ across points ({len(pkgs)} distinct sets)")
    cpus = done["cpu"].dropna().unique() if "cpu" in done else []
    if len(cpus) > 1:  # other kernels give other floating-point bits (docs/trainer.md, determinism)
        lines.append(f"points ran on {len(cpus)} different CPU code paths: their runs are not bit-comparable")
    return lines
