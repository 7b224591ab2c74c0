"""A point folder as files in memory, to move it between machines that share no filesystem (the Ray
backend's `--transfer objects`): read it, take what changed since the last time, write it back.

A folder's files are a mapping {relative path: bytes}; a change set maps a path to its new bytes, or to
None when the file is gone. What travels: every file of the point folder except the lock and hidden
temporary files (names starting with "."; the quarantine folder `.corrupt/` does travel). The
checkpoint folder travels whole: a change set that names any file under checkpoint/ names the complete
new checkpoint, and `write_files` swaps it in as the trainer does (a temporary folder renamed over
the old one), so a reader never sees half of two checkpoints.

`write_files` writes the other files first, then the checkpoint, then the status file: the logs a
checkpoint resumes from are on disk before it, and the status (the commit marker) comes last.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

from harness.store.files import _fsync_dir, atomic_write_bytes, replace_folder
from harness.store.layout import CHECKPOINT, LOCK, QUARANTINE, STATUS

Files = dict[str, bytes]
Changes = dict[str, bytes | None]


def _travels(name: str) -> bool:
    return name != LOCK and (not name.startswith(".") or name == QUARANTINE)


def _walk(root: Path, top: Path | None = None) -> Iterator[Path]:
    top = top or root
    try:
        entries = sorted(os.scandir(root), key=lambda e: e.name)
    except FileNotFoundError:
        return
    for entry in entries:
        if root == top and not _travels(entry.name):
            continue
        path = Path(entry.path)
        if entry.is_dir(follow_symlinks=False):
            yield from _walk(path, top)
        elif entry.is_file(follow_symlinks=False):
            yield path


def in_checkpoint(rel: str) -> bool:
    return rel.split("/", 1)[0] == CHECKPOINT


def _read_dir(path: Path, rel: str) -> Files | None:
    """The files of one folder read through one open directory handle; None when the folder is
    missing or a file vanished while it was read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return None
    try:
        out = {}
        for name in sorted(os.listdir(fd)):
            try:
                f = os.open(name, os.O_RDONLY, dir_fd=fd)
            except (FileNotFoundError, IsADirectoryError):
                return None
            with os.fdopen(f, "rb") as fh:
                out[f"{rel}/{name}"] = fh.read()
        return out
    finally:
        os.close(fd)


def read_checkpoint(folder: Path) -> Files | None:
    """The checkpoint's files ({} when there is none), read whole from one version even while the
    trainer replaces it: checkpoint/, else the `.checkpoint.old/` a swap leaves for a moment (the
    trainer resumes from it too); None when it vanished mid-read (try again)."""
    for name in (CHECKPOINT, f".{CHECKPOINT}.old"):
        if (folder / name).is_dir():
            return _read_dir(folder / name, CHECKPOINT)
    return {}


def read_files(folder: str | Path) -> Files | None:
    """Every file of `folder` that travels (see the module doc), the checkpoint read first (so the logs
    read after it are at least as new); None when the checkpoint was being replaced (try again)."""
    folder = Path(folder)
    out = read_checkpoint(folder)
    if out is None:
        return None
    for path in _walk(folder):
        rel = path.relative_to(folder).as_posix()
        if in_checkpoint(rel):
            continue
        try:
            out[rel] = path.read_bytes()
        except FileNotFoundError:  # replaced between listing and reading: os.replace keeps the name
            continue
    return out


def files_size(files: Changes) -> int:
    return sum(len(b) for b in files.values() if b is not None)


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class ChangeTracker:
    """What changed in a folder since the last change set taken (or since `known`, the files it held
    at first)."""

    def __init__(self, known: Files):
        self.sent = {rel: digest(b) for rel, b in known.items()}

    def changes(self, files: Files) -> Changes:
        """The change set from what was sent to `files` (a complete read, see `read_files`); marks it sent."""
        now = {rel: digest(b) for rel, b in files.items()}
        out: Changes = {rel: files[rel] for rel, h in now.items() if self.sent.get(rel) != h}
        if any(in_checkpoint(rel) for rel in out):  # the checkpoint travels whole
            out.update({rel: b for rel, b in files.items() if in_checkpoint(rel)})
        out.update({rel: None for rel in self.sent if rel not in now})
        self.sent = now
        return out


def merge_changes(held: Changes, new: Changes) -> None:
    """Fold the change set `new` into `held` (both relative to the same starting folder)."""
    if any(in_checkpoint(rel) for rel in new):
        for rel in [r for r in held if in_checkpoint(r)]:
            held[rel] = None
    held.update(new)


def _write_bytes(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(path, data)


def _swap_checkpoint(folder: Path, files: Changes) -> None:
    final, tmp, old = folder / CHECKPOINT, folder / f".{CHECKPOINT}.tmp", folder / f".{CHECKPOINT}.old"
    shutil.rmtree(tmp, ignore_errors=True)
    present = {rel: b for rel, b in files.items() if b is not None}
    if present:
        for rel, data in present.items():
            _write_bytes(tmp / rel.split("/", 1)[1], data)
        replace_folder(tmp, final)
    else:  # the checkpoint is gone: through the same .old name a reader falls back to
        shutil.rmtree(old, ignore_errors=True)
        if final.exists():
            os.replace(final, old)
        shutil.rmtree(old, ignore_errors=True)
    _fsync_dir(folder)


def write_files(folder: str | Path, changes: Changes) -> None:
    """Apply a change set to `folder` (created when missing): each file atomically, in the order of the
    module doc."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    rest = {rel: b for rel, b in changes.items() if not in_checkpoint(rel) and rel != STATUS}
    for rel, data in sorted(rest.items()):
        path = folder / rel
        if data is None:
            path.unlink(missing_ok=True)
        else:
            _write_bytes(path, data)
    ckpt = {rel: b for rel, b in changes.items() if in_checkpoint(rel)}
    if ckpt:
        _swap_checkpoint(folder, ckpt)
    if STATUS in changes:
        if changes[STATUS] is None:
            (folder / STATUS).unlink(missing_ok=True)
        else:
            _write_bytes(folder / STATUS, changes[STATUS])
