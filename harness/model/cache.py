"""Content-addressed build cache shared by the points of a sweep.

Things that many points need and that cost minutes to build (the tiny base model, an SFT
warm-up) are stored under `<cache_dir>/<kind>/<hash>/`, where the hash covers everything the
result depends on: the relevant config, the source code of the modules that build it and the
versions of the numeric packages. Parallel points race for a file lock; the first builds into a
temporary folder and renames it into place (atomic on one filesystem), the others wait and then
read. A folder without its `DONE` marker is never read.

A build runs on min(`BUILD_THREADS`, the cores the process may use) CPU threads whatever
`train.threads` says: the other points are blocked on its lock meanwhile, so their cores would idle.
That width depends on the machine only, never on which point happens to build the entry, because the
result can depend on it: on the AMD EPYC machines this project first ran on, a 2-thread build of the
tiny model and its SFT warm-up was bit-identical to a 1-thread one, but on an Intel Xeon with AMX
(2026-12-06, the same packages) 41 of the tiny model's 50 tensors differ, by up to 1.3e-6. So an entry
is bit-reproducible for the same config, packages, CPU type and core count (docs/trainer.md,
determinism). The record says how many threads built the entry.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import inspect
import json
import os
import shutil
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from filelock import FileLock

DONE = "DONE.json"
BUILD_THREADS = 4  # at most; fewer when the process may use fewer cores
_PACKAGES = ("torch", "transformers", "tokenizers", "peft")


def cache_dir() -> Path:
    """Where the caches shared by every point live (tiny models, SFT checkpoints, games):
    $HARNESS_CACHE, default results/.cache."""
    return Path(os.environ.get("HARNESS_CACHE", "results/.cache"))


def content_hash(obj: Any, length: int = 16) -> str:
    """Stable hash of a JSON-able object (keys sorted; non-JSON values by their str)."""
    blob = json.dumps(obj, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:length]


def code_version(*objs: Any) -> str:
    """Hash of the source files defining `objs` (modules, classes or functions)."""
    h = hashlib.sha256()
    for path in sorted({inspect.getsourcefile(o) for o in objs}):
        h.update(Path(path).name.encode())
        h.update(Path(path).read_bytes())
    return h.hexdigest()[:16]


@contextmanager
def build_threads() -> Iterator[int]:
    """Set torch's CPU thread count for a cache build to the machine's build width (module docstring),
    whatever the caller's, then restore the caller's."""
    import torch

    before = torch.get_num_threads()
    n = min(BUILD_THREADS, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1)
    torch.set_num_threads(n)
    try:
        yield n
    finally:
        torch.set_num_threads(before)


def package_versions() -> dict[str, str]:
    out = {}
    for name in _PACKAGES:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = "absent"
    return out


def build_once(root: Path, key: str, build: Callable[[Path], dict], meta: dict | None = None) -> tuple[Path, bool]:
    """Return `(root/key, built)`: build the entry with `build(tmp_dir)` unless it is complete.

    `build` writes its files into the folder it is given and returns a JSON-able dict that is
    stored in `DONE.json` with `meta`. Exactly one process builds a given key; the others block
    on the lock and then find it complete (`built` False).
    """
    root = Path(root)
    final = root / key
    if (final / DONE).exists():
        return final, False
    root.mkdir(parents=True, exist_ok=True)
    with FileLock(str(root / f".{key}.lock")):
        if (final / DONE).exists():
            return final, False
        for stale in root.glob(f".{key}.tmp-*"):  # left by a killed build (we hold the lock)
            shutil.rmtree(stale, ignore_errors=True)
        tmp = root / f".{key}.tmp-{os.getpid()}"
        tmp.mkdir(parents=True)
        try:
            t0 = time.time()
            with build_threads() as threads:
                info = build(tmp) or {}
            record = {
                "key": key,
                "meta": meta or {},
                "info": info,
                "build_seconds": round(time.time() - t0, 2),
                "threads": threads,
                "packages": package_versions(),
            }
            (tmp / DONE).write_text(json.dumps(record, indent=1, sort_keys=True, default=str))
            if final.exists():  # an incomplete folder left by a crashed build
                shutil.rmtree(final)
            os.replace(tmp, final)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return final, True


def read_record(entry: Path) -> dict:
    """The `DONE.json` record of a complete cache entry."""
    return json.loads((Path(entry) / DONE).read_text())
