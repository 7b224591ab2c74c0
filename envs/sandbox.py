"""Run untrusted Python in a sandbox that holds by construction (the code tool of tool-integrated
reasoning; docs/algorithms.md#sandbox).

The program runs in a bubblewrap jail (envs/sandbox_jail.py): a root file system built from nothing
but the interpreter's own files, read-only, and a private size-capped tmpfs for /tmp; new user, mount,
pid, ipc, net, uts and cgroup namespaces; no capabilities, no_new_privs; a seccomp filter refusing
namespaces, mounts, keyrings, tracing, memory RLIMIT_AS does not count, and every other process or
thread. Its supervisor, the jail's pid 1, applies the rlimits (address space, CPU seconds, file size,
open files) and reports how the program ended. From here: the code goes in through a memory file
(never argv), a wall-clock limit kills the jail, and stdout/stderr are capped while being read (the
jail is killed past 4x the cap, so a 100 MB print costs nothing).

When the harness runs as root, each call's jail runs under its own unprivileged uid (UID_BASE + a
per-call number, never a real account); otherwise under the caller's uid, in a user namespace of its
own either way. `run_python(code, limits)` never raises for anything the code is or does; it returns
what happened. A host where the jail cannot start raises `SandboxUnavailable` from `check_available`.
"""

from __future__ import annotations

import itertools
import os
import re
import selectors
import signal
import subprocess
import time
import unicodedata
from dataclasses import dataclass
from functools import lru_cache

from envs.sandbox_jail import SYSTEM_PYTHON, SandboxUnavailable, jail_argv, seccomp_programs, supervisor_argv

UID_BASE = 200_000  # sandbox uids when run as root: UID_BASE + a per-call number, never a real account
UID_SPAN = 1 << 20
_calls = itertools.count()


@dataclass(frozen=True)
class Limits:
    wall_s: float = 5.0
    cpu_s: int = 5
    memory_mb: int = 512  # address space
    output_bytes: int = 16_384  # per stream, kept; the process is killed past 4x this
    file_mb: int = 16  # largest file it may write, and the size of its /tmp (the program included)
    open_files: int = 64
    code_bytes: int = 1 << 20  # a longer program is not run


@dataclass
class Result:
    stdout: str
    stderr: str
    exit_code: int | None  # the program's exit status; None when it did not exit (signal, limit, refusal)
    timed_out: bool = False
    output_capped: bool = False
    # "wall", "output", a signal's name (the program was killed by it), "rejected" (not run: too long)
    # or "sandbox" (the jail itself failed; stderr says why)
    killed_by: str | None = None

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out and not self.output_capped

    def observation(self, error_lines: int = 5, limit: int = 2_000) -> str:
        """What the agent sees: stdout, or the error's last lines (ToRL truncates tracebacks the same
        way), escaped by `shown` so that it cannot close a fence or carry control characters."""
        if self.timed_out:
            return "Error: time limit exceeded"
        if self.killed_by == "SIGXCPU":
            return "Error: CPU time limit exceeded"
        if self.killed_by in ("rejected", "sandbox"):
            return ("Error: " + shown(self.stderr.strip()))[:limit]
        if self.killed_by and self.killed_by.startswith("SIG"):
            return f"Error: killed by {self.killed_by}"
        if self.output_capped:
            return shown(self.stdout)[:limit] + "\n[output truncated]"
        if self.exit_code != 0:
            tail = "\n".join(self.stderr.strip().splitlines()[-error_lines:])
            return ("Error:\n" + shown(tail))[:limit] if tail else f"Error: exit code {self.exit_code}"
        return shown(self.stdout)[:limit]


_FENCE = re.compile(r"`{3,}")
_HIDDEN = ("Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp")  # control, format, surrogate, private, unassigned, separators


def _escape_char(c: str) -> str:
    if c in "\n\t" or unicodedata.category(c) not in _HIDDEN:
        return c
    n = ord(c)
    return f"\\x{n:02x}" if n < 0x100 else f"\\u{n:04x}" if n < 0x10000 else f"\\U{n:08x}"


