"""Run the points of a sweep: one after another in this process, or `workers` spawned processes.

Each point owns results/<sweep>/<point_id>/:
    config.yaml     the resolved config            summary.json   metrics, status, timings, provenance
    metrics.jsonl   one row per update              samples.jsonl  sampled episodes
    status          running | done | failed | diverged | pruned   (written last: the commit marker)
    traceback.txt   on failure                      events.jsonl   one row per attempt start / end
    checkpoint/     the trainer's, for resuming     mlflow_run_id  the MLflow run to continue
Re-running skips done and diverged points, retries failed ones only with `retry_failed`, and
resumes interrupted ones (status still `running`; the trainer resumes from checkpoint/).
A failing point never stops the sweep. Ctrl-C (or SIGTERM) stops cleanly: running points keep
status `running` and resume next time.

Hooks: an exception with a string attribute `point_status` ends a point with that status instead of
`failed` (harness tune's pruned trials: `pruned`); `RunOptions.executor` replaces the local process
pool (harness.experiments.ray_backend); `RunOptions.tags` are added to the MLflow run's tags.

Testing hook: the environment variable HARNESS_TRAIN_FN="module:function" replaces
`harness.rl.trainer:train` (same signature), e.g. a small deterministic fake trainer in tests.
"""

from __future__ import annotations

import importlib
import multiprocessing as mp
import os
import queue as queue_mod
import signal
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from harness.config.errors import Diverged, UnavailableError
from harness.experiments.base_config import other_configs, warning_text
from harness.experiments.loading import dump_config, flatten
from harness.experiments.provenance import environment
from harness.experiments.sweep import Point, Sweep
from harness.experiments.tracking import (
    RunLogger,
    append_jsonl,
    atomic_write_json,
    atomic_write_text,
    config_warnings_recorded,
    ensure_experiment,
    read_jsonl,
)

STATUS, SUMMARY, CONFIG, TRACEBACK, EVENTS, LOCK = (
    "status",
    "summary.json",
    "config.yaml",
    "traceback.txt",
    "events.jsonl",
    ".lock",
)
FINISHED = ("done", "diverged")
DEFAULT_TRAIN_FN = "harness.rl.trainer:train"
TrainFn = Callable[..., dict]


@dataclass
class RunOptions:
    results: Path = Path("results")
    mlflow_uri: str | None = None  # None: MLflow off
    train_fn: str | TrainFn | None = None  # None: $HARNESS_TRAIN_FN or harness.rl.trainer:train
    retry_failed: bool = False
    workers: int = 1
    env_info: dict[str, Any] = field(default_factory=dict)  # provenance, computed once per sweep
    tags: dict[str, str] = field(default_factory=dict)  # extra MLflow run tags (e.g. study, trial)
    executor: Callable[..., None] | None = None  # (sweep, todo, opts, progress, result); e.g. the Ray backend


# ----------------------------------------------------------------------------- helpers
def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def train_fn_spec(train_fn: str | TrainFn | None) -> str | TrainFn:
    return train_fn or os.environ.get("HARNESS_TRAIN_FN") or DEFAULT_TRAIN_FN


def resolve_train_fn(train_fn: str | TrainFn | None) -> TrainFn:
    """A callable, or "module:function" imported now; a missing trainer is a one-line error."""
    spec = train_fn_spec(train_fn)
    if callable(spec):
        return spec
    module_name, _, attr = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name and (module_name == e.name or module_name.startswith(e.name + ".")):
            raise UnavailableError(f"the trainer {spec!r} cannot be imported ({e}); check HARNESS_TRAIN_FN") from None
        raise
    fn = getattr(module, attr or "train", None)
    if not callable(fn):
        raise UnavailableError(f"{module_name} has no function {attr or 'train'!r} (from {spec!r})")
    return fn


def _diverged_types(train: TrainFn) -> tuple[type, ...]:
    """harness.config.errors.Diverged and the `Diverged` the trainer's module exports (the contract names
    `harness.rl.trainer.Diverged`)."""
    own = getattr(sys.modules.get(getattr(train, "__module__", ""), None), "Diverged", None)
    return (Diverged, own) if isinstance(own, type) and issubclass(own, BaseException) else (Diverged,)


