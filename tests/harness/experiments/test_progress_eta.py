"""The sweep progress's times left: named (point / sweep), and steady through slow evaluation updates.

A simulated sweep on a fake clock: 3 points of 30 updates, 1 s per update, 11 s for the updates that
also run the held-out evaluation (10, 20, 30) and 20 s of set-up per point (60 s for the first,
which builds the caches). Its true time left is known at every update, so the estimate is checked
against it, and against the moving average the progress used before (which jumped at every
evaluation).
"""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from harness.experiments.progress import Rate, SweepProgress

UPDATES, EVAL_EVERY, POINTS = 30, 10, 3


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def update_seconds(u: int) -> float:
    return 11.0 if u % EVAL_EVERY == 0 else 1.0


def simulate() -> tuple[list[tuple[int, int, float, float, float]], str]:
    """(point, update, sweep eta, true sweep time left, point eta) after every update, and the lines."""
    clock, buf = Clock(), io.StringIO()
    progress = SweepProgress(Console(file=buf, force_terminal=False, width=200), plain_every_s=0, clock=clock)
    progress.begin("s", total=POINTS, finished=0, to_run_updates=[UPDATES] * POINTS)
    per_point = sum(update_seconds(u) for u in range(1, UPDATES + 1))
    seen = []
    for p in range(POINTS):
        pid = f"p{p}"
        progress.point_start(pid, UPDATES)
        clock.now += 60.0 if p == 0 else 20.0
        progress.point_update(pid, {"stage": "held-out evaluation at update 0", "done": 1, "total": 1})
        for u in range(1, UPDATES + 1):
            clock.now += update_seconds(u)
            progress.point_update(pid, {"update": u, "updates": UPDATES, "success": 0.5})
            left_here = sum(update_seconds(k) for k in range(u + 1, UPDATES + 1))
            truth = left_here + (POINTS - 1 - p) * (20.0 + per_point)
            seen.append((p, u, progress.eta(), truth, progress._point_eta(progress.running[pid])))
        progress.point_end(pid, "done", clock.now)
    progress.end()
    return seen, buf.getvalue()


def test_rate_is_a_cumulative_mean():
    rate = Rate()
    assert rate.per_unit is None and rate.left(5) is None
    for seconds in (1.0, 1.0, 11.0, 1.0):
        rate.add(seconds, 1)
    assert rate.per_unit == pytest.approx(3.5) and rate.left(2) == pytest.approx(7.0)
    rate.add(5.0, 0)  # nothing measured: ignored
    assert rate.units == 4


def test_sweep_eta_is_named_and_settles_after_the_first_point():
    seen, text = simulate()
    assert "point eta" in text and "sweep eta" in text  # each time left says what it is for
    later = [(eta, truth) for p, _, eta, truth, _ in seen if p > 0]
    for eta, truth in later:  # priced by the finished point: set-up and evaluations included
        assert eta == pytest.approx(truth, abs=11.0)
    # between evaluations the estimate falls by about the second that passed, at an evaluation by the
    # eleven seconds that passed: no jumps in between
    steps = [a[2] - b[2] for a, b in zip(seen, seen[1:]) if a[0] == b[0] and a[0] > 0]
    assert max(abs(s) for s in steps) <= 12.0


def test_the_old_moving_average_jumped_where_the_rate_does_not():
    """The estimate the progress used before (an 0.8/0.2 moving average of the last updates' time)
    on the same sweep: after each evaluation update it more than doubled."""
    ema, jumps = None, []
    left = POINTS * UPDATES
    for _ in range(POINTS):
        for u in range(1, UPDATES + 1):
            before = None if ema is None else ema * left
            per = update_seconds(u)
            ema = per if ema is None else 0.8 * ema + 0.2 * per
            left -= 1
            if before:
                jumps.append(ema * left / before)
    assert max(jumps) > 2.0  # what the user saw
    seen, _ = simulate()
    ratios = [b[2] / a[2] for a, b in zip(seen, seen[1:]) if a[0] == b[0] and a[0] > 0 and a[2] > 0]
    assert max(ratios) <= 1.0  # the new estimate never goes up within a point once a point has finished


def test_point_eta_uses_finished_points_rate():
    seen, _ = simulate()
    for p, u, _, _, point_eta in seen:
        if p > 0:
            assert point_eta == pytest.approx((UPDATES - u) * 60.0 / UPDATES)  # 60 s per 30 updates


def test_a_resumed_point_counts_its_first_update_as_one():
    # resumed from a checkpoint at update 18: its first reported update is 19, 10 s after its set-up
    clock = Clock()
    progress = SweepProgress(Console(file=io.StringIO(), force_terminal=False, width=200), plain_every_s=0, clock=clock)
    progress.begin("s", total=1, finished=0, to_run_updates=[UPDATES])
    progress.point_start("p", UPDATES)
    clock.now += 20.0
    progress.point_update("p", {"stage": "held-out evaluation at update 0", "done": 1, "total": 1})
    clock.now += 10.0
    progress.point_update("p", {"update": 19, "updates": UPDATES})
    assert progress._point_eta(progress.running["p"]) == pytest.approx(10.0 * (UPDATES - 19))
    clock.now += 10.0
    progress.point_update("p", {"update": 20, "updates": UPDATES})
    assert progress._point_eta(progress.running["p"]) == pytest.approx(10.0 * (UPDATES - 20))
