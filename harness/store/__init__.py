"""The results folder: its file names and status words, atomic writes, JSONL rows, locks, the
update-keyed logs of a point, and the integrity checks. The one owner of the folder format:
harness.experiments writes through it, analysis reads through it.

    layout     names of the results, sweep and point folders; status words; the status file;
               the point lock; which folders are points and sweeps
    files      atomic writes, JSONL append / read / rewrite, file locks
    logs       PointLogs: metrics / samples / timings / eval_tasks rows keyed by update
    integrity  which finished points hold damaged files; quarantine of such a point

Why here, as the bottom layer of harness/ (below config) rather than in analysis/: the writer's
half (atomic writes, locks, the resume rules of the logs) belongs to the package that runs
points, and analysis only reads; kept in analysis/, the runner would write results through the
package of tables and plots. Both sides need it, so it sits below everything and imports nothing
first-party (standard library and PyYAML only): analysis may import this package, and no other
part of harness (tests/test_layers.py), so reading results never loads the trainer, torch or
pandas.
"""

from harness.store.files import (
    append_jsonl,
    atomic_write_json,
    atomic_write_text,
    file_lock,
    jsonl_text,
    read_jsonl,
    replace_folder,
    rewrite_jsonl,
)
from harness.store.integrity import CorruptPoint, check_sweep, point_problems, quarantine
from harness.store.layout import (
    ADAPTER,
    CACHE,
    CHECKPOINT,
    CONFIG,
    CORRUPT,
    EVAL_DIR,
    EVAL_TASKS,
    EVENTS,
    FINISHED,
    LOCK,
    LOOKS,
    METRICS,
    MLFLOW_DB,
    MLFLOW_RUN_ID,
    OPTUNA_DB,
    POINT_FILES,
    QUARANTINE,
    SAMPLES,
    STATUS,
    STATUSES,
    SUMMARY,
    SWEEP_MANIFEST,
    TIMINGS,
    TRACEBACK,
    UPDATE_LOGS,
    is_point_dir,
    is_sweep_dir,
    point_dirs,
    point_lock,
    read_status,
    sweep_folders,
    write_status,
)
from harness.store.logs import PointLogs

__all__ = [
    "ADAPTER",
    "CACHE",
    "CHECKPOINT",
    "CONFIG",
    "CORRUPT",
    "EVAL_DIR",
    "EVAL_TASKS",
    "EVENTS",
    "FINISHED",
    "LOCK",
    "LOOKS",
    "METRICS",
    "MLFLOW_DB",
    "MLFLOW_RUN_ID",
    "OPTUNA_DB",
    "POINT_FILES",
    "QUARANTINE",
    "SAMPLES",
    "STATUS",
    "STATUSES",
    "SUMMARY",
    "SWEEP_MANIFEST",
    "TIMINGS",
    "TRACEBACK",
    "UPDATE_LOGS",
    "CorruptPoint",
    "PointLogs",
    "append_jsonl",
    "atomic_write_json",
    "atomic_write_text",
    "replace_folder",
    "check_sweep",
    "file_lock",
    "is_point_dir",
    "is_sweep_dir",
    "jsonl_text",
    "point_dirs",
    "point_lock",
    "point_problems",
    "quarantine",
    "read_jsonl",
    "read_status",
    "rewrite_jsonl",
    "sweep_folders",
    "write_status",
]
