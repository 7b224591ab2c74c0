"""Run untrusted Python in a kernel-isolated sandbox (the code tool of tool-integrated reasoning).

Mechanisms, all the kernel's (no Python-level filtering of the code):
- namespaces, through util-linux `unshare` (Debian's util-linux, present on every Debian image):
  a new PID namespace (the code cannot see or signal any process of the host, and when its first
  process dies the kernel kills every process left in it), a new network namespace (no interface
  up: no socket reaches 127.0.0.1 or anything else), new mount, IPC and UTS namespaces;
- in the new mount namespace, before the code runs: every mount remounted read-only, and fresh
  private tmpfs on /tmp (the working directory /tmp/work lives there, size-capped), /var/tmp and
  /dev/shm, so a call sees neither the host's temporary files nor another call's, and nothing it
  writes survives it;
- credentials: the code runs under its own unprivileged uid/gid (no supplementary groups), unique
  per call, so it holds no capability and file permissions apply;
- resource limits (setrlimit): address space, CPU seconds, file size, open files, no core dumps, and
  RLIMIT_NPROC = 1 for that uid, so fork, threads and subprocesses fail (a fork bomb stops at once);
- from the host: a wall-clock limit, after which the whole process group is killed (`unshare
  --kill-child` takes the namespace down with it), and stdout/stderr capped while being read (the
  process is killed past the cap, so a 100 MB print costs nothing).

Left open, said plainly: the host filesystem stays *readable* (read-only) apart from the hidden
temporary directories, so code can read world-readable files such as the installed packages; no
seccomp filter, so the whole system-call surface of the kernel is reachable (as an unprivileged user
in empty namespaces); `exec` of another program in place of the interpreter is allowed (it inherits
every limit); CPU time is bounded per call, not shared fairly between calls. Needs root (or
CAP_SYS_ADMIN) to create the namespaces and switch uid: `SandboxUnavailable` says so otherwise.

`run_python(code, limits)` never raises for anything the code does; it returns what happened.
"""

from __future__ import annotations

import itertools
import json
import os
import selectors
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from functools import lru_cache

UID_BASE = 200_000  # sandbox uids: UID_BASE + a per-call number, never a real account
_calls = itertools.count()


class SandboxUnavailable(RuntimeError):
    """The kernel mechanisms the sandbox relies on cannot be used here."""


@dataclass(frozen=True)
class Limits:
    wall_s: float = 5.0
    cpu_s: int = 5
    memory_mb: int = 512  # address space
    output_bytes: int = 16_384  # per stream, kept; the process is killed past 4x this
    file_mb: int = 16  # largest file it may write, and the size of its /tmp
    open_files: int = 64


@dataclass
class Result:
    stdout: str
    stderr: str
    exit_code: int | None  # None when killed by the harness; 128 + N when killed by signal N
    timed_out: bool = False
    output_capped: bool = False
    killed_by: str | None = None  # "wall", "output" or a signal name

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out and not self.output_capped

    def observation(self, error_lines: int = 5, limit: int = 2_000) -> str:
        """What the agent sees: stdout, or the error's last lines (ToRL truncates tracebacks the same way)."""
        if self.timed_out:
            return "Error: time limit exceeded"
        if self.killed_by in ("SIGXCPU", "SIGKILL"):
            return "Error: CPU time limit exceeded" if self.killed_by == "SIGXCPU" else "Error: killed (resource limit)"
        if self.output_capped:
            return self.stdout[:limit] + "\n[output truncated]"
        if self.exit_code != 0:
            tail = "\n".join(self.stderr.strip().splitlines()[-error_lines:])
            return ("Error:\n" + tail)[:limit] if tail else f"Error: exit code {self.exit_code}"
        return self.stdout[:limit]


# Runs as the namespace's first process, still root inside it: mounts, limits, credentials, exec.
LAUNCHER = r"""
import ctypes, json, os, resource, sys
cfg = json.loads(sys.argv[1])
libc = ctypes.CDLL(None, use_errno=True)
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 1, 2, 4, 32, 4096, 16384, 1 << 18
def mount(src, target, fstype, flags, data=None):
    if libc.mount(src.encode(), target.encode(), fstype.encode() if fstype else None, flags,
                  data.encode() if data else None) != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"mount {target}: {os.strerror(e)}")
mount("none", "/", None, MS_REC | MS_PRIVATE)
mount("/", "/", None, MS_BIND | MS_REC)
os.chdir("/")
targets = []
with open("/proc/self/mountinfo") as f:
    for line in f:
        targets.append(line.split()[4].replace("\\040", " "))
for t in targets:
    if t.startswith("/proc"):
        continue
    try:
        mount("none", t, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)
    except OSError:
        pass  # a mount the kernel will not remount (it stays as it was; /tmp and friends are replaced below)
size = cfg["file_mb"]
for t in ("/tmp", "/var/tmp", "/dev/shm"):
    if os.path.isdir(t):
        mount("tmpfs", t, "tmpfs", MS_NOSUID | MS_NODEV, f"size={size}m,mode=1777")
work = "/tmp/work"
os.mkdir(work, 0o700)
uid = cfg["uid"]
os.chown(work, uid, uid)
with open(os.path.join(work, "main.py"), "w") as f:
    f.write(cfg["code"])
os.chown(os.path.join(work, "main.py"), uid, uid)
child = os.fork()
if child == 0:
    try:
        for res, value in (
            (resource.RLIMIT_AS, cfg["memory_mb"] << 20),
            (resource.RLIMIT_CPU, (cfg["cpu_s"], cfg["cpu_s"] + 1)),  # SIGXCPU first, SIGKILL a second later
            (resource.RLIMIT_FSIZE, size << 20),
            (resource.RLIMIT_NOFILE, cfg["open_files"]),
            (resource.RLIMIT_CORE, 0),
            (resource.RLIMIT_NPROC, 1),
        ):
            resource.setrlimit(res, value if isinstance(value, tuple) else (value, value))
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
        os.chdir(work)
        env = {"PATH": "/usr/bin:/bin", "HOME": work, "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1",
               "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
        py = cfg["python"]
        os.execve(py, [py, "-I", "main.py"], env)
    except BaseException as e:
        os.write(2, f"sandbox: {type(e).__name__}: {e}\n".encode())
        os._exit(125)
# PID 1 stays root and waits: the code cannot signal it, and its death takes the namespace down
_, status = os.waitpid(child, 0)
os._exit(128 + os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status))
"""


