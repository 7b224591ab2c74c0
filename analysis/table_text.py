"""The words around a table: row keys, caption, the lines under it (MDE, warnings), notes and
provenance. Every text says what the numbers are: which split, how many tasks, greedy or
sampled, episodes per evaluation, how the intervals were computed."""

from __future__ import annotations

import json
import math

import pandas as pd

from analysis.cells import axis_label, format_value, short_axis_names
from analysis.columns import DELTA, GAIN, MATCHED, START, Block, power
from analysis.intervals import DEFAULT_MARGIN, sig2
from analysis.load import AnalysisError
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
MARGIN_KEY = "equivalence_margin"
DEFINITIONS = {  # the column definitions a page states once (its legend) and a table on its own in its notes
    "collapsed_at": "collapse (update): the update at which the collapse detector fired, one per run that "
    "collapsed, in order (collapsed/finished); never = no run collapsed.",
    "cost": "episodes, gen. tokens (generated, refills included) and wall (wall-clock time of the RL updates and "
    "the evaluations between them; set-up, the evaluation before RL and the last one are not counted) are "
    "totals per run, mean over seeds; (×r) = r times the baseline of the same config, shown when r differs "
    "from 1 by more than 5%.",
    "Δ@": "Δ @ equal episodes: cell and baseline compared at the smaller of their two mean episode budgets, "
    "each seed's scores interpolated linearly between the evaluations around that budget (never "
    "extrapolated); shown where the budgets differ by more than 5%.",
    "degenerate": "(degenerate): every seed (and task) gave the same value, so the spread is 0 and no interval "
    "can be estimated: the number is not a result.",
    "mde": "Minimum detectable effect: the true Δ these seeds and tasks would detect with 80% power, from the "
    "same model as the intervals; a planning quantity, not a threshold: the verdict column says what each Δ shows.",
}


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
    if len(counts) == 1:
        return str(counts.index[0])
    return ", ".join(f"{v} ({n} point{'s' if n != 1 else ''})" for v, n in counts.items())


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
        col = done.get("train.updates", pd.Series(dtype=float))  # absent: no updates known
        ups = sorted({int(v) for v in pd.to_numeric(col, errors="coerce").dropna()})
    if not ups:
        return "the last evaluation"
    return f"after update {ups[0]}" if len(ups) == 1 else f"after updates {ups[0]}-{ups[-1]}"


def margin_of(raw: dict, where: str) -> float:
    """The sweep's equivalence margin (`equivalence_margin` of its sweep file, in sweep.json), else
    DEFAULT_MARGIN; a value that is not a positive number is an error naming where it is."""
    v = (raw or {}).get(MARGIN_KEY)
    if v is None:
        return DEFAULT_MARGIN
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < math.inf:
        raise AnalysisError(
            f"{where}: {MARGIN_KEY} = {v!r} is not a valid margin; it must be a positive number in the units "
            f"of the sweep's metric (below 1 for a rate), e.g. {DEFAULT_MARGIN}, or left out for {DEFAULT_MARGIN}."
        )
    return float(v)


def _interval_words(per_task: bool, interval: str) -> str:
    form = "± half-width (differences: [lo, hi])" if interval == "pm" else "[lo, hi]"
    if per_task:
        return (
            "Mean over seeds x tasks with a 95% t interval from the two-way model of seeds and tasks "
            "(SE from the seed means plus the task term; t with seeds - 1 df while the seed means dominate, else "
            f"Satterthwaite's df), shown as {form}; gain and Δ are the intervals of the per-seed, per-task "
            "differences (paired by seed and task)."
        )
    return f"Mean over seeds with a 95% t interval (seeds - 1 df), shown as {form}."


def _verdict_words(margin: float | None) -> str:
    within = f"±{margin:g}" if margin is not None else "± the sweep's equivalence_margin (default 0.05)"
    return (
        "verdict: better / worse when the contrast's two-sided p-value survives Holm's correction across the "
        f"table's contrasts (family-wise α = 0.05); equivalent when its 90% interval lies inside {within} (two "
        "one-sided tests); undetermined otherwise; degenerate when the contrast has no spread across seeds and "
        "tasks (no test possible); higher / lower for a metric without a better direction (turns) and for a Δ "
        "against a baseline on other held-out tasks (‡: two task distributions, not two methods). The contrasts "
        "are the Δ vs baseline, or the gains in a table without Δ."
    )


def short_caption(results, block: Block, scores: Scores | None, primary: str | None) -> str:
    """What this table is: the sweep, the metric, the final update, the baseline, seeds, code."""
    meta = results.attrs["sweep"]
    parts = [f"Sweep {meta.name}"]
    if block.columns and primary:
        parts.append(_what(results, scores, primary))
        if START in block.columns:
            parts.append(f"final = {_final_updates(results, scores)}")
    if block.columns and scores is not None and not scores.per_task and scores.note:
        parts.append(scores.note[0].lower() + scores.note[1:].rstrip("."))
    if DELTA in block.columns:
        base = results.loc[results["is_baseline"], "label"]
        parts.append(f"baseline {base.iloc[0] if len(base) else '?'}")
    parts.append(f"seeds {', '.join(str(s) for s in meta.seeds) or 'unknown'}")
    return "; ".join(parts) + f"; code {code_versions(_done(results))}."


