"""The update-keyed JSONL logs of one point (metrics, samples, timings, eval_tasks): each row
carries the update it belongs to, and a resumed run never holds an update twice.

On opening, a torn last line (a kill mid-append) is dropped. Rows an earlier, interrupted attempt
left at an update >= the first one appended now are dropped before that append; `truncate_after`
drops the rows after the checkpoint a run resumes from.
"""

from __future__ import annotations

import math
from pathlib import Path

from harness.store.files import append_jsonl, read_jsonl, rewrite_jsonl
from harness.store.layout import METRICS, UPDATE_LOGS


def _max_update(path: Path) -> float:
    updates = [r["update"] for r in read_jsonl(path) if isinstance(r.get("update"), (int, float))]
    return max(updates, default=-math.inf)


class PointLogs:
    """The JSONL logs of UPDATE_LOGS in `run_dir` (created when missing), by file name."""

    def __init__(self, run_dir: str | Path):
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.paths = {name: self.run_dir / name for name in UPDATE_LOGS}
        for path in self.paths.values():
            rewrite_jsonl(path)  # a kill mid-append leaves a torn line
        # the highest update an earlier attempt left in each log (-inf: nothing left to drop)
        self._stale = {name: _max_update(path) for name, path in self.paths.items()}

    @property
    def last_update(self) -> int | None:
        """The last update in metrics.jsonl (None when empty)."""
        rows = read_jsonl(self.paths[METRICS])
        return rows[-1]["update"] if rows else None

    def append(self, name: str, update: int, rows: list[dict]) -> None:
        """Append rows of `update` to log `name`, first dropping rows of this or later updates an
        earlier attempt left."""
        if update <= self._stale[name]:
            rewrite_jsonl(self.paths[name], lambda r: r.get("update", -math.inf) < update)
        self._stale[name] = -math.inf
        append_jsonl(self.paths[name], rows)

    def truncate_after(self, update: int) -> None:
        """Keep only rows with update <= `update` (the checkpoint the run resumes from)."""
        for name, path in self.paths.items():
            rewrite_jsonl(path, lambda r: r.get("update", math.inf) <= update)
            self._stale[name] = -math.inf
