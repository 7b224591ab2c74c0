"""What a run writes: metrics.jsonl / samples.jsonl (the source of truth) mirrored to MLflow.

Files are written atomically (a temporary file in the same folder, fsync, `os.replace`), so a
kill leaves either the old or the new content, never half of it. JSONL rows are appended with
flush + fsync; a torn last line left by a kill is ignored when read back.

MLflow: one run per point (experiment = sweep name, run name = point id) with the flattened
config as params and every metric row at step = update. The default store is
`sqlite:///<results>/mlflow.db` (no server); `MLFLOW_TRACKING_URI` overrides it. MLflow trouble
(a locked database, a server down) is reported once and never stops training: metrics.jsonl
is complete either way. On resume, steps after the checkpoint are logged again to the same
MLflow run, so its history can hold two values for those steps; metrics.jsonl holds one.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import sys
import time
import uuid
import warnings
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from harness.config.errors import ConfigWarning
from harness.experiments.redact import mask_credentials

METRICS, SAMPLES, TIMINGS, MLFLOW_RUN_ID = "metrics.jsonl", "samples.jsonl", "timings.jsonl", "mlflow_run_id"
EVAL_TASKS = "eval_tasks.jsonl"  # one row per evaluated episode (paired analysis)
OPEN_TOKEN_TAG = "harness_open_token"  # MLflow tag: which sink created the run (see MlflowSink)
MLFLOW_STATUS = {"done": "FINISHED", "diverged": "FINISHED", "failed": "FAILED", "interrupted": "KILLED"}


# ----------------------------------------------------------------------------- atomic files
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


def atomic_write_text(path: str | Path, text: str) -> None:
    """Replace `path` with `text` all at once (tmp file + fsync + os.replace)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def atomic_write_json(path: str | Path, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=False, default=_jsonable) + "\n")


def _jsonable(value: Any) -> Any:
    """json `default=`: tensors / numpy scalars -> python numbers, paths -> str."""
    if hasattr(value, "item") and callable(value.item):
        return value.item()
    if hasattr(value, "tolist"):
        return value.tolist()
    return str(value)


def append_jsonl(path: str | Path, rows: Iterable[dict]) -> None:
    text = "".join(json.dumps(r, default=_jsonable) + "\n" for r in rows)
    if not text:
        return
    with open(path, "a") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


@contextmanager
def config_warnings_recorded(events: Path, point_id: str) -> Iterator[None]:
    """ConfigWarnings issued inside (the trainer's, e.g. a turn budget the expert cannot finish in)
    go to stderr and to the point's events.jsonl as {"event": "warning"} rows; other warnings are
    shown as usual."""
    previous = warnings.showwarning

    def show(message: Any, category: type, filename: str, lineno: int, file: Any = None, line: Any = None) -> None:
        if not issubclass(category, ConfigWarning):
            previous(message, category, filename, lineno, file, line)
            return
        print(f"warning: {point_id}: {message}", file=sys.stderr, flush=True)
        stamp = datetime.now(UTC).isoformat(timespec="seconds")
        append_jsonl(events, [{"event": "warning", "time": stamp, "message": str(message)}])

    with warnings.catch_warnings():
        warnings.simplefilter("always", ConfigWarning)
        warnings.showwarning = show
        yield


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
    new = "".join(json.dumps(r, default=_jsonable) + "\n" for r in read_jsonl(path) if keep(r))
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


# ----------------------------------------------------------------------------- MLflow
def default_tracking_uri(results_root: str | Path) -> str:
    uri = os.environ.get("MLFLOW_TRACKING_URI")
    if uri:
        return uri
    return f"sqlite:///{(Path(results_root).resolve() / 'mlflow.db')}"


def _artifact_location(uri: str) -> str | None:
    db = _sqlite_path(uri)
    return (db.parent / "mlartifacts").as_uri() if db is not None else None


def _quiet_mlflow() -> None:
    for name in ("mlflow", "alembic", "sqlalchemy"):
        logging.getLogger(name).setLevel(logging.WARNING)


def _client(uri: str):
    _quiet_mlflow()
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=uri)


def _sqlite_path(uri: str) -> Path | None:
    return Path(uri.removeprefix("sqlite:///").split("?")[0]) if uri.startswith("sqlite:///") else None


