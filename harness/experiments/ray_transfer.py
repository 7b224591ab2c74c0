"""`--transfer objects` (the Ray backend's default): a point's files travel through Ray, not a filesystem.

The task side. A task runs its point in a folder of its own node (under $HARNESS_RAY_SCRATCH on that
node, else <the node's temp dir>/harness-ray; one fresh folder per attempt, removed after it), filled
first with the point's files as the driver held them when it submitted the task (its argument) and the
change sets the mailbox holds since (a retried attempt resumes from the last checkpoint the driver
got). A shipper thread watches the folder's checkpoint/: each time the trainer writes one, it reads the
checkpoint and then the other files (harness.store.transfer) and deposits what changed in the
mailbox; when the point ends, whatever changed since goes the same way. The task's reply arrives
after its last deposit.

The mailbox is one Ray actor on the driver's node (0 CPUs) for the whole look: progress events and
change sets in, the driver drains them every half second and writes the files into results/ through
harness.store.transfer. It keeps, for each point in flight, every change set since submission (for
a retried attempt) and only accepts deposits from a point's latest attempt, so a task Ray gave up on
cannot overwrite its successor's files.

Size: a change set is one Ray object, held in the object store of the task's node, in the memory of
the mailbox (on the driver's node) until the driver drains it, and as a complete folder for each
point in flight. A point folder larger than the limit (`max_bytes`, `harness sweep --max-point-mb`,
default 1024 MiB) is refused: the task stops and the point fails with a message naming the limit.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from harness.experiments.point import RunOptions, now_iso, point_dir, run_point
from harness.experiments.sweep import Point
from harness.store import CHECKPOINT, EVENTS, append_jsonl
from harness.store.transfer import (
    Changes,
    ChangeTracker,
    Files,
    files_size,
    in_checkpoint,
    merge_changes,
    read_files,
    write_files,
)

SCRATCH_ENV = "HARNESS_RAY_SCRATCH"
DEFAULT_MAX_MB = 1024
POLL_S = 0.2


class PointFailedError(RuntimeError):
    """A point ended with status `failed` inside a Ray task (Ray retries it when --retries > 0)."""


class PointTooLargeError(RuntimeError):
    """A point's folder exceeds what the backend ships through the object store (not retried)."""


def scratch_root() -> Path:
    """This node's folder for the points its tasks run: $HARNESS_RAY_SCRATCH, else <temp dir>/harness-ray."""
    root = os.environ.get(SCRATCH_ENV) or os.path.join(tempfile.gettempdir(), "harness-ray")
    path = Path(root).expanduser().resolve()
    path.mkdir(parents=True, exist_ok=True)
    return path


# ----------------------------------------------------------------------------- the driver's mailbox
class Mailbox:
    """Progress events and change sets from the tasks to the driver (a Ray actor, see the module doc)."""

    def __init__(self) -> None:
        self.events: list[tuple] = []
        self.pending: dict[str, Changes] = {}  # not yet drained by the driver
        self.held: dict[str, Changes] = {}  # since submission: what a retried attempt starts from
        self.attempts: dict[str, int] = {}

    def event(self, kind: str, pid: str, info: Any = None) -> None:
        self.events.append((kind, pid, info))

    def checkout(self, pid: str) -> tuple[int, Changes]:
        """A new attempt of point `pid`: its number and the change sets since submission."""
        self.attempts[pid] = self.attempts.get(pid, 0) + 1
        return self.attempts[pid], dict(self.held.get(pid, {}))

    def deposit(self, pid: str, attempt: int, changes: Changes) -> bool:
        if attempt != self.attempts.get(pid):
            return False  # an attempt Ray gave up on
        merge_changes(self.held.setdefault(pid, {}), changes)
        merge_changes(self.pending.setdefault(pid, {}), changes)
        return True

    def drain(self) -> tuple[list[tuple], dict[str, Changes]]:
        events, pending = self.events, self.pending
        self.events, self.pending = [], {}
        return events, pending

    def forget(self, pid: str) -> None:
        self.held.pop(pid, None)


