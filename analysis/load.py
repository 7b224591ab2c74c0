"""Read a results folder into pandas: one row per point (`load_results`) and long-format learning
curves (`load_curves`).

Tolerant by design: a point with a missing or unreadable file is a row with status `missing`,
`running` or `partial` and a `problems` note, never an exception. Only a path that is not a
results folder at all raises `AnalysisError` (one paragraph, for the CLI to print).

Layout read (written by the runner):
    <sweep>/sweep.json                  name, axes, baseline, seeds, points (may be absent)
    <sweep>/<point>/config.yaml         resolved RunConfig (nested)
    <sweep>/<point>/metrics.jsonl       one JSON row per update; update 0 = evaluation before RL
    <sweep>/<point>/summary.json        status, metrics, config_hash, code_version, packages
    <sweep>/<point>/status              one word
    <sweep>/<point>/eval_tasks.jsonl    one row per evaluated episode (analysis.tasks; may be absent)

Points of another base config in the same folder form their own config group (analysis.configs):
`config_group` names the keys that differ, and cells, labels and baselines never mix groups.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from analysis.cells import add_cells, format_value, short_axis_names  # noqa: F401 (re-exported)
from analysis.configs import config_groups, diff_text
from analysis.errors import AnalysisError  # noqa: F401 (re-exported: callers import it from here)
from harness.store import (
    CONFIG,
    CORRUPT,
    METRICS,
    OPTUNA_DB,
    POINT_FILES,
    SUMMARY,
    SWEEP_MANIFEST,
    point_problems,
    read_status,
)

SEED_KEY = "train.seed"
COST_KEYS = ("cost/episodes", "cost/generated_tokens", "cost/wall_s")


@dataclass
class SweepMeta:
    """What the sweep asked for. `source` is 'sweep.json' or 'inferred' (no/unreadable sweep.json)."""

    name: str
    axes: list[str]
    baseline: dict[str, Any]
    seeds: list[int]
    points: list[dict[str, Any]]
    source: str = SWEEP_MANIFEST
    problems: list[str] = field(default_factory=list)
    raw: dict[str, Any] = field(default_factory=dict)  # sweep.json as read (command, base_config, ...)
    other_configs: list[str] = field(default_factory=list)  # differing keys of each other config group

    def __deepcopy__(self, memo: dict) -> SweepMeta:
        # pandas deep-copies DataFrame.attrs on every slice; this metadata is shared, not copied.
        return self


# ----------------------------------------------------------------------------- small readers
def flatten(d: Any, prefix: str = "") -> dict[str, Any]:
    """{'a': {'b': 1}} -> {'a.b': 1}; lists and scalars are leaves."""
    if not isinstance(d, dict):
        return {prefix: d} if prefix else {}
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}.{k}" if prefix else str(k)
        if isinstance(v, dict) and v:
            out.update(flatten(v, key))
        else:
            out[key] = v
    return out


def _read_json(p: Path, problems: list[str]) -> Any:
    if not p.is_file():
        return None
    try:
        return json.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        problems.append(f"{p.name} unreadable ({type(e).__name__})")
        return None


def _read_yaml(p: Path, problems: list[str]) -> Any:
    if not p.is_file():
        return None
    try:
        return yaml.safe_load(p.read_text(encoding="utf-8"))
    except (OSError, ValueError, yaml.YAMLError) as e:
        problems.append(f"{p.name} unreadable ({type(e).__name__})")
        return None


def read_metrics_rows(p: Path) -> list[dict[str, Any]]:
    """Rows of metrics.jsonl; a torn last line (run still writing) or a bad line is skipped."""
    rows = []
    try:
        text = p.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return rows
    for line in text.splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict):
            rows.append(row)
    return rows


def code_version_str(cv: Any) -> str | None:
    """summary code_version (a string, or harness.experiments.provenance's {commit, dirty, diff_sha}
    dict) -> short text."""
    if cv is None:
        return None
    if isinstance(cv, dict):
        commit = cv.get("commit")
        text = str(commit)[:7] if commit else f"v{cv.get('version', '?')}"
        if cv.get("dirty"):
            text += f"+dirty.{cv.get('diff_sha') or '?'}"
        return text
    s = str(cv)
    is_hex = len(s) == 40 and all(c in "0123456789abcdef" for c in s.lower())
    return s[:7] if is_hex else s


# ----------------------------------------------------------------------------- sweep metadata
def _point_dirs(root: Path) -> list[str]:
    return sorted(
        p.name
        for p in root.iterdir()
        if p.is_dir() and not p.name.startswith(".") and any((p / f).exists() for f in POINT_FILES)
    )


def _infer_axes(configs: dict[str, dict[str, Any]]) -> list[str]:
    """Config keys whose values differ across points, other than the seed (sorted)."""
    keys = sorted({k for c in configs.values() for k in c})
    axes = []
    for k in keys:
        if k == SEED_KEY:
            continue
        if len({format_value(c.get(k, "<absent>")) for c in configs.values()}) > 1:
            axes.append(k)
    return axes


def read_sweep_meta(root: Path, configs: dict[str, dict[str, Any]]) -> SweepMeta:
    problems: list[str] = []
    raw = _read_json(root / SWEEP_MANIFEST, problems)
    dirs = _point_dirs(root)
    if isinstance(raw, dict):
        points = [p for p in raw.get("points") or [] if isinstance(p, dict) and "id" in p]
        axes = list(raw.get("axes") or [])
        seeds = sorted({int(s) for s in raw.get("seeds") or []})
        baseline = dict(raw.get("baseline") or {})
        if not axes and configs:
            axes = _infer_axes(configs)
        meta = SweepMeta(
            str(raw.get("name") or root.name), axes, baseline, seeds, points, SWEEP_MANIFEST, problems, raw
        )
    else:
        if raw is None and not problems and (root / OPTUNA_DB).exists():
            problems.append(
                f"an Optuna study without {SWEEP_MANIFEST}: the baseline is the first point by name, "
                f"{dirs[0] if dirs else '(none)'}; `harness tune FILE --show` writes "
                f"{SWEEP_MANIFEST} with the best trial as the baseline"
            )
        elif raw is None and not problems:
            problems.append(f"no {SWEEP_MANIFEST}: axes inferred from the configs, baseline = first point")
        points = [{"id": d, "label": None, "overrides": {}} for d in dirs]
        axes = _infer_axes(configs)
        seeds = sorted({int(c[SEED_KEY]) for c in configs.values() if isinstance(c.get(SEED_KEY), int)})
        first = configs.get(dirs[0], {}) if dirs else {}
        baseline = {a: first.get(a) for a in axes}
        meta = SweepMeta(root.name, axes, baseline, seeds, points, "inferred", problems)
    known = {p["id"] for p in meta.points}
    meta.points += [{"id": d, "label": None, "overrides": {}} for d in dirs if d not in known]
    return meta


# ----------------------------------------------------------------------------- one point
def _status(pdir: Path, summary: dict | None, has_metrics: bool) -> str:
    word, damaged = read_status(pdir)
    if damaged:
        return CORRUPT
    if word:
        return word
    if summary and summary.get("status"):
        return str(summary["status"]).lower()
    if has_metrics:
        return "running"
    return "missing" if not pdir.exists() else "partial"


def _cost(row: dict[str, Any], summary: dict[str, Any]) -> None:
    """cost/episodes, cost/generated_tokens, cost/wall_s from the summary's metrics or top level;
    the wall time falls back to the runner's timings (the point's last attempt)."""
    for key in COST_KEYS:
        if not isinstance(row.get(key), (int, float)) and isinstance(summary.get(key), (int, float)):
            row[key] = summary[key]
    wall = (summary.get("timings") or {}).get("wall_s")
    if not isinstance(row.get("cost/wall_s"), (int, float)) and isinstance(wall, (int, float)):
        row["cost/wall_s"] = float(wall)


def _point_row(root: Path, point: dict[str, Any], config: dict[str, Any] | None, problems: list[str]) -> dict[str, Any]:
    pdir = root / str(point["id"])
    summary = _read_json(pdir / SUMMARY, problems)
    summary = summary if isinstance(summary, dict) else None
    has_metrics = (pdir / METRICS).is_file()
    row: dict[str, Any] = dict(config or {})
    status = _status(pdir, summary, has_metrics)
    damage = point_problems(pdir) if pdir.exists() else []
    if damage:  # never counted: the tables take finished points only
        status, problems = CORRUPT, [p for p in problems if "unreadable" not in p] + damage
    if not pdir.exists():
        problems.append("no point folder")
    else:
        problems += [f"no {f}" for f in (CONFIG, SUMMARY) if not (pdir / f).is_file()]
    metrics = (summary or {}).get("metrics") or {}
    # the collapse detector's verdict: in the summary metrics, or at the summary's top level
    source = metrics if "collapsed_at" in metrics else summary or {}
    collapsed = source.get("collapsed_at")
    row["collapse_recorded"] = "collapsed_at" in source
    for k, v in flatten({k: v for k, v in metrics.items() if k != "collapsed_at"}).items():
        row[k] = v
    if isinstance(collapsed, dict):
        row["collapsed_at"] = float(collapsed["update"]) if collapsed.get("update") is not None else math.nan
        row["collapsed_reason"] = collapsed.get("reason")
    else:
        row["collapsed_at"] = float(collapsed) if isinstance(collapsed, (int, float)) else math.nan
        row["collapsed_reason"] = None
    _cost(row, summary or {})
    seed = point.get("seed", (config or {}).get(SEED_KEY))
    row.update(
        point=str(point["id"]),
        seed=int(seed) if isinstance(seed, (int, float)) else None,
        status=status,
        config_hash=(summary or {}).get("config_hash"),
        code_version=code_version_str((summary or {}).get("code_version")),
        packages=json.dumps((summary or {}).get("packages") or {}, sort_keys=True) if summary else None,
        cpu=json.dumps(summary["cpu"], sort_keys=True) if summary and summary.get("cpu") else None,
        error=(summary or {}).get("error"),
        has_metrics=has_metrics,
        problems="; ".join(problems),
    )
    return row


# ----------------------------------------------------------------------------- public API
def _root(path: str | Path) -> Path:
    from analysis.records import as_folder  # records imports this module

    root = as_folder(path)
    if not root.is_dir():
        raise AnalysisError(
            f"{root} is not a results folder: expected a directory written by "
            f"`harness sweep` (results/<sweep>/ with {SWEEP_MANIFEST} and one folder per point)."
        )
    return root


def load_results(path: str | Path) -> pd.DataFrame:
    """One row per point: flattened config (dotted columns, e.g. `algo.clip.level`), summary metrics
    (e.g. `final/eval_greedy/success`, `collapsed_at` = update or NaN), and `point`, `seed`, `status`,
    `label` (the cell: axis values, or the sweep's label), `is_baseline`, `config_hash`,
    `code_version`, `problems`. The sweep's metadata is in `df.attrs["sweep"]` (a SweepMeta);
    rows are ordered baseline cell first, then in sweep order."""
    root = _root(path)
    cfg_problems: dict[str, list[str]] = {}
    configs: dict[str, dict[str, Any]] = {}
    for d in _point_dirs(root):
        cfg_problems[d] = []
        cfg = _read_yaml(root / d / CONFIG, cfg_problems[d])
        if isinstance(cfg, dict):
            configs[d] = flatten(cfg)
    meta = read_sweep_meta(root, configs)
    if not meta.points:
        raise AnalysisError(
            f"{root} holds no points: no {SWEEP_MANIFEST} with points and no sub-folder with {', '.join(POINT_FILES)}."
        )
    groups = config_groups(meta.raw if meta.source == SWEEP_MANIFEST else None, configs, meta.points, meta.axes)
    rows = []
    for p in meta.points:
        pid = str(p["id"])
        row = _point_row(root, p, configs.get(pid), list(cfg_problems.get(pid, [])))
        diff = groups.get(pid, [])
        row.update(config_group=diff_text(diff, None), group_label=diff_text(diff))
        overrides = p.get("overrides") or {}
        for a in meta.axes:
            row[a] = overrides[a] if a in overrides else row.get(a, meta.baseline.get(a))
        row.update(_sweep_label=p.get("label"), _variant=p.get("variant"), _is_baseline=p.get("is_baseline"))
        row["_own_axes"] = [a for a in meta.axes if a in overrides]
        if row.get("config_hash") is None:
            row["config_hash"] = p.get("config_hash")
        rows.append(row)
    df = pd.DataFrame(rows)
    df["seed"] = df["seed"].astype("Int64")  # <NA> where no seed is known
    df = add_cells(df, meta)
    meta.other_configs = [g for g in dict.fromkeys(df["config_group"]) if g]
    df.attrs["sweep"] = meta
    return df


def load_curves(
    path: str | Path, results: pd.DataFrame | None = None, metrics: list[str] | None = None
) -> pd.DataFrame:
    """Learning curves in long format: columns point, seed, label, status, update, metric, value
    (numeric values only; `metrics` restricts which). Points without metrics.jsonl contribute nothing."""
    root = _root(path)
    results = load_results(root) if results is None else results
    wanted = set(metrics) if metrics else None
    cols: dict[str, list] = {c: [] for c in ("point", "seed", "label", "status", "update", "metric", "value")}
    for _, r in results[results["has_metrics"]].iterrows():
        point = (r["point"], r["seed"], r["label"], r["status"])
        for i, row in enumerate(read_metrics_rows(root / r["point"] / METRICS)):
            update = row.get("update", i)
            for k, v in row.items():
                if k == "update" or isinstance(v, bool) or not isinstance(v, (int, float)):
                    continue
                if wanted is not None and k not in wanted:
                    continue
                for c, x in zip(cols, (*point, update, k, float(v))):
                    cols[c].append(x)
    df = pd.DataFrame(cols)
    df["value"] = df["value"].astype(float)
    return df


SUMMARY_PREFIXES = ("final", "best", "init")  # <prefix>/<m>: a metrics.jsonl metric summarised per point


def resolve_metric(results: pd.DataFrame, curves: pd.DataFrame | None, name: str) -> pd.Series:
    """Per-point values of `name` (aligned with `results`): a summary column when present, else
    derived from the curves: `final/<m>` = last logged value, `best/<m>` = max, `init/<m>` = the
    value at update 0. NaN where unknown."""
    if name in results.columns:
        return pd.to_numeric(results[name], errors="coerce").astype(float)
    out = pd.Series(math.nan, index=results.index, dtype=float)
    prefix, _, base = name.partition("/")
    if curves is None or curves.empty or prefix not in SUMMARY_PREFIXES or not base:
        return out
    c = curves[curves["metric"] == base].dropna(subset=["value"]).sort_values(["point", "update"])
    if c.empty:
        return out
    g = c.groupby("point")["value"]
    if prefix == "final":
        per_point = g.last()
    elif prefix == "best":
        per_point = g.max()
    else:
        per_point = c[c["update"] == 0].groupby("point")["value"].first()
    return results["point"].map(per_point).astype(float)
