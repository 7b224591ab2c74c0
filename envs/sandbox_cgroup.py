"""A memory cgroup per sandbox call (docs/algorithms.md#sandbox): what RLIMIT_AS does not count.

RLIMIT_AS bounds the program's address space, not the kernel memory its system calls make the kernel
hold: socket and pipe buffers, tmpfs inodes, dentries and extended attributes, pages pinned by a pipe.
A memory cgroup charges all of it (kernel memory included) to the jail, so one limit bounds the call:
`memory_mb + file_mb + OVERHEAD_MB`, the program's address space, its /tmp, and the jail's own processes
(bubblewrap, the supervisor). Past it the kernel refuses the allocation or kills the program, and the
call reports `killed_by == "memory"`.

Used where a cgroup v1 memory hierarchy is mounted and our own cgroup in it is writable (root in this
project's containers and CI). Elsewhere (cgroup v2 without a delegated subtree, no root) calls run
without one and `available()` says why; the seccomp filter still refuses the largest such allocators.
"""

from __future__ import annotations

import os
import secrets
import time
from functools import lru_cache
from pathlib import Path

OVERHEAD_MB = 16  # bubblewrap and the supervisor: a jail running `pass` is charged about 7 MiB
PREFIX = "harness-sandbox-"


def _memory_root() -> tuple[Path | None, str]:
    """Our own cgroup in the v1 memory hierarchy, or None and the reason."""
    mount = None
    try:
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            fields = line.split()
            dash = fields.index("-")
            if fields[dash + 1] == "cgroup" and "memory" in fields[dash + 3].split(","):
                mount = Path(fields[4])
                break
        own = next(
            line.split(":", 2)[2]
            for line in Path("/proc/self/cgroup").read_text().splitlines()
            if "memory" in line.split(":", 2)[1].split(",")
        )
    except (OSError, StopIteration, ValueError):
        return None, "no cgroup v1 memory controller is mounted (cgroup v2 needs a delegated subtree)"
    if mount is None:
        return None, "no cgroup v1 memory controller is mounted (cgroup v2 needs a delegated subtree)"
    root = mount / own.lstrip("/")
    if not os.access(root, os.W_OK):
        return None, f"the memory cgroup {root} is not writable here (needs root)"
    return root, ""


@lru_cache(maxsize=1)
def available() -> tuple[Path | None, str]:
    """(the parent of the per-call cgroups, "") when they can be made here, else (None, why)."""
    root, why = _memory_root()
    if root is None:
        return None, why
    probe = root / f"{PREFIX}probe-{os.getpid()}-{secrets.token_hex(4)}"
    try:
        probe.mkdir()
        (probe / "memory.limit_in_bytes").write_text(str(OVERHEAD_MB << 20))
    except OSError as e:
        return None, f"cannot make a memory cgroup under {root}: {e}"
    finally:
        _remove(probe)
    return root, ""


class JailCgroup:
    """One call's memory cgroup: made before the jail starts, removed after it ended."""

    def __init__(self, root: Path, limit_mb: int, uid: int | None):
        self.path = root / f"{PREFIX}{os.getpid()}-{secrets.token_hex(6)}"
        self.path.mkdir()
        limit = str(limit_mb << 20)
        (self.path / "memory.limit_in_bytes").write_text(limit)
        if (self.path / "memory.memsw.limit_in_bytes").exists():  # swap counted too where it is accounted
            (self.path / "memory.memsw.limit_in_bytes").write_text(limit)
        self.procs = self.path / "cgroup.procs"
        if uid is not None:  # the jail's first process moves itself in before it execs bubblewrap
            os.chown(self.procs, uid, uid)

    def oom_killed(self) -> bool:
        """Whether the kernel killed a process of the jail at the limit."""
        try:
            stats = dict(line.split() for line in (self.path / "memory.oom_control").read_text().splitlines())
        except (OSError, ValueError):
            return False
        return int(stats.get("oom_kill", 0)) > 0

    def failures(self) -> int:
        """Allocations the limit refused (memory.failcnt)."""
        try:
            return int((self.path / "memory.failcnt").read_text())
        except (OSError, ValueError):
            return 0

    def remove(self) -> None:
        _remove(self.path)


def _remove(path: Path, wait_s: float = 5.0) -> None:
    """rmdir a cgroup once its last process has gone (it may take a moment after the jail is killed)."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            path.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            if time.monotonic() > deadline:
                return
            time.sleep(0.01)
