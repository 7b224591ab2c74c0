"""Run one point of a sweep in this process: its folder, its lock, its status and summary.

Each point owns results/<sweep>/<point_id>/ (its files are named in harness.store.layout): the
resolved config, the logs the trainer writes through its RunLogger, summary.json, events.jsonl (one
row per attempt start / end), traceback.txt on failure, and the status file, written last: the
commit marker. A finished point whose files are damaged (harness.store.integrity) is `corrupt`:
running it again moves its files to <point>/.corrupt/<time>/ and starts it from scratch.

Hooks: an exception with a string attribute `point_status` ends a point with that status instead of
`failed` (harness tune's pruned trials: `pruned`); `RunOptions.tags` are added to the MLflow run's tags.

Testing hook: with HARNESS_TESTING=1 in the environment (tests/conftest.py sets it), the variable
HARNESS_TRAIN_FN="module:function" replaces `harness.rl.trainer:train` (same signature), e.g. a
small deterministic fake trainer; without HARNESS_TESTING=1 it is ignored, with a warning.
"""

from __future__ import annotations

import importlib
import json
import os
import shutil
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from harness.config.errors import Diverged, UnavailableError
from harness.config.keys import flatten
from harness.config.loading import dump_config
from harness.experiments.provenance import environment
from harness.experiments.sweep import Point
from harness.experiments.tracking import RunLogger, config_warnings_recorded
from harness.store import (
    ADAPTER,
    CHECKPOINT,
    CONFIG,
    CORRUPT,
    EVAL_TASKS,
    EVENTS,
    FINISHED,
    METRICS,
    SAMPLES,
    SUMMARY,
    TIMINGS,
    TRACEBACK,
    append_jsonl,
    atomic_write_json,
    atomic_write_text,
    point_lock,
    point_problems,
    quarantine,
    read_jsonl,
    write_status,
)
from harness.store import read_status as _read_status

DEFAULT_TRAIN_FN = "harness.rl.trainer:train"
TrainFn = Callable[..., dict]


@dataclass
class RunOptions:
    results: Path = Path("results")
    mlflow_uri: str | None = None  # None: MLflow off
    train_fn: str | TrainFn | None = None  # None: harness.rl.trainer:train (or the testing hook, see above)
    retry_failed: bool = False  # also run failed and corrupt points again
    workers: int = 1
    env_info: dict[str, Any] = field(default_factory=dict)  # provenance, computed once per sweep
    tags: dict[str, str] = field(default_factory=dict)  # extra MLflow run tags (e.g. study, trial)
    executor: Callable[..., None] | None = None  # (sweep, todo, opts, progress, result); e.g. the Ray backend
    reuse: bool = True  # copy an identical finished CPU run from another sweep folder (`find_donor`)
    # --max-minutes: a time cap; once `deadline` (time.time(), set by run_sweep) has passed no new point
    # or look starts, points in flight finish, and the same command later resumes (harness.experiments.runner)
    max_minutes: float | None = None
    deadline: float | None = None


def past_deadline(opts: RunOptions) -> bool:
    """True once the time cap of this run (opts.deadline, `harness sweep --max-minutes`) has passed."""
    return opts.deadline is not None and time.time() >= opts.deadline


# ----------------------------------------------------------------------------- the trainer
def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def testing() -> bool:
    return os.environ.get("HARNESS_TESTING") == "1"


def train_fn_spec(train_fn: str | TrainFn | None) -> str | TrainFn:
    if train_fn:
        return train_fn
    hook = os.environ.get("HARNESS_TRAIN_FN")
    if hook and testing():
        return hook
    if hook:
        print(
            f"warning: HARNESS_TRAIN_FN={hook} ignored: it is a testing hook, honoured only with HARNESS_TESTING=1",
            file=sys.stderr,
        )
    return DEFAULT_TRAIN_FN


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


def spec_string(train_fn: str | TrainFn | None) -> str:
    """The trainer as "module:function", for worker processes and Ray tasks (which get it explicitly)."""
    spec = train_fn_spec(train_fn)
    return spec if isinstance(spec, str) else f"{spec.__module__}:{spec.__qualname__}"


def _diverged_types(train: TrainFn) -> tuple[type, ...]:
    """harness.config.errors.Diverged and the `Diverged` the trainer's module exports (the contract names
    `harness.rl.trainer.Diverged`)."""
    own = getattr(sys.modules.get(getattr(train, "__module__", ""), None), "Diverged", None)
    return (Diverged, own) if isinstance(own, type) and issubclass(own, BaseException) else (Diverged,)


