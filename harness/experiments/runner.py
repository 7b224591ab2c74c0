"""Run the points of a sweep: one after another in this process, or in `workers` spawned processes.

Every point runs through `harness.experiments.point.run_point` (its folder layout is documented
there). Re-running skips done and diverged points, retries failed and corrupt ones only with
`retry_failed`, and resumes interrupted ones (status still `running`; the trainer resumes from
checkpoint/). A failing point never stops the sweep. Ctrl-C (or SIGTERM) stops cleanly: running
points keep status `running` and resume next time. A point another process is running (two sweeps
sharing a results folder) is waited for at the end: finished there, it counts as `elsewhere`; left
unfinished, it runs here.

`RunOptions.executor` replaces the local process pool (harness.experiments.ray_backend).

A sweep with a seed budget (`seeds: {start, step, max}`) runs look by look
(harness.experiments.sequential): each look's points go through the same local pool or executor.

A time cap (`RunOptions.max_minutes`, `harness sweep --max-minutes`): once it has passed since
`run_sweep` began, no new point starts (in the local pool; the Ray backend submits a look's points
at once, so there the cap acts between looks) and no new look starts; points in flight finish. The
points not started count as `capped`, which is no failure: the same command later resumes.
"""

from __future__ import annotations

import itertools
import json
import multiprocessing as mp
import os
import queue as queue_mod
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.config.errors import warn
from harness.experiments.base_config import other_configs, warning_text
from harness.experiments.point import (
    RunOptions,
    past_deadline,
    point_dir,
    point_state,
    resolve_train_fn,
    run_point,
    spec_string,
)
from harness.experiments.provenance import environment
from harness.experiments.redact import mask_credentials
from harness.experiments.sweep import Point, Sweep, merge_manifest
from harness.experiments.tracking import ensure_experiment
from harness.store import (
    CACHE,
    CORRUPT,
    FINISHED,
    SWEEP_MANIFEST,
    TRACEBACK,
    atomic_write_json,
    atomic_write_text,
    point_lock,
    point_problems,
    write_status,
)

__all__ = ["RunOptions", "SweepResult", "plan", "run_sweep"]


# ----------------------------------------------------------------------------- a sweep
@dataclass
class SweepResult:
    """counts: done | diverged | failed (this run), skipped (finished before), corrupt (damaged, not
    run again without retry_failed), busy (held by another process), elsewhere (finished by it),
    blocked (a look of a seed budget that cannot be decided: its points failed or lack results),
    capped (not started: the time cap had passed; a later run starts them)."""

    counts: dict[str, int]
    interrupted: bool = False
    errors: dict[str, str] = field(default_factory=dict)
    busy: list[Point] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.interrupted and not any(self.counts.get(k) for k in ("failed", "busy", CORRUPT, "blocked"))


def plan(sweep: Sweep, opts: RunOptions) -> list[tuple[Point, str]]:
    """(point, action): action is run | done | diverged | failed | corrupt (the last two skipped
    unless retry_failed)."""
    out = []
    for p in sweep.points:
        status = point_state(point_dir(opts.results, sweep.name, p))
        if status in FINISHED or (status in ("failed", CORRUPT) and not opts.retry_failed):
            out.append((p, status))
        else:
            out.append((p, "run"))
    return out


