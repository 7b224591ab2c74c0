"""A memory cgroup per sandbox call (docs/algorithms.md#sandbox): what RLIMIT_AS does not count.

RLIMIT_AS bounds the program's address space, not the kernel memory its system calls make the kernel
hold: socket and pipe buffers, tmpfs inodes, dentries and extended attributes, pages pinned by a pipe.
A memory cgroup charges all of it to the jail, so one limit bounds the call: `memory_mb + file_mb +
names_mb + OVERHEAD_MB`, the program's address space, its /tmp's data and names, and the jail's own
processes (the launcher, bubblewrap, the supervisor). Past it the kernel reclaims, refuses the
allocation or kills the program, and the call reports `killed_by == "memory"`.

Both hierarchies are supported, each where a cgroup with the memory controller enabled for its children
is writable (root in this project's containers and CI):
- cgroup v1: children of our own cgroup in the memory hierarchy (`memory.limit_in_bytes`, and
  `memory.memsw.limit_in_bytes` where swap is accounted). Kernel memory is charged to the same limit
  since Linux 4.6, unless the kernel was booted with `cgroup.memory=nokmem`; `memory.kmem.limit_in_bytes`
  is not used (deprecated, and on Linux 6.18 writing it has no effect; cgroup-v1/memory.rst).
- cgroup v2: children of a cgroup whose `cgroup.subtree_control` enables `memory` (`memory.max`,
  `memory.swap.max` = 0, `memory.oom.group` = 1): our own cgroup when it holds no process (the root of
  the hierarchy, or a delegated subtree), else its parent. `memory.max` covers kernel memory (slab,
  sockets, page tables) unless `cgroup.memory=nokmem` (Documentation/admin-guide/cgroup-v2.rst,
  "Memory Interface Files" and "memory.stat").
Elsewhere calls run without a cgroup and `available()` says why; the seccomp filter still refuses the
largest such allocators, and the tmpfs caps /tmp's data and its number of names.
"""

from __future__ import annotations

import os
import secrets
import time
from functools import lru_cache
from pathlib import Path

OVERHEAD_MB = 16  # the launcher, bubblewrap and the supervisor: a jail running `pass` is charged about 7 MiB
PREFIX = "harness-sandbox-"
NOKMEM = "cgroup.memory=nokmem"  # the boot option that turns kernel-memory accounting off, v1 and v2 alone
V1 = {"limit": "memory.limit_in_bytes", "swap": "memory.memsw.limit_in_bytes", "events": "memory.oom_control"}
V2 = {"limit": "memory.max", "swap": "memory.swap.max", "events": "memory.events"}
V1["reclaim"], V2["reclaim"] = "memory.force_empty", "memory.reclaim"


def _mounts() -> dict[str, Path]:
    """Mount points of the v1 memory hierarchy ("v1") and of the v2 hierarchy ("v2") where present."""
    found: dict[str, Path] = {}
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        dash = fields.index("-")
        fstype, options = fields[dash + 1], fields[dash + 3].split(",")
        if fstype == "cgroup" and "memory" in options:
            found.setdefault("v1", Path(fields[4]))
        elif fstype == "cgroup2":
            found.setdefault("v2", Path(fields[4]))
    return found


