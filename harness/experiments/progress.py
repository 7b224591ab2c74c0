"""Progress of a sweep: points done / total, each running point's update k / n, recent success
rate and time left. A rich live display on a terminal, plain throttled lines otherwise (logs, CI).

The runner calls begin / point_start / point_update / point_end / end from the main process;
`point_update` receives the dict the trainer passes to its `progress` callback
(`{"update": k, "updates": n, "success": ...}`; extra keys are ignored), and before the first
update the set-up steps (`{"stage": "pre-training the tiny model ...", "done": k, "total": n}`,
from envs.stage), shown with their own ETA.

Two times left are shown, each named: `point eta` (this point's remaining updates) and `sweep eta`
(every point still to run, over the workers). Both come from `Rate`s, seconds per unit summed over
everything measured so far rather than an average of the last few updates: an update that also runs
the held-out evaluation takes many times longer than the others, and an average of recent updates
jumped at each one. Once a point has finished, the seconds per update of the finished points (their
evaluations included) price every update still to run, and the shortest set-up seen prices each
point not started, so both estimates settle after the first point.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text


def format_seconds(seconds: float | None) -> str:
    if seconds is None or seconds != seconds or seconds == float("inf"):
        return "--:--"
    seconds = int(round(seconds))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m:02d}:{s:02d}"


@dataclass
class Rate:
    """Seconds per unit over everything added so far (a cumulative mean, not a moving average)."""

    seconds: float = 0.0
    units: float = 0.0

    def add(self, seconds: float, units: float) -> None:
        if units > 0 and seconds >= 0:
            self.seconds += seconds
            self.units += units

    @property
    def per_unit(self) -> float | None:
        return self.seconds / self.units if self.units > 0 else None

    def left(self, units: float) -> float | None:
        """Seconds for `units` more at this rate (None before anything was measured)."""
        per = self.per_unit
        return None if per is None else max(0.0, units) * per


@dataclass
class _Running:
    updates: int
    update: int = 0
    started: float = field(default_factory=time.monotonic)
    last_tick: float = field(default_factory=time.monotonic)
    rate: Rate = field(default_factory=Rate)  # this point's seconds per update, from its first update on
    setup_s: float | None = None  # from the start to the end of set-up (known at the first update)
    success: deque = field(default_factory=lambda: deque(maxlen=5))
    last_print: float = 0.0
    stage: tuple[str, int, int | None] | None = None  # set-up step before the first update: (name, done, total)
    stage_started: float = 0.0
    stage_done0: int = 0  # units already done when the stage was first seen (its ETA counts from there)

    def stage_text(self, now: float) -> str:
        name, done, total = self.stage
        text = f"{name} {done}/{'?' if total is None else total}"
        rate_done = done - self.stage_done0
        if total is not None and rate_done > 0 and done < total:
            text += f"  eta {format_seconds((now - self.stage_started) * (total - done) / rate_done)}"
        return text

    @property
    def recent_success(self) -> float | None:
        return sum(self.success) / len(self.success) if self.success else None


class SweepProgress:
    """Book-keeping shared by both displays; `render` / `_line` differ."""

    def __init__(self, console: Console | None = None, plain_every_s: float = 30.0, clock=time.monotonic):
        self.console = console or Console(markup=False, emoji=False, highlight=False)
        self.plain_every_s = plain_every_s
        self.clock = clock
        self.name, self.total, self.done, self.failed, self.diverged, self.workers = "", 0, 0, 0, 0, 1
        self.pending_updates, self.pending_points = 0, 0  # of points not started yet
        self.updates_rate = Rate()  # seconds per update, every update seen (all points)
        self.finished_rate = Rate()  # seconds per update of the points that finished (evaluations included)
        self.setups: list[float] = []  # set-up seconds of every point that reached its first update
        self.running: dict[str, _Running] = {}
        self._lock = threading.Lock()
        self._live: Live | None = None
        self.plain = not self.console.is_terminal

    # --------------------------------------------------------------------- events
    def begin(self, name: str, total: int, finished: int, to_run_updates: list[int], workers: int = 1) -> None:
        self.name, self.total, self.done, self.workers = name, total, finished, max(1, workers)
        self.pending_updates, self.pending_points = sum(to_run_updates), len(to_run_updates)
        if self.plain:
            self._say(
                f"sweep {name}: {total} points, {finished} already finished, "
                f"{len(to_run_updates)} to run (workers={self.workers})"
            )
        else:
            self._live = Live(console=self.console, get_renderable=self.render, refresh_per_second=4, transient=False)
            self._live.start()

    def point_start(self, point_id: str, updates: int) -> None:
        with self._lock:
            now = self.clock()
            self.running[point_id] = _Running(updates, started=now, last_tick=now)
            self.pending_updates = max(0, self.pending_updates - updates)
            self.pending_points = max(0, self.pending_points - 1)
        if self.plain:
            self._say(f"start {point_id}  ({self._finished}/{self.total} finished)")

    def point_update(self, point_id: str, info: dict[str, Any]) -> None:
        if "stage" in info:
            self._stage(point_id, info)
            return
        with self._lock:
            run = self.running.get(point_id)
            if run is None:
                return
            now = self.clock()
            update = int(info.get("update", run.update + 1))
            run.updates = int(info.get("updates", run.updates))
            steps = update - run.update
            if steps > 1 and run.setup_s is None:
                # a resumed point's first update: the ones before it ran in an earlier process, so the
                # time since its set-up is one update's, not `update`'s (it read 19x too fast at update 19)
                steps = 1
            if steps > 0 and run.setup_s is None:
                run.setup_s = run.last_tick - run.started
                self.setups.append(run.setup_s)
            if steps > 0:
                run.rate.add(now - run.last_tick, steps)
                self.updates_rate.add(now - run.last_tick, steps)
            run.update, run.last_tick = update, now
            if isinstance(info.get("success"), (int, float)):
                run.success.append(float(info["success"]))
            etas = f"point eta {format_seconds(self._point_eta(run))}  sweep eta {format_seconds(self._eta())}"
        if self.plain and (now - run.last_print >= self.plain_every_s or update >= run.updates):
            run.last_print = now
            self._say(f"    {point_id}: {self._point_text(run)}  {etas}")

    def _stage(self, point_id: str, info: dict[str, Any]) -> None:
        """A set-up step's progress (before the first update): shown until the updates start."""
        with self._lock:
            run = self.running.get(point_id)
            if run is None or run.update > 0:
                return
            now = self.clock()
            name, done, total = str(info["stage"]), int(info.get("done", 0)), info.get("total")
            new = run.stage is None or run.stage[0] != name
            if new:
                run.stage_started, run.stage_done0 = now, done
            run.stage = (name, done, None if total is None else int(total))
            run.last_tick = now  # the first update's time counts from the end of set-up, not from the start
            finished = total is not None and done >= int(total)
        if self.plain and (new or finished or now - run.last_print >= min(self.plain_every_s, 10.0)):
            run.last_print = now
            self._say(f"    {point_id}: {run.stage_text(now)}")

    def point_end(self, point_id: str, status: str, wall_s: float | None = None) -> None:
        with self._lock:
            run = self.running.pop(point_id, None)
            if run is not None and status == "done" and run.update >= run.updates > 0:
                self.finished_rate.add(run.rate.seconds, run.rate.units)
            self.done += status in ("done", "skipped", "elsewhere")
            self.failed += status == "failed"
            self.diverged += status == "diverged"
        took = f" ({format_seconds(wall_s)})" if wall_s is not None else ""
        if self.plain or status in ("failed", "diverged"):
            self._say(f"[{self._finished}/{self.total}] {status} {point_id}{took}")

    def end(self) -> None:
        if self._live is not None:
            self._live.refresh()
            self._live.stop()
            self._live = None

    # --------------------------------------------------------------------- rendering
    @property
    def _finished(self) -> int:
        return self.done + self.failed + self.diverged

    def eta(self) -> float | None:
        """Seconds until the sweep is done (module doc); None before anything was measured."""
        with self._lock:
            return self._eta()

    def _eta(self) -> float | None:
        running = [self._point_eta(r) for r in self.running.values()]
        per_update = self._per_update(None)
        if per_update is None or any(t is None for t in running):
            return None
        # the shortest set-up seen: the first point's also built the caches every later point reuses
        setup = min(self.setups) if self.setups else 0.0
        pending = self.pending_points * setup + self.pending_updates * per_update
        parallel = min(self.workers, max(1, len(self.running) + self.pending_points))
        return (pending + sum(running)) / parallel

    def _per_update(self, run: _Running | None) -> float | None:
        """Seconds per update: finished points' (which saw every evaluation), else this point's own, else
        every update's so far."""
        for rate in (self.finished_rate, run.rate if run is not None else Rate(), self.updates_rate):
            if rate.per_unit is not None:
                return rate.per_unit
        return None

    def _point_eta(self, run: _Running) -> float | None:
        """Seconds until this point is done (module doc)."""
        per_update = self._per_update(run)
        return None if per_update is None else max(0, run.updates - run.update) * per_update

    @staticmethod
    def _point_text(run: _Running) -> str:
        success = run.recent_success
        text = f"update {run.update}/{run.updates}"
        if success is not None:
            text += f"  success {success:.2f}"
        return text

    def _say(self, text: str) -> None:
        console = self._live.console if self._live is not None else self.console
        console.print(text, highlight=False, markup=False, emoji=False, soft_wrap=True)

    def render(self) -> Group:
        with self._lock:
            head = Table.grid(padding=(0, 1))
            head.add_row(
                Text(self.name, style="bold"),
                ProgressBar(total=max(1, self.total), completed=self._finished, width=30),
                Text(f"{self._finished}/{self.total} points"),
                Text(f"failed {self.failed}  diverged {self.diverged}" if self.failed or self.diverged else ""),
                Text(f"sweep eta {format_seconds(self._eta())}"),
            )
            rows = Table.grid(padding=(0, 2))
            for pid, run in self.running.items():
                setting_up = run.update == 0 and run.stage
                rows.add_row(
                    Text(f"  {pid}", style="cyan"),
                    ProgressBar(total=max(1, run.updates), completed=run.update, width=20),
                    Text(
                        run.stage_text(self.clock())
                        if setting_up
                        else f"{self._point_text(run)}  point eta {format_seconds(self._point_eta(run))}"
                    ),
                )
        return Group(head, rows)