def _prepare(sweep: Sweep, opts: RunOptions) -> None:
    """Folders, the manifest, the trainer and the MLflow store, once before any point runs."""
    opts.results = Path(opts.results)
    (opts.results / sweep.name).mkdir(parents=True, exist_ok=True)
    # the trainer's content-hashed caches (tiny models, SFT) live beside the results unless set
    os.environ.setdefault("HARNESS_CACHE", str(opts.results / CACHE))
    folder = opts.results / sweep.name
    found = other_configs(folder, {p.id for p in sweep.points}, sweep.base_config(), sweep.axes)
    if found:
        print(warning_text(folder, found), flush=True)
    # a run of part of the sweep (--seeds) keeps the points an earlier run of the same sweep listed
    try:
        previous = json.loads((folder / SWEEP_MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        previous = None
    atomic_write_json(folder / SWEEP_MANIFEST, merge_manifest(previous, sweep.manifest()))
    resolve_train_fn(opts.train_fn)  # fail early and clearly when the trainer is missing
    opts.env_info = opts.env_info or environment()
    if opts.mlflow_uri:
        try:
            ensure_experiment(opts.mlflow_uri, sweep.name)
        except Exception as e:  # noqa: BLE001 - points retry and warn by themselves
            print(mask_credentials(f"warning: MLflow store {opts.mlflow_uri} not ready: {type(e).__name__}: {e}"))


def run_sweep(sweep: Sweep, opts: RunOptions, progress: Any = None) -> SweepResult:
    """Run every point not finished yet (of a seed budget: look by look, until the verdicts).
    `progress`: a harness.experiments.progress.SweepProgress or None."""
    if opts.max_minutes is not None and opts.deadline is None:
        opts.deadline = time.time() + 60.0 * opts.max_minutes
    if sweep.budget is not None:
        from harness.experiments.sequential import run_looks

        return run_looks(sweep, opts, lambda look: _run_points(look, opts, progress))
    return _run_points(sweep, opts, progress)


def _run_points(sweep: Sweep, opts: RunOptions, progress: Any = None) -> SweepResult:
    """Run every point of `sweep` not finished yet."""
    _prepare(sweep, opts)
    planned = plan(sweep, opts)
    todo = [p for p, action in planned if action == "run"]
    corrupt = [p for p, action in planned if action == CORRUPT]
    counts = {"done": 0, "diverged": 0, "failed": 0, "skipped": len(planned) - len(todo) - len(corrupt), "busy": 0}
    counts.update({CORRUPT: len(corrupt), "elsewhere": 0})
    result = SweepResult(counts)
    for p in corrupt:
        result.errors[p.id] = "corrupt: " + "; ".join(point_problems(point_dir(opts.results, sweep.name, p)))
    if opts.executor is None and opts.workers > 1:
        problem = oversubscription(todo, opts.workers, os.cpu_count() or 1)
        if problem:
            warn(problem, once_key=("oversubscription", sweep.name))
    if progress is not None:
        progress.begin(
            sweep.name, len(planned), counts["skipped"], [p.config.train.updates for p in todo], opts.workers
        )
    try:
        runner = opts.executor or (_run_sequential if opts.workers <= 1 else _run_parallel)
        runner(sweep.name, todo, opts, progress, result)
        if result.busy and not result.interrupted:
            _settle_busy(sweep.name, opts, progress, result)
    finally:
        if progress is not None:
            progress.end()
    return result


def oversubscription(points: list[Point], workers: int, cpus: int) -> str | None:
    """Why `workers` local worker processes running `points` at once would ask for more compute threads than the
    machine's `cpus` (None: they would not). Each point runs train.threads torch threads (0: torch's default,
    one per CPU); threads beyond the CPUs wait for each other at every parallel region, so the points slow
    each other down beyond the cores they share."""
    if workers <= 1 or not points:
        return None
    at_once = min(workers, len(points))
    threads = max(p.config.train.threads or cpus for p in points)
    if at_once * threads <= cpus:
        return None
    fewer = max(1, cpus // at_once)
    other = (
        f", or train.threads {fewer} (another config, so other point ids: a thread count can change a run's rounding)"
        if fewer < threads
        else ""
    )
    return (
        f"--workers {workers} with train.threads {threads} (0 means one per CPU) runs {at_once * threads} compute "
        f"threads on this machine's {cpus} CPUs: the points slow each other beyond sharing the cores; use "
        f"--workers {max(1, cpus // threads)}{other}"
    )


def _cap(result: SweepResult, pending: list[Point]) -> None:
    """The points not started because the time cap passed."""
    result.counts["capped"] = result.counts.get("capped", 0) + len(pending)
    pending.clear()


def _record(result: SweepResult, progress: Any, point: Point, res: dict) -> None:
    status = res["status"]
    result.counts[status] = result.counts.get(status, 0) + 1
    if res.get("reused_from"):
        result.counts["reused"] = result.counts.get("reused", 0) + 1
    if status == "busy":
        result.busy.append(point)
    elif res.get("error"):
        result.errors[point.id] = res["error"]
    if progress is not None:
        progress.point_end(point.id, status, res.get("wall_s"))


def _run_one(sweep: str, point: Point, opts: RunOptions, progress: Any, result: SweepResult, wait: bool) -> bool:
    """One point in this process; False when interrupted."""
    if progress is not None:
        progress.point_start(point.id, point.config.train.updates)
    callback = (lambda info, pid=point.id: progress.point_update(pid, info)) if progress is not None else None
    try:
        res = run_point(point, sweep, opts, callback, wait=wait)
    except KeyboardInterrupt:
        result.interrupted = True
        if progress is not None:
            progress.point_end(point.id, "interrupted")
        return False
    _record(result, progress, point, res)
    return True


def _run_sequential(sweep: str, todo: list[Point], opts: RunOptions, progress: Any, result: SweepResult) -> None:
    for i, point in enumerate(todo):
        if past_deadline(opts):
            _cap(result, todo[i:])
            return
        if not _run_one(sweep, point, opts, progress, result, wait=False):
            return


def _settle_busy(sweep: str, opts: RunOptions, progress: Any, result: SweepResult) -> None:
    """Points another process held: wait until it lets go of each; count it `elsewhere` when that
    process finished it, run it here (resumed) when it was left unfinished."""
    busy, result.busy = result.busy, []
    result.counts["busy"] -= len(busy)
    for point in busy:
        run_dir = point_dir(opts.results, sweep, point)
        try:
            with point_lock(run_dir):  # blocks until the other process lets go
                state = point_state(run_dir)
        except KeyboardInterrupt:
            result.interrupted = True
            return
        if state in FINISHED:
            _record(result, progress, point, {"status": "elsewhere", "wall_s": None, "error": None})
        elif state in ("failed", CORRUPT) and not opts.retry_failed:
            _record(result, progress, point, {"status": state, "error": f"{state} in another process (see {run_dir})"})
        elif not _run_one(sweep, point, opts, progress, result, wait=True):
            return


# ----------------------------------------------------------------------------- worker processes
def _raise_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def _worker(sweep: str, opts: RunOptions, tasks: Any, q: Any) -> None:
    """Worker process: runs the points the parent hands it one after another (imports and
    start-up are paid once per worker, not once per point; a point's numbers do not depend on what
    ran before it in the process, as in a sequential sweep). The parent stops it with SIGTERM (turned
    into KeyboardInterrupt here), so a terminal Ctrl-C reaching the whole process group does not hit
    it twice; None on its queue ends it."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _raise_interrupt)
    while True:
        try:
            point = tasks.get()
        except KeyboardInterrupt:
            return
        if point is None:
            return
        try:
            res = run_point(point, sweep, opts, lambda info, pid=point.id: q.put(("update", pid, dict(info))))
        except KeyboardInterrupt:
            q.put(("end", point.id, {"status": "interrupted", "wall_s": None, "error": None}))
            return
        q.put(("end", point.id, res))


def _mark_crashed(sweep: str, point: Point, opts: RunOptions, exitcode: int | None) -> dict:
    run_dir = point_dir(opts.results, sweep, point)
    run_dir.mkdir(parents=True, exist_ok=True)  # a worker can die before it made its folder (at spawn)
    error = f"worker process died with exit code {exitcode} (killed by the OS, out of memory, or a crash)"
    atomic_write_text(run_dir / TRACEBACK, error + "\n")
    write_status(run_dir, "failed")
    return {"status": "failed", "wall_s": None, "error": error}


@dataclass
class _Slot:
    """One worker process, its own task queue and the point it is running (None while idle)."""

    proc: Any
    tasks: Any
    point: Point | None = None


def _run_parallel(sweep: str, todo: list[Point], opts: RunOptions, progress: Any, result: SweepResult) -> None:
    """`opts.workers` long-lived worker processes; each takes the next pending point when it is
    free. A worker that dies fails only the point it was running and is replaced."""
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    child_opts = RunOptions(
        opts.results, opts.mlflow_uri, spec_string(opts.train_fn), opts.retry_failed, 1, opts.env_info, reuse=opts.reuse
    )
    pending, slots, ended = list(todo), [], {}
    by_id = {p.id: p for p in todo}
    serial = itertools.count()  # worker names, replacements included

    def new_slot() -> _Slot:
        tasks = ctx.SimpleQueue()
        proc = ctx.Process(target=_worker, args=(sweep, child_opts, tasks, q), name=f"harness-worker-{next(serial)}")
        proc.start()
        return _Slot(proc, tasks)

    def handle(msg: tuple) -> None:
        kind, pid, payload = msg
        if kind == "update" and progress is not None:
            progress.point_update(pid, payload)
        elif kind == "end":
            ended[pid] = payload

    def finish(slot: _Slot, res: dict) -> None:
        pid, slot.point = slot.point.id, None
        if res["status"] == "interrupted":
            result.interrupted = True
            if progress is not None:
                progress.point_end(pid, "interrupted")
        else:
            _record(result, progress, by_id[pid], res)

    def reap(stopping: bool = False) -> None:
        for i, slot in enumerate(slots):
            if slot.point is not None and slot.point.id in ended:
                finish(slot, ended.pop(slot.point.id))
            elif slot.point is not None and not slot.proc.is_alive():
                slot.proc.join(timeout=5)
                try:  # drain what it sent before it exited
                    while slot.point.id not in ended:
                        handle(q.get(timeout=0.5))
                    res = ended.pop(slot.point.id)
                except queue_mod.Empty:
                    res = (
                        {"status": "interrupted"}
                        if stopping
                        else _mark_crashed(sweep, slot.point, opts, slot.proc.exitcode)
                    )
                finish(slot, res)
            if slot.point is None and not slot.proc.is_alive() and pending and not stopping:  # a dead worker
                slot.proc.join(timeout=5)
                slots[i] = new_slot()

    try:
        for _ in range(min(opts.workers, len(pending))):
            slots.append(new_slot())
        while pending or any(s.point is not None for s in slots):
            if pending and past_deadline(opts):  # the points in flight finish; no new one starts
                _cap(result, pending)
            for slot in slots:
                if slot.point is None and pending and slot.proc.is_alive():
                    slot.point = pending.pop(0)
                    slot.tasks.put(slot.point)
                    if progress is not None:
                        progress.point_start(slot.point.id, slot.point.config.train.updates)
            try:
                handle(q.get(timeout=0.5))
            except queue_mod.Empty:
                pass
            reap()
        for slot in slots:  # no more work: each worker leaves its loop
            if slot.proc.is_alive():
                slot.tasks.put(None)
        for slot in slots:
            slot.proc.join(timeout=30)
            if slot.proc.is_alive():
                slot.proc.kill()
                slot.proc.join()
    except KeyboardInterrupt:
        result.interrupted = True
        _stop_children([s.proc for s in slots])
        try:
            reap(stopping=True)
        except KeyboardInterrupt:
            pass


def _stop_children(procs: list[Any], grace_s: float = 60.0) -> None:
    """SIGTERM each worker (a running point saves and stays resumable); SIGKILL stragglers."""
    for proc in procs:
        if proc.is_alive():
            os.kill(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    try:
        for proc in procs:
            proc.join(timeout=max(0.1, deadline - time.monotonic()))
    except KeyboardInterrupt:
        pass
    for proc in procs:
        if proc.is_alive():
            proc.kill()
            proc.join()