def _own(version: str) -> str:
    """Our own cgroup's path in that hierarchy, from /proc/self/cgroup."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        number, controllers, path = line.split(":", 2)
        if version == "v1" and "memory" in controllers.split(",") or version == "v2" and number == "0":
            return path
    raise ValueError(f"no {version} memory cgroup in /proc/self/cgroup")


def _words(path: Path) -> set[str]:
    try:
        return set(path.read_text().split())
    except OSError:
        return set()


def _v2_parent(mount: Path, own: Path) -> tuple[Path | None, str]:
    """The v2 cgroup to make per-call children in: one whose children get the memory controller and
    that holds no process of its own (the "no internal processes" rule of cgroup-v2.rst)."""
    for candidate in (own, own.parent):
        if not candidate.is_relative_to(mount):
            break
        if "memory" in _words(candidate / "cgroup.subtree_control"):
            if os.access(candidate, os.W_OK):
                return candidate, ""
            return None, f"the cgroup v2 subtree {candidate} is not writable here (needs root or a delegation)"
    return None, (
        f"cgroup v2: no cgroup at or above {own} enables the memory controller for its children "
        "(a delegated subtree with `+memory` in cgroup.subtree_control is needed)"
    )


def _memory_root() -> tuple[Path | None, str]:
    """The cgroup to make per-call cgroups in (v1 memory hierarchy first, else v2), or None and why."""
    try:
        mounts = _mounts()
        if "v1" in mounts:
            root = mounts["v1"] / _own("v1").lstrip("/")
            if not os.access(root, os.W_OK):
                return None, f"the memory cgroup {root} is not writable here (needs root)"
            return root, ""
        if "v2" in mounts:
            return _v2_parent(mounts["v2"], mounts["v2"] / _own("v2").lstrip("/"))
    except (OSError, ValueError) as e:
        return None, f"cannot read this process's cgroups: {e}"
    return None, "no cgroup memory controller is mounted (neither a v1 memory hierarchy nor cgroup v2)"


def kernel_memory_charged() -> bool:
    """Whether the kernel charges slab, socket and other kernel memory to memory cgroups here (on unless
    the kernel was booted with cgroup.memory=nokmem; Documentation/admin-guide/kernel-parameters.txt)."""
    try:
        return NOKMEM not in Path("/proc/cmdline").read_text().split()
    except OSError:
        return True


@lru_cache(maxsize=1)
def available() -> tuple[Path | None, str]:
    """(the parent of the per-call cgroups, "") when they can be made here, else (None, why)."""
    root, why = _memory_root()
    if root is None:
        return None, why
    try:
        probe = JailCgroup(root, OVERHEAD_MB)
    except OSError as e:
        return None, f"cannot make a memory cgroup under {root}: {e}"
    probe.remove()
    return root, ""


class JailCgroup:
    """One call's memory cgroup (v1 or v2, as its parent is): made before the jail starts, removed after
    it ended. The jail's launcher writes its own pid into `procs` before it execs anything else."""

    def __init__(self, root: Path, limit_mb: int):
        self.files = V2 if (root / "cgroup.controllers").exists() else V1
        self.limit_mb = limit_mb
        self.path = root / f"{PREFIX}{os.getpid()}-{secrets.token_hex(6)}"
        self.path.mkdir()
        try:
            limit = str(limit_mb << 20)
            (self.path / self.files["limit"]).write_text(limit)
            swap = self.path / self.files["swap"]
            if swap.exists():  # v1: memory and swap together under the limit; v2: no swap at all
                swap.write_text(limit if self.files is V1 else "0")
            if self.files is V2:  # at the limit the kernel kills the whole jail, not one process of it
                (self.path / "memory.oom.group").write_text("1")
        except OSError:
            self.remove()
            raise
        self.procs = self.path / "cgroup.procs"

    def _events(self) -> dict[str, int]:
        try:
            return {k: int(v) for k, v in (line.split() for line in (self.path / self.files["events"]).open())}
        except (OSError, ValueError):
            return {}

    def oom_killed(self) -> bool:
        """Whether the kernel killed a process of the jail at the limit."""
        return self._events().get("oom_kill", 0) > 0

    def failures(self) -> int:
        """Times the limit was hit (v1 memory.failcnt, v2 the `max` event)."""
        if self.files is V2:
            return self._events().get("max", 0)
        try:
            return int((self.path / "memory.failcnt").read_text())
        except (OSError, ValueError):
            return 0

    def reclaim(self) -> None:
        """Free what the call still has charged once its processes are gone. What a removed cgroup held
        is handed to its parent, not freed: negative dentries a program made by looking up names that do
        not exist in the bound host folders (about 450 bytes each, 133 MiB for 300,000 lookups) would stay
        in the host's cache after the call. v1 `memory.force_empty` and v2 `memory.reclaim` reclaim the
        cgroup's own pages and its slab (cgroup-v1/memory.rst, cgroup-v2.rst)."""
        amount = "0" if self.files is V1 else f"{self.limit_mb}M"
        try:
            (self.path / self.files["reclaim"]).write_text(amount)
        except OSError:  # v2 says EAGAIN when less than asked was left to reclaim
            pass

    def remove(self) -> None:
        self.reclaim()
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