def _unshare() -> str:
    path = shutil.which("unshare")
    if path is None:
        raise SandboxUnavailable("the sandbox needs util-linux's `unshare` (apt-get install util-linux)")
    return path


def check_available() -> None:
    """Raise SandboxUnavailable with the reason when namespaces or the uid switch are not possible."""
    if os.geteuid() != 0:
        raise SandboxUnavailable(
            "the code sandbox creates namespaces and switches to an unprivileged uid, which needs root "
            "(CAP_SYS_ADMIN, CAP_SETUID) in this container; run the harness as root or disable the tool env"
        )
    probe = run_python("print(6 * 7)", Limits(wall_s=20))
    if probe.stdout.strip() != "42":
        raise SandboxUnavailable(f"the sandbox does not start here: {probe.stderr.strip()[-300:] or probe}")


def default_python() -> str:
    """The interpreter the code runs under: the system's /usr/bin/python3 (readable by any uid; the
    harness's own may sit in a private home), else this one."""
    return "/usr/bin/python3" if os.access("/usr/bin/python3", os.X_OK) else os.path.realpath(sys.executable)


@lru_cache(maxsize=1)
def require() -> None:
    """`check_available` once per process: what an environment that runs code calls when it is built,
    so a missing mechanism is one clear error up front rather than an error observation per episode."""
    check_available()


def run_python(code: str, limits: Limits = Limits(), python: str | None = None) -> Result:
    """Run `code` as a file in a fresh sandbox; return its (capped) output and how it ended."""
    uid = UID_BASE + ((os.getpid() & 0x3FFFF) << 12 | next(_calls) & 0xFFF)
    cfg = {
        "code": code,
        "uid": uid,
        "python": python or default_python(),
        "memory_mb": limits.memory_mb,
        "cpu_s": limits.cpu_s,
        "file_mb": limits.file_mb,
        "open_files": limits.open_files,
    }
    argv = [
        _unshare(),
        "--fork",
        "--kill-child=SIGKILL",
        "--pid",
        "--mount-proc",
        "--net",
        "--ipc",
        "--uts",
        "--mount",
        sys.executable,
        "-I",
        "-c",
        LAUNCHER,
        json.dumps(cfg),
    ]
    proc = subprocess.Popen(
        argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True
    )
    out, err, capped, timed_out = _collect(proc, limits)
    code_ = proc.returncode
    killed_by = "wall" if timed_out else "output" if capped else None
    if killed_by is None and code_ is not None and 128 < code_ < 128 + 65:  # the launcher's 128 + signal
        killed_by = signal.Signals(code_ - 128).name
    return Result(
        stdout=out.decode("utf-8", "replace"),
        stderr=err.decode("utf-8", "replace"),
        exit_code=None if (timed_out or capped) else code_,
        timed_out=timed_out,
        output_capped=capped,
        killed_by=killed_by,
    )


def _kill(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _collect(proc: subprocess.Popen, limits: Limits) -> tuple[bytes, bytes, bool, bool]:
    """Read both streams until the process ends, keeping `output_bytes` of each; kill it past the wall
    limit or past 4x the cap. Returns (stdout, stderr, capped, timed_out)."""
    keep = limits.output_bytes
    bufs = {proc.stdout: bytearray(), proc.stderr: bytearray()}
    seen = {proc.stdout: 0, proc.stderr: 0}
    sel = selectors.DefaultSelector()
    for f in bufs:
        sel.register(f, selectors.EVENT_READ)
    deadline = time.monotonic() + limits.wall_s
    capped = timed_out = False
    open_streams = 2
    while open_streams:
        left = deadline - time.monotonic()
        if left <= 0:
            timed_out = True
            _kill(proc)
            break
        for key, _ in sel.select(timeout=min(left, 0.5)):
            chunk = os.read(key.fd, 65_536)
            if not chunk:
                sel.unregister(key.fileobj)
                open_streams -= 1
                continue
            seen[key.fileobj] += len(chunk)
            buf = bufs[key.fileobj]
            if len(buf) < keep:
                buf += chunk[: keep - len(buf)]
            if seen[key.fileobj] > 4 * keep:
                capped = True
        if capped:
            _kill(proc)
            break
    sel.close()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        _kill(proc)
        proc.wait()
    for f in bufs:
        f.close()
    return bytes(bufs[proc.stdout]), bytes(bufs[proc.stderr]), capped, timed_out
