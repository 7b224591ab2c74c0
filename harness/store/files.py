"""File operations every results-folder file goes through: atomic writes, JSONL rows, locks.

A file is written atomically (a temporary file in the same folder, fsync, `os.replace`), so a
kill leaves either the old or the new content, never half of it. JSONL rows are appended with
flush + fsync; a torn last line left by a kill is skipped when read back and dropped by
`rewrite_jsonl`, so the next append starts on a clean line.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Replace `path` with `data` all at once (tmp file + fsync + os.replace)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def replace_folder(tmp: Path, final: Path) -> None:
    """Put the finished folder `tmp` in the place of `final`: the old one is first renamed to
    `.<name>.old` (a reader that finds no `final` between the two renames falls back to it), then
    removed. Used for the trainer's checkpoint/ and for one that arrives through the Ray backend."""
    shutil.rmtree(old := final.with_name(f".{final.name}.old"), ignore_errors=True)
    if final.exists():
        os.replace(final, old)
    os.replace(tmp, final)
    shutil.rmtree(old, ignore_errors=True)


def atomic_write_text(path: str | Path, text: str) -> None:
    """Replace `path` with `text` (UTF-8) all at once (tmp file + fsync + os.replace)."""
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | Path, obj: Any) -> None:
    """Replace `path` with `obj` as indented JSON (key order kept) and a final newline."""
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=False, default=_jsonable) + "\n")


def _jsonable(value: Any) -> Any:
    """json `default=`: tensors / numpy scalars -> python numbers, paths -> str."""
    if hasattr(value, "item") and callable(value.item):
        return value.item()
    if hasattr(value, "tolist"):
        return value.tolist()
    return str(value)


def jsonl_text(rows: Iterable[dict]) -> str:
    """`rows` as JSONL: one compact JSON object per line, each ending in a newline."""
    return "".join(json.dumps(r, default=_jsonable) + "\n" for r in rows)


def append_jsonl(path: str | Path, rows: Iterable[dict]) -> None:
    """Append `rows` to the JSONL file `path` (created when missing) in one write, then fsync."""
    text = jsonl_text(rows)
    if not text:
        return
    with open(path, "a") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


def read_jsonl(path: str | Path) -> list[dict]:
    """Rows of a JSONL file; a torn (unparsable) line, as a kill mid-write leaves, is skipped."""
    path = Path(path)
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict):
            rows.append(row)
    return rows


def rewrite_jsonl(path: Path, keep: Callable[[dict], bool] = lambda row: True) -> None:
    """Keep the rows `keep` accepts; also drops a torn last line, so the next append starts clean."""
    if not path.exists():
        return
    text = path.read_text()
    new = jsonl_text(r for r in read_jsonl(path) if keep(r))
    if new != text:
        atomic_write_text(path, new)


@contextmanager
def file_lock(path: str | Path, blocking: bool = True) -> Iterator[bool]:
    """An exclusive lock on `path` (created when missing) across processes; yields whether it was
    taken (always True when `blocking`; without POSIX locks: True, no lock)."""
    try:
        import fcntl
    except ImportError:  # not POSIX
        yield True
        return
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)
