"""A sweep's per-point records in one compact file, and reading it back as a results folder.

    harness records pack results/clipping           -> results/clipping.records.jsonl.gz

The pack is gzip-compressed JSON lines: a header line, then one line per file, `{"path": "<point>/
metrics.jsonl", "text": ...}`, holding the file's text verbatim. It keeps what the tables, figures,
docs/results.md and `harness diagnose` read: the sweep's manifest (sweep.json, looks.json) and each
point's config.yaml, metrics.jsonl (per-update metrics), eval_tasks.jsonl (per-task evaluations),
summary.json, status, events.jsonl and traceback.txt. It leaves out what they never read: sampled
episode texts (samples.jsonl), wall times per update (timings.jsonl), checkpoints and adapters.

Why JSON lines and not Parquet: pyarrow is not a dependency of this project (pyproject.toml; it
arrives only through mlflow and trl), and text kept verbatim makes the round trip exact by
construction: a packed sweep reads back byte for byte as the folder it came from. gzip without a
timestamp makes the pack's bytes a function of the records alone, so re-packing unchanged records
changes nothing in git.

Reading: `as_folder(path)` returns a folder for either form. A pack is unpacked once into a cache
folder named by the pack's content hash (the system temporary folder, or HARNESS_RECORDS_CACHE), so
every reader of results folders (analysis.load, analysis.table, analysis.plot) works unchanged. A
folder and a pack of the same sweep side by side: the folder wins (it is the one a sweep writes to).
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import shutil
import tempfile
from pathlib import Path

from analysis.errors import AnalysisError
from harness.store import point_dirs

SUFFIX = ".records.jsonl.gz"
FORMAT, VERSION = "harness-records", 1
SWEEP_FILES = ("sweep.json", "looks.json")
POINT_KEEP = (
    "config.yaml",
    "metrics.jsonl",
    "eval_tasks.jsonl",
    "summary.json",
    "status",
    "events.jsonl",
    "traceback.txt",
)
CACHE_ENV = "HARNESS_RECORDS_CACHE"


def pack_path(folder: str | Path) -> Path:
    """Where the pack of a sweep folder goes: beside it, `<sweep>.records.jsonl.gz`."""
    folder = Path(folder)
    return folder.parent / f"{folder.name}{SUFFIX}"


def is_pack(path: str | Path) -> bool:
    return Path(path).name.endswith(SUFFIX) and Path(path).is_file()


def _files(folder: Path) -> list[str]:
    """Relative paths of the files a pack keeps, in a fixed order (sweep files, then points by name)."""
    out = [name for name in SWEEP_FILES if (folder / name).is_file()]
    for pdir in point_dirs(folder):
        out += [f"{pdir.name}/{name}" for name in POINT_KEEP if (pdir / name).is_file()]
    return out


def pack(folder: str | Path, out: str | Path | None = None) -> Path:
    """Write the pack of one sweep's results folder (default: beside it); returns its path.
    A path that is not a folder of points is an AnalysisError naming it."""
    folder = Path(folder)
    if not folder.is_dir():
        raise AnalysisError(f"{folder} is not a results folder: expected the folder `harness sweep` writes.")
    files = _files(folder)
    if not any("/" in f for f in files):
        raise AnalysisError(f"{folder} holds no points (no sub-folder with config.yaml, metrics.jsonl or status).")
    head = {"format": FORMAT, "version": VERSION, "sweep": folder.name, "files": len(files)}
    lines = [json.dumps(head)]
    for rel in files:
        text = (folder / rel).read_bytes().decode("utf-8", errors="surrogateescape")
        lines.append(json.dumps({"path": rel, "text": text}, ensure_ascii=True))
    out = Path(out) if out else pack_path(folder)
    buf = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=buf, mtime=0, compresslevel=9) as gz:
        gz.write(("\n".join(lines) + "\n").encode("ascii"))
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_bytes(buf.getvalue())
    os.replace(tmp, out)
    return out


def read_pack(path: str | Path) -> tuple[str, dict[str, str]]:
    """(sweep name, {relative path: text}) of a pack; a damaged or foreign file is an AnalysisError."""
    path = Path(path)
    try:
        lines = gzip.decompress(path.read_bytes()).decode("ascii").splitlines()
        head = json.loads(lines[0])
        if head.get("format") != FORMAT:
            raise ValueError("not a records pack")
        rows = [json.loads(line) for line in lines[1:] if line]
        files = {str(r["path"]): str(r["text"]) for r in rows}
    except (OSError, ValueError, KeyError, IndexError, TypeError, AttributeError, EOFError) as e:
        raise AnalysisError(f"{path} is not a readable records pack ({type(e).__name__}: {e}).") from None
    if len(files) != head.get("files") or any(Path(p).is_absolute() or ".." in Path(p).parts for p in files):
        raise AnalysisError(f"{path} is damaged: its header counts {head.get('files')} files, it holds {len(files)}.")
    return str(head.get("sweep") or path.name[: -len(SUFFIX)]), files


def _cache_root() -> Path:
    return Path(os.environ.get(CACHE_ENV) or Path(tempfile.gettempdir()) / "harness-records")


def unpack(path: str | Path) -> Path:
    """The pack as a results folder, `<cache>/<content hash>/<sweep>/` (written once, atomically)."""
    path = Path(path)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()[:16]
    name, files = read_pack(path)
    target = _cache_root() / digest / name
    if target.is_dir():
        return target
    staging = Path(tempfile.mkdtemp(prefix=f"{digest}-", dir=_ensure(_cache_root())))
    for rel, text in files.items():
        dest = staging / name / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(text.encode("utf-8", errors="surrogateescape"))
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.replace(staging / name, target)
    except OSError:  # another process unpacked the same pack first
        if not target.is_dir():
            raise
    shutil.rmtree(staging, ignore_errors=True)
    return target


def _ensure(p: Path) -> Path:
    p.mkdir(parents=True, exist_ok=True)
    return p


def as_folder(path: str | Path) -> Path:
    """A results folder for `path`: the folder itself, a pack unpacked, or, for a folder path that does
    not exist, the pack beside where it would be (`results/clipping` -> `results/clipping.records.jsonl.gz`).
    Anything else is returned unchanged (the caller's own check says what is wrong with it)."""
    p = Path(path)
    if p.is_dir():
        return p
    if is_pack(p):
        return unpack(p)
    if is_pack(pack_path(p)):
        return unpack(pack_path(p))
    return p


def sweep_name(path: str | Path) -> str:
    """The sweep a folder or pack holds, by its path: `results/clipping.records.jsonl.gz` -> clipping."""
    name = Path(path).name
    return name[: -len(SUFFIX)] if name.endswith(SUFFIX) else name
