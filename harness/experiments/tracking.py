"""What a run writes: metrics.jsonl / samples.jsonl (the source of truth) mirrored to MLflow.

The files are written through harness.store (atomic writes, JSONL rows keyed by update, locks);
this module adds MLflow and the run logger the trainer calls.

MLflow: one run per point (experiment = sweep name, run name = point id) with the flattened
config as params and every metric row at step = update. The default store is
`sqlite:///<results>/mlflow.db` (no server); `MLFLOW_TRACKING_URI` overrides it. MLflow trouble
(a locked database, a server down) is reported once and never stops training: metrics.jsonl
is complete either way. On resume, steps after the checkpoint are logged again to the same
MLflow run, so its history can hold two values for those steps; metrics.jsonl holds one.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import time
import uuid
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from harness.config.errors import ConfigWarning
from harness.experiments.redact import mask_credentials

# The file helpers live in harness.store; they stay importable from here for existing callers.
from harness.store import (  # noqa: F401
    EVAL_TASKS,
    METRICS,
    MLFLOW_DB,
    MLFLOW_RUN_ID,
    SAMPLES,
    TIMINGS,
    PointLogs,
    append_jsonl,
    atomic_write_json,
    atomic_write_text,
    file_lock,
    read_jsonl,
    rewrite_jsonl,
)

OPEN_TOKEN_TAG = "harness_open_token"  # MLflow tag: which sink created the run (see MlflowSink)
MLFLOW_STATUS = {"done": "FINISHED", "diverged": "FINISHED", "failed": "FAILED", "interrupted": "KILLED"}


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


# ----------------------------------------------------------------------------- MLflow
def default_tracking_uri(results_root: str | Path) -> str:
    uri = os.environ.get("MLFLOW_TRACKING_URI")
    if uri:
        return uri
    return f"sqlite:///{(Path(results_root).resolve() / MLFLOW_DB)}"


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

    The files are a harness.store.PointLogs: a resumed run never holds an update twice, even
    without truncate_after.
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
        self.logs = PointLogs(run_dir)
        self.run_dir, self.paths = self.logs.run_dir, self.logs.paths
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

    @property
    def last_update(self) -> int | None:
        """The last update in metrics.jsonl (None when empty)."""
        return self.logs.last_update

    def log(self, update: int, metrics: dict[str, Any]) -> None:
        row = {"update": int(update), **{k: _number(v) for k, v in metrics.items()}}
        self.logs.append(METRICS, update, [row])
        if self.mlflow is not None:
            self.mlflow.log_metrics(int(update), {k: v for k, v in row.items() if k != "update"})

    def log_samples(self, update: int, rows: list[dict]) -> None:
        self.logs.append(SAMPLES, update, [{"update": int(update), **r} for r in rows])

    def log_timings(self, update: int, seconds: dict[str, float]) -> None:
        self.logs.append(TIMINGS, update, [{"update": int(update), **seconds}])

    def log_eval_tasks(self, update: int, rows: list[dict]) -> None:
        self.logs.append(EVAL_TASKS, update, [{**r, "update": int(update)} for r in rows])

    def log_params(self, params: dict[str, Any]) -> None:
        if self.mlflow is not None:
            self.mlflow.log_params(params)

    def truncate_after(self, update: int) -> None:
        """Keep only rows with update <= `update` (the checkpoint the run resumes from)."""
        self.logs.truncate_after(update)

    def close(self, status: str) -> None:
        if self.mlflow is not None:
            self.mlflow.close(status)
