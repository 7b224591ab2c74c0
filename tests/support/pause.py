"""Event-based control of the fake trainers, so tests never race a timer against a loaded machine.

Trainer side: `pause_point(run_dir, update)` after an update is logged and checkpointed. When
`update` is the one in <run_dir>/fake_pause_at (one-shot: the file is consumed) or in
$FAKE_PAUSE_AT, the trainer writes <run_dir>/fake_paused and blocks until <run_dir>/fake_resume
exists, or the file named by $FAKE_GATE does, or it is interrupted (SIGTERM / SIGINT / SIGKILL).

Test side: `pause_at` (before the point starts), `wait_until` (a condition, e.g. `paused(d)`,
checked until it holds while the process under test is alive), `resume`.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

PAUSE_AT, PAUSED, RESUME = "fake_pause_at", "fake_paused", "fake_resume"
POLL_S = 0.01
LIMIT_S = 600.0  # a pause nobody releases fails the run instead of hanging the suite


def _wanted(run_dir: Path) -> int | None:
    one_shot = run_dir / PAUSE_AT
    if one_shot.exists():
        return int(one_shot.read_text())
    env = os.environ.get("FAKE_PAUSE_AT")
    return int(env) if env else None


def pause_point(run_dir: Path, update: int) -> None:
    if _wanted(run_dir) != update:
        return
    (run_dir / PAUSE_AT).unlink(missing_ok=True)
    (run_dir / PAUSED).write_text(str(update))
    gate = os.environ.get("FAKE_GATE")
    deadline = time.monotonic() + LIMIT_S
    while not (run_dir / RESUME).exists() and not (gate and Path(gate).exists()):
        if time.monotonic() > deadline:
            raise RuntimeError(f"{run_dir} paused at update {update} and was never resumed")
        time.sleep(POLL_S)


def pause_at(run_dir: Path, update: int) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / PAUSE_AT).write_text(str(update))


def paused(run_dir: Path) -> bool:
    return (run_dir / PAUSED).exists()


def resume(run_dir: Path) -> None:
    (run_dir / RESUME).touch()


def wait_until(condition, proc: subprocess.Popen | None = None, timeout: float = 300.0) -> None:
    """Check `condition` until it holds; fail when `proc` exits first (it should be blocked) or
    after `timeout` (a generous bound for a condition that the trainer makes true by itself)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the process exited first (code {proc.returncode}): {proc.communicate()}")
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def interruptible() -> None:
    """`preexec_fn` of a process a test interrupts: Ctrl-C is delivered even when pytest itself runs as
    a background job (a non-interactive shell starts those with SIGINT ignored, and an ignored signal
    stays ignored across exec, so Python would never raise KeyboardInterrupt)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start_interruptible(cmd: list[str], cwd, env: dict[str, str]) -> subprocess.Popen:
    """A CLI process a test will signal: output and errors merged as text, Ctrl-C deliverable."""
    return subprocess.Popen(
        cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, preexec_fn=interruptible
    )