# ----------------------------------------------------------------------------- status
def read_status(run_dir: Path) -> str | None:
    """The status word, None without one, `corrupt` when the status file is damaged."""
    word, damaged = _read_status(run_dir)
    return CORRUPT if damaged else word


def point_state(run_dir: Path) -> str | None:
    """read_status, and `corrupt` for a finished point whose files are damaged (harness.store.integrity)."""
    return CORRUPT if point_problems(run_dir) else read_status(run_dir)


def point_dir(results: Path, sweep_name: str, point: Point) -> Path:
    return Path(results) / sweep_name / point.id


# ----------------------------------------------------------------------------- one point
def _summary(point: Point, sweep: str, status: str, metrics: dict, error: str | None, run: dict) -> dict[str, Any]:
    """run: started (ISO time), wall_s, run_dir, env_info."""
    run_dir = run["run_dir"]
    starts = [e for e in read_jsonl(run_dir / EVENTS) if e.get("event") == "start"]
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
        "updates_logged": len(read_jsonl(run_dir / METRICS)),
        "config_hash": point.config_hash,
        "timings": {
            "first_started_at": starts[0]["time"] if starts else run["started"],
            "started_at": run["started"],
            "finished_at": now_iso(),
            "wall_s": round(run["wall_s"], 3),
            "attempts": len(starts),
        },
        **(run["env_info"] or environment()),
    }


def _start(point: Point, run_dir: Path) -> str:
    """Mark the point running (config, status, an event); returns the start time."""
    started = now_iso()
    if point_state(run_dir) == CORRUPT:
        quarantine(run_dir)
    atomic_write_text(run_dir / CONFIG, dump_config(point.config))
    write_status(run_dir, "running")
    (run_dir / TRACEBACK).unlink(missing_ok=True)
    resume = (run_dir / CHECKPOINT).exists()
    append_jsonl(run_dir / EVENTS, [{"event": "start", "time": started, "pid": os.getpid(), "resume": resume}])
    return started


def run_point(
    point: Point,
    sweep: str,
    opts: RunOptions,
    progress: Callable[[dict], None] | None = None,
    wait: bool = False,
) -> dict[str, Any]:
    """Run (or resume) one point in this process; returns {"status", "wall_s", "error"}.

    Status `skipped`: finished before; `busy`: another process holds the point (with `wait`, this
    waits for it to let go instead). A corrupt point runs from scratch (see `quarantine`).
    KeyboardInterrupt propagates after the point is left resumable (status stays `running`)."""
    run_dir = point_dir(opts.results, sweep, point)
    run_dir.mkdir(parents=True, exist_ok=True)
    with point_lock(run_dir, blocking=wait) as locked:
        if not locked:
            return {"status": "busy", "wall_s": 0.0, "error": "running in another process"}
        if point_state(run_dir) in FINISHED:
            return {"status": "skipped", "wall_s": 0.0, "error": None}
        t0 = time.monotonic()
        started = _start(point, run_dir)
        donor = find_donor(point, sweep, opts)
        if donor is not None:
            status, metrics, error, logger = _reuse(point, sweep, opts, run_dir, donor)
        else:
            status, metrics, error, logger = _train(point, sweep, opts, run_dir, progress)
        run = {"started": started, "wall_s": time.monotonic() - t0, "run_dir": run_dir, "env_info": opts.env_info}
        atomic_write_json(run_dir / SUMMARY, _summary(point, sweep, status, metrics, error, run))
        if logger is not None:
            logger.close(status)
        append_jsonl(run_dir / EVENTS, [{"event": "end", "time": now_iso(), "status": status}])
        write_status(run_dir, status)
        out = {"status": status, "wall_s": run["wall_s"], "error": error}
        return {**out, "reused_from": str(donor)} if donor is not None else out


# ----------------------------------------------------------------------------- reuse
# A CPU run is a function of its resolved config, the code, the packages and the CPU's code path
# (provenance.cpu_code_path): two runs that agree on all of them write the same metrics bit for bit.
# So a point finished in another sweep folder of the same results root (the baseline every sweep of
# one base config shares) is copied instead of trained again. Its cost columns stay the donor's.
SAME_RUN_KEYS = ("code_version", "packages", "cpu", "accelerator")
COPIED_LOGS = (METRICS, SAMPLES, TIMINGS, EVAL_TASKS)