def ensure_experiment(uri: str, name: str) -> str:
    """Create the store (migrations) and the experiment once, before workers start writing.

    A sqlite store is created under a file lock (<db>.lock): two processes migrating one fresh
    database at once leave it half-created, unusable by every later run."""
    db = _sqlite_path(uri)
    if db is None:
        return _ensure_experiment(uri, name)
    db.parent.mkdir(parents=True, exist_ok=True)
    with file_lock(db.with_name(db.name + ".lock")):
        return _ensure_experiment(uri, name)


def _ensure_experiment(uri: str, name: str) -> str:
    client = _client(uri)
    exp = client.get_experiment_by_name(name)
    if exp is not None:
        return exp.experiment_id
    try:
        location = _artifact_location(uri)
        return client.create_experiment(name, artifact_location=f"{location}/{name}" if location else None)
    except Exception:  # created meanwhile by another process
        exp = client.get_experiment_by_name(name)
        if exp is None:
            raise
        return exp.experiment_id


_BAD_KEY = re.compile(r"[^A-Za-z0-9_\-. /]")


class MlflowSink:
    """One MLflow run; every call is retried a few times, then MLflow is switched off for this run."""

    def __init__(self, uri: str, experiment: str, run_name: str, run_dir: Path, tags: dict[str, str]):
        self.uri, self.run_dir, self.enabled = uri, run_dir, True
        # marks the run this sink creates, so a retry after a create_run that committed but then
        # raised (a busy SQLite store) adopts that run instead of creating a second one
        self.open_token = uuid.uuid4().hex
        self.client = self._retry(_client, uri)
        exp_id = self._retry(ensure_experiment, uri, experiment)
        self.run_id = self._retry(self._open_run, exp_id, run_name, tags) if self.enabled else None

    def _retry(self, fn: Callable, *args: Any) -> Any:
        if not self.enabled:
            return None
        for attempt in range(4):
            try:
                return fn(*args)
            except Exception as e:  # noqa: BLE001 - tracking must never stop training
                if attempt == 3:
                    print(
                        mask_credentials(
                            f"warning: MLflow logging to {self.uri} switched off for this run: "
                            f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
                        ),
                        file=sys.stderr,
                    )
                    self.enabled = False
                    return None
                time.sleep(0.2 * 2**attempt)

    def _open_run(self, exp_id: str, run_name: str, tags: dict[str, str]) -> str:
        id_file = self.run_dir / MLFLOW_RUN_ID
        if id_file.exists():  # resume the run of an earlier attempt when this store has it
            run_id = id_file.read_text().strip()
            try:
                run = self.client.get_run(run_id)
                if run.info.experiment_id == exp_id:
                    self.client.update_run(run_id, status="RUNNING")
                    return run_id
            except Exception:  # noqa: BLE001 - another store: start a new run
                pass
        mine = self.client.search_runs([exp_id], filter_string=f"tags.{OPEN_TOKEN_TAG} = '{self.open_token}'")
        if mine:
            run_id = mine[0].info.run_id
        else:
            run_id = self.client.create_run(exp_id, run_name=run_name, tags={**tags, OPEN_TOKEN_TAG: self.open_token})
            run_id = run_id.info.run_id
        atomic_write_text(id_file, run_id + "\n")
        return run_id

    def log_metrics(self, step: int, metrics: dict[str, Any]) -> None:
        if not self.enabled:
            return
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = [
            Metric(_BAD_KEY.sub("_", k), float(v), now, step) for k, v in metrics.items() if isinstance(v, (int, float))
        ]
        for i in range(0, len(batch), 1000):
            self._retry(lambda b: self.client.log_batch(self.run_id, metrics=b), batch[i : i + 1000])

    def log_params(self, params: dict[str, Any]) -> None:
        if not self.enabled:
            return
        from mlflow.entities import Param

        items = [Param(_BAD_KEY.sub("_", k)[:250], str(v)[:6000]) for k, v in params.items()]
        for i in range(0, len(items), 100):
            self._retry(lambda b: self.client.log_batch(self.run_id, params=b), items[i : i + 100])

    def set_tags(self, tags: dict[str, Any]) -> None:
        if not self.enabled:
            return
        for k, v in tags.items():
            self._retry(self.client.set_tag, self.run_id, k, str(v))

    def close(self, status: str) -> None:
        if not self.enabled:
            return
        self.set_tags({"status": status})
        self._retry(self.client.set_terminated, self.run_id, MLFLOW_STATUS.get(status, "FINISHED"))


