"""The results-folder layout: file names, status words, the status file, the point lock, and
which folders are points and sweeps.

    <results>/                  MLFLOW_DB (MLflow's default store), CACHE (models and SFT, by hash)
    <results>/<sweep>/          SWEEP_MANIFEST (what the sweep asked for), OPTUNA_DB (harness tune),
                                LOOKS (the looks of a sweep with a seed budget and what each decided)
    <results>/<sweep>/<point>/  one point:
        CONFIG        config.yaml      the resolved config
        METRICS       metrics.jsonl    one row per update (update 0 = the evaluation before RL)
        SUMMARY       summary.json     metrics, status, timings, provenance
        SAMPLES       samples.jsonl    sampled episodes, each with its update
        EVAL_TASKS    eval_tasks.jsonl one row per evaluated episode (paired analysis)
        TIMINGS       timings.jsonl    wall times per update (kept out of metrics.jsonl)
        EVENTS        events.jsonl     one row per attempt start / end, warnings, reuse
        STATUS        status           one of STATUSES; written last: the commit marker
        TRACEBACK     traceback.txt    on failure
        MLFLOW_RUN_ID mlflow_run_id    the MLflow run to continue
        CHECKPOINT    checkpoint/      the trainer's, for resuming
        ADAPTER       adapter/         the trained weights
        EVAL_DIR      eval/            `harness eval` results
        LOCK          .lock            held by the process running the point
        QUARANTINE    .corrupt/        files of a damaged point, moved aside before it runs again
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from harness.store.files import atomic_write_text, file_lock

# ----------------------------------------------------------------------------- names
MLFLOW_DB, CACHE = "mlflow.db", ".cache"
SWEEP_MANIFEST, OPTUNA_DB, LOOKS = "sweep.json", "optuna.db", "looks.json"
CONFIG, METRICS, SUMMARY, STATUS = "config.yaml", "metrics.jsonl", "summary.json", "status"
SAMPLES, EVAL_TASKS, TIMINGS, EVENTS = "samples.jsonl", "eval_tasks.jsonl", "timings.jsonl", "events.jsonl"
TRACEBACK, MLFLOW_RUN_ID = "traceback.txt", "mlflow_run_id"
CHECKPOINT, ADAPTER, EVAL_DIR = "checkpoint", "adapter", "eval"
LOCK, QUARANTINE = ".lock", ".corrupt"
POINT_FILES = (CONFIG, METRICS, SUMMARY, STATUS)  # a folder holding any of them is a point
UPDATE_LOGS = (METRICS, SAMPLES, TIMINGS, EVAL_TASKS)  # JSONL logs whose rows carry their "update"

# ----------------------------------------------------------------------------- status
STATUSES = ("running", "done", "failed", "diverged", "pruned")
FINISHED = ("done", "diverged")  # a result: never run again
CORRUPT = "corrupt"  # not a status file's word: a finished point whose files are damaged


def read_status(pdir: str | Path) -> tuple[str | None, str | None]:
    """(the status word, None), (None, None) when there is no status file, or (None, why) when it
    is damaged."""
    try:
        raw = (Path(pdir) / STATUS).read_bytes()
    except FileNotFoundError:
        return None, None
    except OSError as e:
        return None, f"status unreadable ({type(e).__name__})"
    try:
        text = raw.decode("utf-8").strip()
    except UnicodeDecodeError:
        return None, f"status is not text ({len(raw)} bytes of binary data)"
    if not text:
        return None, None
    if text not in STATUSES:
        return None, f"status is not one of {' | '.join(STATUSES)} ({len(raw)} bytes)"
    return text, None


def write_status(pdir: str | Path, status: str) -> None:
    """Replace the point's status file with `status` (one line, atomically)."""
    atomic_write_text(Path(pdir) / STATUS, status + "\n")


@contextmanager
def point_lock(pdir: str | Path, blocking: bool = True) -> Iterator[bool]:
    """The lock of the point in `pdir` (see `file_lock`): one process runs a point at a time."""
    with file_lock(Path(pdir) / LOCK, blocking=blocking) as locked:
        yield locked


# ----------------------------------------------------------------------------- folders
def is_point_dir(path: Path) -> bool:
    """A visible folder holding at least one of POINT_FILES."""
    return path.is_dir() and not path.name.startswith(".") and any((path / f).exists() for f in POINT_FILES)


def point_dirs(root: str | Path) -> list[Path]:
    """The point folders of one sweep folder (results/<sweep>), in name order."""
    return sorted(p for p in Path(root).iterdir() if is_point_dir(p))


def is_sweep_dir(path: Path) -> bool:
    """A folder with a sweep manifest or at least one point folder."""
    return (path / SWEEP_MANIFEST).is_file() or any(is_point_dir(p) for p in path.iterdir())


def sweep_folders(path: str | Path) -> list[Path]:
    """`path` itself when it is a sweep folder (sweep.json or point folders), else its sub-folders
    that are (a results root holding several sweeps)."""
    path = Path(path)
    if is_sweep_dir(path):
        return [path]
    return sorted(p for p in path.iterdir() if p.is_dir() and not p.name.startswith(".") and is_sweep_dir(p))