# ----------------------------------------------------------------------------- the task's shipper
class Shipper:
    """Deposits the changes of a node-local point folder in the mailbox: at each new checkpoint (a
    background thread) and once at the end (`final`)."""

    def __init__(self, folder: Path, known: Files, mailbox: Any, pid: str, attempt: int, max_bytes: int):
        self.folder, self.mailbox, self.pid, self.attempt, self.max_bytes = folder, mailbox, pid, attempt, max_bytes
        self.tracker = ChangeTracker(known)
        self.error: PointTooLargeError | None = None
        self.stale, self.lock, self.stop = False, threading.Lock(), threading.Event()
        self.seen = self._signature()
        self.thread = threading.Thread(target=self._watch, name=f"ship:{pid}", daemon=True)

    def _signature(self) -> tuple | None:
        try:
            with os.scandir(self.folder / CHECKPOINT) as it:
                return tuple(sorted((e.name, e.inode(), e.stat().st_size, e.stat().st_mtime_ns) for e in it))
        except OSError:
            return None

    def _watch(self) -> None:
        while not self.stop.wait(POLL_S):
            sig = self._signature()
            if sig is None or sig == self.seen:
                continue
            try:
                if self.ship(final=False):
                    self.seen = sig
            except PointTooLargeError as e:
                self.error = e
                return
            except Exception:  # noqa: BLE001 - the final deposit ships whatever this one missed
                continue

    def start(self) -> None:
        self.thread.start()

    def close(self) -> None:
        self.stop.set()
        self.thread.join()

    def check(self) -> None:
        """Raise the size error the watcher met (called from the trainer's progress callback)."""
        if self.error is not None:
            raise self.error

    def ship(self, final: bool) -> bool:
        """Deposit what changed; False when a checkpoint was being replaced (try again)."""
        import ray

        with self.lock:
            if self.stale:
                return True
            files = read_files(self.folder)
            for _ in range(100 if final else 0):  # the trainer has returned: nothing is replaced any more
                if files is not None:
                    break
                time.sleep(0.05)
                files = read_files(self.folder)
            if files is None or not (final or any(in_checkpoint(rel) for rel in files)):
                return False  # a checkpoint being replaced: the next look finds it whole
            size = files_size(files)
            if size > self.max_bytes:
                raise PointTooLargeError(
                    f"point {self.pid}: its folder holds {size / 2**20:.1f} MiB, over the {self.max_bytes / 2**20:.0f} "
                    f"MiB a point may ship through Ray's object store (--transfer objects). Raise the limit with "
                    f"--max-point-mb (the object stores and the driver's memory must hold it), or put the results "
                    f"folder on a filesystem every node shares and pass --transfer shared-fs."
                )
            changes = self.tracker.changes(files)
            if changes or final:
                self.stale = not ray.get(self.mailbox.deposit.remote(self.pid, self.attempt, changes))
            return True


def unpack(folder: Path, initial: Files, held: Changes) -> Files:
    """Fill a fresh node-local point folder; returns its files as read back."""
    write_files(folder, dict(initial))
    write_files(folder, held)
    return read_files(folder) or {}


def attempt_folder(sweep: str, pid: str) -> Path:
    """A fresh folder for one attempt: scratch/points/<random>/ (the point goes to <it>/<sweep>/<pid>/)."""
    parent = scratch_root() / "points"
    parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f"{sweep[:20]}.", dir=parent))


def remove(folder: Path) -> None:
    shutil.rmtree(folder, ignore_errors=True)


# ----------------------------------------------------------------------------- inside a Ray worker
def _apply_env(env: dict[str, str]) -> None:
    for path in reversed([p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]):
        if path not in sys.path:
            sys.path.insert(0, path)
    os.environ.update({k: v for k, v in env.items() if k != "PYTHONPATH"})


def _task_setup(env: dict[str, str]) -> None:
    _apply_env(env)
    if threading.current_thread() is threading.main_thread():  # ray.cancel interrupts with SIGINT, which a
        signal.signal(signal.SIGINT, signal.default_int_handler)  # background driver passes on ignored


INTERRUPTED = {"status": "interrupted", "wall_s": None, "error": None}


def run_point_task(point: Point, sweep: str, opts: RunOptions, env: dict[str, str], mailbox: Any) -> dict:
    """The Ray task of --transfer shared-fs: one point in the shared results folder."""
    _task_setup(env)
    mailbox.event.remote("start", point.id)
    try:
        res = run_point(point, sweep, opts, lambda info: mailbox.event.remote("update", point.id, dict(info)))
    except KeyboardInterrupt:  # ray.cancel: the point stays `running` and resumes next time
        return dict(INTERRUPTED)
    if res["status"] == "failed":
        raise PointFailedError(res["error"] or "failed")
    return res


def _where(attempt: int, run_dir: Path) -> dict:
    import ray

    node = ray.get_runtime_context().get_node_id()
    return {"event": "ray_task", "time": now_iso(), "attempt": attempt, "node_id": node,
            "node_ip": ray.util.get_node_ip_address(), "dir": str(run_dir)}  # fmt: skip


def run_shipped_task(
    point: Point, sweep: str, opts: RunOptions, env: dict[str, str], mailbox: Any, initial: dict, max_bytes: int
) -> dict:
    """The Ray task of --transfer objects: one point in a node-local folder, its files shipped to the
    driver's mailbox (harness.experiments.ray_transfer)."""
    import ray

    _task_setup(env)
    if "HARNESS_CACHE" not in env:  # the tiny models and SFT caches of this node
        os.environ["HARNESS_CACHE"] = str(scratch_root() / "cache")
    attempt, held = ray.get(mailbox.checkout.remote(point.id))
    work = attempt_folder(sweep, point.id)
    run_dir = point_dir(work, sweep, point)
    try:
        shipper = Shipper(run_dir, unpack(run_dir, initial, held), mailbox, point.id, attempt, max_bytes)
        append_jsonl(run_dir / EVENTS, [_where(attempt, run_dir)])
        mailbox.event.remote("start", point.id)

        def progress(info: dict) -> None:
            shipper.check()  # a folder over the size limit stops the point now, not at its end
            mailbox.event.remote("update", point.id, dict(info))

        shipper.start()
        try:
            res = run_point(point, sweep, dataclasses.replace(opts, results=work), progress)
        except KeyboardInterrupt:
            res = dict(INTERRUPTED)
        finally:
            shipper.close()
        shipper.check()
        shipper.ship(final=True)
    finally:
        remove(work)
    if res["status"] == "failed":
        raise PointFailedError(res["error"] or "failed")
    return res


def write_probe(path: str) -> str | None:
    """--transfer shared-fs: write `path` on this node; the error, or None."""
    try:
        Path(path).write_text("harness shared-fs probe\n")
    except OSError as e:
        return f"{type(e).__name__}: {e}"
    return None
