"""Which points of a results folder hold damaged files: one check for `harness check`, the runner
(`harness sweep` redoes such points with --retry-failed) and the tables, plots and reports (which
never count them); and `quarantine`, which moves a damaged point's files aside.

A point is corrupt when its files cannot be trusted as a result:
    status         not UTF-8 text, or not one of running | done | failed | diverged | pruned
and, for a finished point (done, diverged), whose files the runner wrote completely:
    config.yaml    missing, or not a YAML mapping
    summary.json   missing, not a JSON object, or its status differs from the status file
    metrics.jsonl  a line that is not a JSON object (cut mid-line, binary garbage), updates that
                   do not increase, or not the number of rows summary.json's `updates_logged` records
A running point may end with a torn line (a kill mid-append; the resume drops it) and a failed or
pruned point is not a result, so only their status file is checked.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import yaml

from harness.store.layout import CONFIG, FINISHED, LOCK, METRICS, QUARANTINE, SUMMARY, point_dirs, read_status


@dataclass
class CorruptPoint:
    """A point whose files are damaged, and why (one reason per damaged file)."""

    path: Path
    problems: list[str] = field(default_factory=list)

    def line(self) -> str:
        return f"{self.path}: {'; '.join(self.problems)}"


def _summary_problems(pdir: Path, status: str) -> tuple[list[str], dict | None]:
    path = pdir / SUMMARY
    if not path.is_file():
        return [f"no {SUMMARY}"], None
    try:
        summary = json.loads(path.read_bytes().decode("utf-8"))
    except (OSError, ValueError) as e:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        return [f"{SUMMARY} is not valid JSON ({type(e).__name__})"], None
    if not isinstance(summary, dict) or not isinstance(summary.get("metrics", {}), dict):
        return [f"{SUMMARY} is not a summary (no metrics mapping)"], None
    if summary.get("status") not in (None, status):
        return [f"{SUMMARY} says {str(summary.get('status'))[:20]!r} but the status file says {status!r}"], summary
    return [], summary


def _metrics_problems(pdir: Path, summary: dict | None) -> list[str]:
    path = pdir / METRICS
    if not path.is_file():
        return [f"no {METRICS}"]
    try:
        lines = path.read_bytes().decode("utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        return [f"{METRICS} is not text ({type(e).__name__})"]
    updates = []
    for i, line in enumerate(lines, 1):
        try:
            row = json.loads(line)
        except ValueError:
            return [f"{METRICS} line {i} of {len(lines)} is not a JSON row (cut or damaged)"]
        if not isinstance(row, dict):
            return [f"{METRICS} line {i} of {len(lines)} is not a JSON object"]
        updates.append(row.get("update"))
    numbers = [u for u in updates if isinstance(u, int)]
    if len(numbers) != len(updates) or any(b <= a for a, b in zip(numbers, numbers[1:])):
        return [f"{METRICS} updates are missing, repeated or out of order"]
    logged = (summary or {}).get("updates_logged")
    if isinstance(logged, int) and logged != len(lines):
        return [f"{METRICS} has {len(lines)} rows but {SUMMARY} records {logged}"]
    return []


def _config_problems(pdir: Path) -> list[str]:
    path = pdir / CONFIG
    if not path.is_file():
        return [f"no {CONFIG}"]
    try:
        config = yaml.safe_load(path.read_bytes().decode("utf-8"))
    except (OSError, ValueError, yaml.YAMLError) as e:
        return [f"{CONFIG} is not valid YAML ({type(e).__name__})"]
    return [] if isinstance(config, dict) else [f"{CONFIG} is not a mapping"]


def point_problems(pdir: str | Path) -> list[str]:
    """Why the point in `pdir` is corrupt; an empty list when it is not (see the module doc)."""
    pdir = Path(pdir)
    status, problem = read_status(pdir)
    if problem:
        return [problem]
    if status not in FINISHED:
        return []
    problems, summary = _summary_problems(pdir, status)
    return problems + _config_problems(pdir) + _metrics_problems(pdir, summary)


def check_sweep(root: str | Path) -> list[CorruptPoint]:
    """The corrupt points of one sweep folder, in name order."""
    out = []
    for pdir in point_dirs(root):
        problems = point_problems(pdir)
        if problems:
            out.append(CorruptPoint(pdir, problems))
    return out


def quarantine(run_dir: Path) -> Path:
    """Move everything a damaged point wrote (but its lock) to <point>/.corrupt/<time>/, so it runs
    from scratch; returns that folder."""
    (run_dir / QUARANTINE).mkdir(exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ-")
    dest = Path(tempfile.mkdtemp(prefix=stamp, dir=run_dir / QUARANTINE))
    for entry in run_dir.iterdir():
        if entry.name not in (LOCK, QUARANTINE):
            shutil.move(str(entry), str(dest / entry.name))
    return dest