def find_donor(point: Point, sweep: str, opts: RunOptions) -> Path | None:
    """A finished identical run of `point` in another sweep folder under opts.results, or None: same
    config hash and config.yaml, status done and intact, and the same code (a git commit, and the same
    uncommitted diff), packages and CPU code path; CPU runs only (a GPU run does not repeat its bits)."""
    env = opts.env_info or environment()
    on_cpu = point.config.train.device == "cpu" or (point.config.train.device == "auto" and not env.get("accelerator"))
    if not opts.reuse or not on_cpu:
        return None
    if not (env.get("code_version") or {}).get("commit"):
        return None  # outside a git checkout the code's identity is unknown
    config_text = dump_config(point.config)
    for cand in sorted(Path(opts.results).glob(f"*/*__{point.config_hash}")):
        if cand.parent.name == sweep or read_status(cand) != "done" or point_problems(cand):
            continue
        try:
            summary = json.loads((cand / SUMMARY).read_text())
            same_config = (cand / CONFIG).read_text() == config_text
        except (OSError, ValueError):
            continue
        if same_config and summary.get("config_hash") == point.config_hash and not summary.get("error"):
            if all(summary.get(k) == env.get(k) for k in SAME_RUN_KEYS):
                return cand
    return None


def _point_logger(point: Point, sweep: str, opts: RunOptions, run_dir: Path, **extra_tags: str) -> RunLogger:
    tags = {
        "point_id": point.id,
        "sweep": sweep,
        "variant": point.variant,
        "config_hash": point.config_hash,
        "seed": str(point.seed),
        **opts.tags,
        **extra_tags,
    }
    uri = opts.mlflow_uri if point.config.tracking.mlflow else None
    logger = RunLogger(run_dir, experiment=sweep, run_name=point.id, mlflow_uri=uri, tags=tags)
    if logger.mlflow is not None and opts.tags:
        # a resumed MLflow run keeps the tags of its first attempt: a trial that resumes another
        # trial's point (harness tune) must be tagged with its own number, as --show lists it
        logger.mlflow.set_tags(opts.tags)
    logger.log_params(flatten(point.config.model_dump(mode="json")))
    return logger


def _reuse(
    point: Point, sweep: str, opts: RunOptions, run_dir: Path, donor: Path
) -> tuple[str, dict, str | None, RunLogger | None]:
    """Copy `donor`'s logs (through the logger, so MLflow gets the same metrics) and adapter."""
    source = os.path.relpath(donor, opts.results)
    logger = _point_logger(point, sweep, opts, run_dir, reused_from=source)
    log = {
        METRICS: lambda u, rows: logger.log(u, {k: v for k, v in rows[0].items() if k != "update"}),
        SAMPLES: logger.log_samples,
        TIMINGS: lambda u, rows: logger.log_timings(u, {k: v for k, v in rows[0].items() if k != "update"}),
        EVAL_TASKS: logger.log_eval_tasks,
    }
    for name in COPIED_LOGS:
        by_update: dict[int, list[dict]] = {}
        for row in read_jsonl(donor / name):
            by_update.setdefault(int(row["update"]), []).append(row)
        for update, rows in by_update.items():
            log[name](update, rows)
    if (donor / ADAPTER).is_dir():
        shutil.copytree(donor / ADAPTER, run_dir / ADAPTER, dirs_exist_ok=True)
    append_jsonl(run_dir / EVENTS, [{"event": "reused", "time": now_iso(), "from": source}])
    metrics = dict(json.loads((donor / SUMMARY).read_text()).get("metrics") or {})
    return "done", metrics, None, logger


def _train(
    point: Point, sweep: str, opts: RunOptions, run_dir: Path, progress: Callable[[dict], None] | None
) -> tuple[str, dict, str | None, RunLogger | None]:
    """The trainer on one point: (status, summary metrics, error, the logger to close). The trainer
    seeds its process itself (harness.rl.trainer), so the point is not seeded here."""
    logger, diverged = None, (Diverged,)
    try:
        train = resolve_train_fn(opts.train_fn)
        diverged = _diverged_types(train)
        logger = _point_logger(point, sweep, opts, run_dir)
        with config_warnings_recorded(run_dir / EVENTS, point.id):
            metrics = dict(train(point.config, run_dir, logger, progress) or {})
        return "done", metrics, None, logger
    except KeyboardInterrupt:
        append_jsonl(run_dir / EVENTS, [{"event": "interrupted", "time": now_iso()}])
        if logger is not None:
            logger.close("interrupted")
        raise
    except Exception as e:  # noqa: BLE001 - a failing point never stops the sweep
        if isinstance(e, diverged):
            return "diverged", dict(getattr(e, "summary", None) or {}), str(e), logger
        if isinstance(getattr(e, "point_status", None), str):  # a stop the caller asked for (a pruned trial)
            return e.point_status, dict(getattr(e, "summary", None) or {}), str(e) or None, logger
        atomic_write_text(run_dir / TRACEBACK, traceback.format_exc())
        return "failed", {}, f"{type(e).__name__}: {e}", logger
