"""Which points of a results folder hold damaged files: one check for `harness check`, the runner
(`harness sweep` redoes such points with --retry-failed) and the tables, plots and reports (which
never count them).

A point is corrupt when its files cannot be trusted as a result:
    status         not UTF-8 text, or not one of running | done | failed | diverged | pruned
and, for a finished point (done, diverged), whose files the runner wrote completely:
    config.yaml    missing, or not a YAML mapping
    summary.json   missing, not a JSON object, or its status differs from the status file
    metrics.jsonl  a line that is not a JSON object (cut mid-line, binary garbage), updates that
                   do not increase, or not the number of rows summary.json's `updates_logged` records
A running point may end with a torn line (a kill mid-append; the resume drops it) and a failed or
pruned point is not a result, so only their status file is checked.

Pure standard library (json, yaml): the runner imports this module without pandas.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import yaml

STATUSES = ("running", "done", "failed", "diverged", "pruned")
FINISHED = ("done", "diverged")
CORRUPT = "corrupt"
POINT_FILES = ("config.yaml", "metrics.jsonl", "summary.json", "status")


@dataclass
class CorruptPoint:
    """A point whose files are damaged, and why (one reason per damaged file)."""

    path: Path
    problems: list[str] = field(default_factory=list)

    def line(self) -> str:
        return f"{self.path}: {'; '.join(self.problems)}"


def read_status(pdir: Path) -> tuple[str | None, str | None]:
    """(the status word, None), (None, None) when there is no status file, or (None, why) when it
    is damaged."""
    try:
        raw = (Path(pdir) / "status").read_bytes()
    except FileNotFoundError:
        return None, None
    except OSError as e:
        return None, f"status unreadable ({type(e).__name__})"
    try:
        text = raw.decode("utf-8").strip()
    except UnicodeDecodeError:
        return None, f"status is not text ({len(raw)} bytes of binary data)"
    if not text:
        return None, None
    if text not in STATUSES:
        return None, f"status is not one of {' | '.join(STATUSES)} ({len(raw)} bytes)"
    return text, None


def _summary_problems(pdir: Path, status: str) -> tuple[list[str], dict | None]:
    path = pdir / "summary.json"
    if not path.is_file():
        return ["no summary.json"], None
    try:
        summary = json.loads(path.read_bytes().decode("utf-8"))
    except (OSError, ValueError) as e:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        return [f"summary.json is not valid JSON ({type(e).__name__})"], None
    if not isinstance(summary, dict) or not isinstance(summary.get("metrics", {}), dict):
        return ["summary.json is not a summary (no metrics mapping)"], None
    if summary.get("status") not in (None, status):
        return [f"summary.json says {str(summary.get('status'))[:20]!r} but the status file says {status!r}"], summary
    return [], summary


def _metrics_problems(pdir: Path, summary: dict | None) -> list[str]:
    path = pdir / "metrics.jsonl"
    if not path.is_file():
        return ["no metrics.jsonl"]
    try:
        lines = path.read_bytes().decode("utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        return [f"metrics.jsonl is not text ({type(e).__name__})"]
    updates = []
    for i, line in enumerate(lines, 1):
        try:
            row = json.loads(line)
        except ValueError:
            return [f"metrics.jsonl line {i} of {len(lines)} is not a JSON row (cut or damaged)"]
        if not isinstance(row, dict):
            return [f"metrics.jsonl line {i} of {len(lines)} is not a JSON object"]
        updates.append(row.get("update"))
    numbers = [u for u in updates if isinstance(u, int)]
    if len(numbers) != len(updates) or any(b <= a for a, b in zip(numbers, numbers[1:])):
        return ["metrics.jsonl updates are missing, repeated or out of order"]
    logged = (summary or {}).get("updates_logged")
    if isinstance(logged, int) and logged != len(lines):
        return [f"metrics.jsonl has {len(lines)} rows but summary.json records {logged}"]
    return []


def _config_problems(pdir: Path) -> list[str]:
    path = pdir / "config.yaml"
    if not path.is_file():
        return ["no config.yaml"]
    try:
        config = yaml.safe_load(path.read_bytes().decode("utf-8"))
    except (OSError, ValueError, yaml.YAMLError) as e:
        return [f"config.yaml is not valid YAML ({type(e).__name__})"]
    return [] if isinstance(config, dict) else ["config.yaml is not a mapping"]


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


def _is_point_dir(path: Path) -> bool:
    return path.is_dir() and not path.name.startswith(".") and any((path / f).exists() for f in POINT_FILES)


def point_dirs(root: str | Path) -> list[Path]:
    """The point folders of one sweep folder (results/<sweep>), in name order."""
    return sorted(p for p in Path(root).iterdir() if _is_point_dir(p))


def check_sweep(root: str | Path) -> list[CorruptPoint]:
    """The corrupt points of one sweep folder, in name order."""
    out = []
    for pdir in point_dirs(root):
        problems = point_problems(pdir)
        if problems:
            out.append(CorruptPoint(pdir, problems))
    return out


def _is_sweep_dir(path: Path) -> bool:
    return (path / "sweep.json").is_file() or any(_is_point_dir(p) for p in path.iterdir())


def sweep_folders(path: str | Path) -> list[Path]:
    """`path` itself when it is a sweep folder (sweep.json or point folders), else its sub-folders
    that are (a results root holding several sweeps)."""
    path = Path(path)
    if _is_sweep_dir(path):
        return [path]
    return sorted(p for p in path.iterdir() if p.is_dir() and not p.name.startswith(".") and _is_sweep_dir(p))