# ----------------------------------------------------------------------------- the run logger
def _number(value: Any) -> Any:
    if hasattr(value, "item") and callable(value.item):
        value = value.item()
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    try:
        return float(value) if not isinstance(value, int) else value
    except (TypeError, ValueError):
        return str(value)


class RunLogger:
    """The trainer's only way to record results (see `harness.rl.trainer.train`).

    log(update, metrics)        one metrics.jsonl row {"update": k, **metrics}; MLflow step k
    log_samples(update, rows)   rows of samples.jsonl, each with "update"
    log_eval_tasks(update, rows) one eval_tasks.jsonl row per evaluated episode, each with "update"
    log_timings(update, secs)   one timings.jsonl row {"update": k, **seconds} (wall times vary
                                between identical runs, so they stay out of metrics.jsonl)
    log_params(params)          flat dict -> MLflow params
    truncate_after(update)      on resume: drop rows logged after the checkpoint's update
    close(status)               done / failed / diverged / interrupted

    Rows from an earlier, interrupted attempt with an update >= the first one logged now are
    dropped as well, so a resumed run never holds an update twice even without truncate_after.
    """

    def __init__(
        self,
        run_dir: str | Path,
        *,
        experiment: str | None = None,
        run_name: str | None = None,
        mlflow_uri: str | None = None,
        tags: dict[str, str] | None = None,
    ):
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.paths = {name: self.run_dir / name for name in (METRICS, SAMPLES, TIMINGS, EVAL_TASKS)}
        for path in self.paths.values():
            rewrite_jsonl(path)  # a kill mid-append leaves a torn line
        self._stale = {name: self._max_update(path) for name, path in self.paths.items()}
        self.mlflow: MlflowSink | None = None
        if mlflow_uri:
            self.mlflow = MlflowSink(
                mlflow_uri, experiment or "default", run_name or self.run_dir.name, self.run_dir, dict(tags or {})
            )

    @property
    def metrics_path(self) -> Path:
        return self.paths[METRICS]

    @property
    def samples_path(self) -> Path:
        return self.paths[SAMPLES]

    @staticmethod
    def _max_update(path: Path) -> float:
        updates = [r["update"] for r in read_jsonl(path) if isinstance(r.get("update"), (int, float))]
        return max(updates, default=-math.inf)

    @property
    def last_update(self) -> int | None:
        """The last update in metrics.jsonl (None when empty)."""
        rows = read_jsonl(self.metrics_path)
        return rows[-1]["update"] if rows else None

    def _append(self, name: str, update: int, rows: list[dict]) -> None:
        """Append rows of `update`, first dropping rows of this or later updates an earlier attempt left."""
        if update <= self._stale[name]:
            rewrite_jsonl(self.paths[name], lambda r: r.get("update", -math.inf) < update)
        self._stale[name] = -math.inf
        append_jsonl(self.paths[name], rows)

    def log(self, update: int, metrics: dict[str, Any]) -> None:
        row = {"update": int(update), **{k: _number(v) for k, v in metrics.items()}}
        self._append(METRICS, update, [row])
        if self.mlflow is not None:
            self.mlflow.log_metrics(int(update), {k: v for k, v in row.items() if k != "update"})

    def log_samples(self, update: int, rows: list[dict]) -> None:
        self._append(SAMPLES, update, [{"update": int(update), **r} for r in rows])

    def log_timings(self, update: int, seconds: dict[str, float]) -> None:
        self._append(TIMINGS, update, [{"update": int(update), **seconds}])

    def log_eval_tasks(self, update: int, rows: list[dict]) -> None:
        self._append(EVAL_TASKS, update, [{**r, "update": int(update)} for r in rows])

    def log_params(self, params: dict[str, Any]) -> None:
        if self.mlflow is not None:
            self.mlflow.log_params(params)

    def truncate_after(self, update: int) -> None:
        """Keep only rows with update <= `update` (the checkpoint the run resumes from)."""
        for name, path in self.paths.items():
            rewrite_jsonl(path, lambda r: r.get("update", math.inf) <= update)
            self._stale[name] = -math.inf

    def close(self, status: str) -> None:
        if self.mlflow is not None:
            self.mlflow.close(status)