def shown(text: str) -> str:
    """Program output as an observation may carry it: control and invisible characters written as
    escapes (\\x1b, \\u202e), runs of three or more backticks as \\` each (they cannot close the
    output fence), and `<|` as `<\\|` (no chat-template token can be spelled). Ordinary text is unchanged."""
    if not text.isascii() or any(c < " " and c not in "\n\t" or c == "\x7f" for c in text):
        text = "".join(map(_escape_char, text))
    if "```" in text:
        text = _FENCE.sub(lambda m: "\\`" * len(m.group()), text)
    return text.replace("<|", "<\\|")


def check_available() -> None:
    """Raise SandboxUnavailable with the reason when the jail cannot be built or does not run here."""
    probe = run_python("print(6 * 7)", Limits(wall_s=20))
    if probe.stdout.strip() != "42":
        raise SandboxUnavailable(
            f"the code sandbox does not start here: {probe.stderr.strip()[-400:] or probe}. It needs bubblewrap "
            "to create user namespaces (root, or unprivileged user namespaces enabled)"
        )


def default_python() -> str:
    """The interpreter the code runs under: the system's /usr/bin/python3, whose files the jail binds."""
    return SYSTEM_PYTHON


@lru_cache(maxsize=1)
def require() -> None:
    """`check_available` once per process: what an environment that runs code calls when it is built,
    so a missing mechanism is one clear error up front rather than an error observation per episode."""
    check_available()


def _memfile(name: str, data: bytes) -> int:
    fd = os.memfd_create(name, os.MFD_CLOEXEC)
    os.write(fd, data)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def _credentials() -> dict:
    """Run the jail as a fresh unprivileged uid when we are root (no two concurrent calls share one)."""
    if os.geteuid() != 0:
        return {}
    uid = UID_BASE + (os.getpid() * 4096 + next(_calls)) % UID_SPAN
    return {"user": uid, "group": uid, "extra_groups": []}


def run_python(code: str, limits: Limits = Limits(), python: str | None = None) -> Result:
    """Run `code` as /tmp/work/main.py in a fresh jail; return its (capped) output and how it ended."""
    data = str(code).encode("utf-8", "surrogatepass")
    if len(data) > limits.code_bytes:
        return Result(
            "", f"program too long ({len(data)} bytes; the limit is {limits.code_bytes})", None, killed_by="rejected"
        )
    python = python or default_python()
    denied, no_processes = seccomp_programs()
    fds = [_memfile("code", data), _memfile("seccomp", denied), _memfile("seccomp-program", no_processes)]
    status_r, status_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
    fds.append(status_w)
    try:
        argv = jail_argv(python, limits.file_mb, fds[0], fds[1])
        argv += ["--", *supervisor_argv(python, status_w, fds[2], limits)]
        try:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
                pass_fds=fds,
                **_credentials(),
            )
        except OSError as e:
            return Result("", f"the jail did not start: {e}", None, killed_by="sandbox")
        for fd in fds:
            os.close(fd)
        fds = []
        out, err, capped, timed_out = _collect(proc, limits)
        report = _read_status(status_r)
    finally:
        for fd in (*fds, status_r):
            os.close(fd)
    return _result(out, err, capped, timed_out, report)


def _read_status(fd: int) -> tuple[str, str]:
    """The supervisor's report: ("exit", "N"), ("signal", "N"), ("setup", message), or ("", "")."""
    try:
        kind, _, value = os.read(fd, 65_536).decode(errors="replace").partition(" ")
    except BlockingIOError:
        return "", ""
    return kind, value


def _result(out: bytes, err: bytes, capped: bool, timed_out: bool, report: tuple[str, str]) -> Result:
    stdout, stderr = out.decode("utf-8", "replace"), err.decode("utf-8", "replace")
    kind, value = report
    if timed_out or capped:
        return Result(stdout, stderr, None, timed_out, capped, "wall" if timed_out else "output")
    if kind == "exit":
        return Result(stdout, stderr, int(value))
    if kind == "signal":
        try:
            name = signal.Signals(int(value)).name
        except ValueError:
            name = f"SIG{value}"
        return Result(stdout, stderr, None, killed_by=name)
    why = value if kind == "setup" else "the jail ended without a report"
    return Result(stdout, (stderr + "\n" + why).strip(), None, killed_by="sandbox")


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