def _spec_string(train_fn: str | TrainFn | None) -> str:
    spec = train_fn_spec(train_fn)
    return spec if isinstance(spec, str) else f"{spec.__module__}:{spec.__qualname__}"


def read_status(run_dir: Path) -> str | None:
    try:
        return (run_dir / STATUS).read_text().strip() or None
    except OSError:
        return None


def point_dir(results: Path, sweep_name: str, point: Point) -> Path:
    return Path(results) / sweep_name / point.id


@contextmanager
def _point_lock(run_dir: Path) -> Iterator[bool]:
    """An exclusive lock, so two sweeps sharing a results folder never run one point twice."""
    try:
        import fcntl
    except ImportError:  # not POSIX: no lock
        yield True
        return
    fd = os.open(run_dir / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            yield False
            return
        yield True
    finally:
        os.close(fd)


# ----------------------------------------------------------------------------- one point
def _summary(
    point: Point,
    sweep: str,
    status: str,
    metrics: dict,
    error: str | None,
    started: str,
    wall_s: float,
    run_dir: Path,
    env_info: dict,
) -> dict[str, Any]:
    events = read_jsonl(run_dir / EVENTS)
    starts = [e for e in events if e.get("event") == "start"]
    rows = read_jsonl(run_dir / "metrics.jsonl")
    return {
        "point_id": point.id,
        "sweep": sweep,
        "variant": point.variant,
        "label": point.label,
        "seed": point.seed,
        "overrides": point.overrides,
        "is_baseline": point.is_baseline,
        "status": status,
        "error": error,
        "metrics": metrics,
        "updates_logged": len(rows),
        "config_hash": point.config_hash,
        "timings": {
            "first_started_at": starts[0]["time"] if starts else started,
            "started_at": started,
            "finished_at": now_iso(),
            "wall_s": round(wall_s, 3),
            "attempts": len(starts),
        },
        **(env_info or environment()),
    }


def run_point(
    point: Point, sweep: str, opts: RunOptions, progress: Callable[[dict], None] | None = None
) -> dict[str, Any]:
    """Run (or resume) one point in this process; returns {"status", "wall_s", "error"}.

    KeyboardInterrupt propagates after the point is left resumable (status stays `running`)."""
    from harness.rl.seeding import seed_everything

    run_dir = point_dir(opts.results, sweep, point)
    run_dir.mkdir(parents=True, exist_ok=True)
    with _point_lock(run_dir) as locked:
        if not locked:
            return {"status": "busy", "wall_s": 0.0, "error": "running in another process"}
        if read_status(run_dir) in FINISHED:
            return {"status": "skipped", "wall_s": 0.0, "error": None}
        started, t0 = now_iso(), time.monotonic()
        atomic_write_text(run_dir / CONFIG, dump_config(point.config))
        atomic_write_text(run_dir / STATUS, "running\n")
        (run_dir / TRACEBACK).unlink(missing_ok=True)
        append_jsonl(
            run_dir / EVENTS,
            [{"event": "start", "time": started, "pid": os.getpid(), "resume": (run_dir / "checkpoint").exists()}],
        )
        logger, metrics, error, diverged = None, {}, None, (Diverged,)
        try:
            train = resolve_train_fn(opts.train_fn)
            diverged = _diverged_types(train)
            tags = {
                "point_id": point.id,
                "sweep": sweep,
                "variant": point.variant,
                "config_hash": point.config_hash,
                "seed": str(point.seed),
                **opts.tags,
            }
            uri = opts.mlflow_uri if point.config.tracking.mlflow else None
            logger = RunLogger(run_dir, experiment=sweep, run_name=point.id, mlflow_uri=uri, tags=tags)
            logger.log_params(flatten(point.config.model_dump(mode="json")))
            seed_everything(point.config.train.seed)
            with config_warnings_recorded(run_dir / EVENTS, point.id):
                metrics = dict(train(point.config, run_dir, logger, progress) or {})
            status = "done"
        except KeyboardInterrupt:
            append_jsonl(run_dir / EVENTS, [{"event": "interrupted", "time": now_iso()}])
            if logger is not None:
                logger.close("interrupted")
            raise
        except Exception as e:  # noqa: BLE001 - a failing point never stops the sweep
            if isinstance(e, diverged):
                status, metrics, error = "diverged", dict(getattr(e, "summary", None) or {}), str(e)
            elif isinstance(getattr(e, "point_status", None), str):  # a stop the caller asked for (a pruned trial)
                status, metrics, error = e.point_status, dict(getattr(e, "summary", None) or {}), str(e) or None
            else:
                status, error = "failed", f"{type(e).__name__}: {e}"
                atomic_write_text(run_dir / TRACEBACK, traceback.format_exc())
        wall = time.monotonic() - t0
        atomic_write_json(
            run_dir / SUMMARY, _summary(point, sweep, status, metrics, error, started, wall, run_dir, opts.env_info)
        )
        if logger is not None:
            logger.close(status)
        append_jsonl(run_dir / EVENTS, [{"event": "end", "time": now_iso(), "status": status}])
        atomic_write_text(run_dir / STATUS, status + "\n")
        return {"status": status, "wall_s": wall, "error": error}


# ----------------------------------------------------------------------------- a sweep
@dataclass
class SweepResult:
    counts: dict[str, int]
    interrupted: bool = False
    errors: dict[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.interrupted and not self.counts.get("failed") and not self.counts.get("busy")


def plan(sweep: Sweep, opts: RunOptions) -> list[tuple[Point, str]]:
    """(point, action): action is run | done | diverged | failed (skipped unless retry_failed)."""
    out = []
    for p in sweep.points:
        status = read_status(point_dir(opts.results, sweep.name, p))
        if status in FINISHED or (status == "failed" and not opts.retry_failed):
            out.append((p, status))
        else:
            out.append((p, "run"))
    return out


def run_sweep(sweep: Sweep, opts: RunOptions, progress: Any = None) -> SweepResult:
    """Run every point not finished yet. `progress`: a harness.experiments.progress.SweepProgress or None."""
    opts.results = Path(opts.results)
    (opts.results / sweep.name).mkdir(parents=True, exist_ok=True)
    # the trainer's content-hashed caches (tiny models, SFT) live beside the results unless set
    os.environ.setdefault("HARNESS_CACHE", str(opts.results / ".cache"))
    folder = opts.results / sweep.name
    found = other_configs(folder, {p.id for p in sweep.points}, sweep.base_config(), sweep.axes)
    if found:
        print(warning_text(folder, found), flush=True)
    atomic_write_json(folder / "sweep.json", sweep.manifest())
    resolve_train_fn(opts.train_fn)  # fail early and clearly when the trainer is missing
    opts.env_info = opts.env_info or environment()
    if opts.mlflow_uri:
        try:
            ensure_experiment(opts.mlflow_uri, sweep.name)
        except Exception as e:  # noqa: BLE001 - points retry and warn by themselves
            print(f"warning: MLflow store {opts.mlflow_uri} not ready: {type(e).__name__}: {e}")
    planned = plan(sweep, opts)
    todo = [p for p, action in planned if action == "run"]
    counts = {"done": 0, "diverged": 0, "failed": 0, "skipped": len(planned) - len(todo), "busy": 0}
    if progress is not None:
        progress.begin(
            sweep.name, len(planned), counts["skipped"], [p.config.train.updates for p in todo], opts.workers
        )
    result = SweepResult(counts)
    try:
        runner = opts.executor or (_run_sequential if opts.workers <= 1 else _run_parallel)
        runner(sweep.name, todo, opts, progress, result)
    finally:
        if progress is not None:
            progress.end()
    return result


def _record(result: SweepResult, progress: Any, pid: str, res: dict) -> None:
    status = res["status"]
    result.counts[status] = result.counts.get(status, 0) + 1
    if res.get("error"):
        result.errors[pid] = res["error"]
    if progress is not None:
        progress.point_end(pid, status, res.get("wall_s"))


def _run_sequential(sweep: str, todo: list[Point], opts: RunOptions, progress: Any, result: SweepResult) -> None:
    for point in todo:
        if progress is not None:
            progress.point_start(point.id, point.config.train.updates)
        callback = (lambda info, pid=point.id: progress.point_update(pid, info)) if progress is not None else None
        try:
            res = run_point(point, sweep, opts, callback)
        except KeyboardInterrupt:
            result.interrupted = True
            if progress is not None:
                progress.point_end(point.id, "interrupted")
            return
        _record(result, progress, point.id, res)


# ----------------------------------------------------------------------------- worker processes
def _raise_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def _child(point: Point, sweep: str, opts: RunOptions, q: Any) -> None:
    """Worker process: the parent stops it with SIGTERM (turned into KeyboardInterrupt here), so a
    terminal Ctrl-C reaching the whole process group does not hit it twice."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        res = run_point(point, sweep, opts, lambda info: q.put(("update", point.id, dict(info))))
    except KeyboardInterrupt:
        res = {"status": "interrupted", "wall_s": None, "error": None}
    q.put(("end", point.id, res))


def _mark_crashed(sweep: str, point: Point, opts: RunOptions, exitcode: int | None) -> dict:
    run_dir = point_dir(opts.results, sweep, point)
    error = f"worker process died with exit code {exitcode} (killed by the OS, out of memory, or a crash)"
    atomic_write_text(run_dir / TRACEBACK, error + "\n")
    atomic_write_text(run_dir / STATUS, "failed\n")
    return {"status": "failed", "wall_s": None, "error": error}


def _run_parallel(sweep: str, todo: list[Point], opts: RunOptions, progress: Any, result: SweepResult) -> None:
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    child_opts = RunOptions(
        opts.results, opts.mlflow_uri, _spec_string(opts.train_fn), opts.retry_failed, 1, opts.env_info
    )
    pending, active, ended = list(todo), {}, {}
    by_id = {p.id: p for p in todo}

    def handle(msg: tuple) -> None:
        kind, pid, payload = msg
        if kind == "update" and progress is not None:
            progress.point_update(pid, payload)
        elif kind == "end":
            ended[pid] = payload

    def reap(stopping: bool = False) -> None:
        for pid, proc in list(active.items()):
            if pid not in ended and proc.is_alive():
                continue
            proc.join(timeout=5)
            if pid not in ended:  # drain what it sent before it exited
                try:
                    while pid not in ended:
                        handle(q.get(timeout=0.5))
                except queue_mod.Empty:
                    ended[pid] = (
                        {"status": "interrupted"} if stopping else _mark_crashed(sweep, by_id[pid], opts, proc.exitcode)
                    )
            del active[pid]
            res = ended.pop(pid)
            if res["status"] == "interrupted":
                result.interrupted = True
                if progress is not None:
                    progress.point_end(pid, "interrupted")
            else:
                _record(result, progress, pid, res)

    try:
        while pending or active:
            while pending and len(active) < opts.workers:
                point = pending.pop(0)
                proc = ctx.Process(target=_child, args=(point, sweep, child_opts, q), name=f"harness-{point.id}")
                proc.start()
                active[point.id] = proc
                if progress is not None:
                    progress.point_start(point.id, point.config.train.updates)
            try:
                handle(q.get(timeout=0.5))
            except queue_mod.Empty:
                pass
            reap()
    except KeyboardInterrupt:
        result.interrupted = True
        _stop_children(active)
        try:
            reap(stopping=True)
        except KeyboardInterrupt:
            pass


def _stop_children(active: dict[str, Any], grace_s: float = 60.0) -> None:
    """SIGTERM each running worker (it saves and leaves its point resumable); SIGKILL stragglers."""
    for proc in active.values():
        if proc.is_alive():
            os.kill(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    try:
        for proc in active.values():
            proc.join(timeout=max(0.1, deadline - time.monotonic()))
    except KeyboardInterrupt:
        pass
    for proc in active.values():
        if proc.is_alive():
            proc.kill()
            proc.join()