def caption(results, block: Block, scores: Scores | None, primary: str | None, interval: str, margin: float) -> str:
    """The short caption, then what its columns and intervals are (a table on its own)."""
    per_task = scores is not None and scores.per_task and bool(block.columns)
    parts = [short_caption(results, block, scores, primary)]
    if START in block.columns:
        parts.append("start = before RL (update 0); gain = final - start.")
    if DELTA in block.columns:
        parts.append("Δ = final minus the final of the baseline of the same config.")
    parts.append(_interval_words(per_task, interval))
    if block.verdicts:
        words = _verdict_words(margin)
        parts.append(words[0].upper() + words[1:])
    return " ".join(parts)


def legend(interval: str = "pm") -> list[str]:
    """The definitions every table of a page shares (docs/results.md states them once); a table on
    its own has them in its caption and notes."""
    alone = _interval_words(False, interval)
    out = [_interval_words(True, interval) + " Without per-task results: " + alone[0].lower() + alone[1:]]
    out.append(_verdict_words(None)[0].upper() + _verdict_words(None)[1:])
    return out + list(DEFINITIONS.values())


def summary_lines(results: pd.DataFrame, block: Block, scores: Scores | None) -> list[str]:
    """The minimum detectable effect and the few-seeds warning, printed right under the table."""
    meta = results.attrs["sweep"]
    done = _done(results)
    own = done[done["config_group"] == ""]
    n = len(meta.seeds) or int(own.groupby("cell")["point"].count().max() if len(own) else 0)
    lines = []
    if GAIN in block.columns or DELTA in block.columns:
        design, source = power(block)
        per_task = scores is not None and scores.per_task
        if design is None:
            m = block.tasks if per_task else 1
            what = f"{n} seeds x {m} tasks" if per_task else f"{n} seeds (seed-level values)"
            lines.append(f"Minimum detectable effect (80% power): not available for {what}: {source}.")
        else:
            what = f"{design.n} seeds x {design.m} tasks" if per_task else f"{design.n} seeds (seed-level values)"
            iv = design.interval()
            sd = ", ".join(f"σ_{k} {sig2(v)}" for k, v in zip(("seed", "task", "residual"), design.sigmas()))
            if iv.degenerate:
                lines.append(
                    f"Minimum detectable effect (80% power) for {what}: degenerate: {source} have no spread across "
                    "seeds and tasks, so no power can be computed (not a result)."
                )
            else:
                mult = iv.mde80() / iv.se
                lines.append(
                    f"Minimum detectable effect (80% power, two-sided α = 0.05) for {what}: {sig2(iv.mde80())} = "
                    f"{mult:.2f} x SE {sig2(iv.se)} (t, {iv.df:.2g} df); {sd}, from the mean squares of {source}."
                )
    if n < MIN_SEEDS_WARNING:
        lines.append(
            f"Warning: {n} seed(s) per point; below {MIN_SEEDS_WARNING} seeds the seed variance is barely "
            f"estimated and the intervals are unreliable (run more with --seeds)."
        )
    return lines


def _kernel_path(cpu: str) -> str:
    """'AVX512, mkl on AMD EPYC 9654' from a point's recorded CPU code path (JSON)."""
    try:
        d = json.loads(cpu)
    except ValueError:
        return cpu
    pins = [f"{k}={d[k]}" for k in ("MKL_CBWR", "ATEN_CPU_CAPABILITY") if d.get(k)]
    text = ", ".join(str(d[k]) for k in ("torch_kernels", "blas") if d.get(k)) or "unknown kernels"
    return text + (f" ({', '.join(pins)})" if pins else "") + (f" on {d['model']}" if d.get("model") else "")


def warnings(results: pd.DataFrame) -> list[str]:
    """One line when the finished points come from more than one CPU kernel path (provenance's
    cpu record): their floating-point bits differ, so the machine is a source of variance."""
    done = _done(results)
    if "cpu" not in done:
        return []
    counts = done["cpu"].dropna().value_counts(sort=False)
    if len(counts) < 2:
        return []
    groups = "; ".join(f"{_kernel_path(c)}: {k} point{'s' if k > 1 else ''}" for c, k in counts.items())
    return [
        f"Warning: this table pools runs from {len(counts)} CPU kernel paths ({groups}); runs on different "
        "paths are not bit-comparable, so the differences between them include the machine."
    ]


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
                "options or split size), so nothing pairs: the two grids' variances add, and Δ compares two "
                "task distributions, not one policy against another on the same tasks."
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
    if "(degenerate)" in shown:
        out.append(DEFINITIONS["degenerate"])
    if GAIN in columns or DELTA in columns:
        out.append(DEFINITIONS["mde"])
    if "collapsed_at" in columns:
        out.append(DEFINITIONS["collapsed_at"])
    if any(c in columns for c in ("episodes", "tokens", "wall")):
        out.append(DEFINITIONS["cost"])
    if MATCHED in columns:
        out.append(DEFINITIONS["Δ@"])
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
