"""Run untrusted Python in a sandbox that holds by construction (the code tool of tool-integrated
reasoning; docs/algorithms.md#sandbox).

The program runs in a bubblewrap jail (envs/sandbox_jail.py): a root file system built from nothing
but the interpreter's own files, read-only, and a private tmpfs for /tmp capped in bytes and in names
(mounted by the jail's launcher, which first enters the call's memory cgroup); new user, mount,
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

import os
import re
import secrets
import selectors
import signal
import subprocess
import time
from dataclasses import dataclass
from functools import lru_cache

from envs.sandbox_cgroup import OVERHEAD_MB, JailCgroup, kernel_memory_charged
from envs.sandbox_cgroup import available as memory_cgroup
from envs.sandbox_jail import (
    FILES_PER_MB,
    NAME_KERNEL_BYTES,
    SYSTEM_PYTHON,
    SandboxUnavailable,
    jail_argv,
    launcher_argv,
    seccomp_programs,
    supervisor_argv,
)

UID_BASE = 200_000  # sandbox uids when run as root: UID_BASE + a random number, never a real account
UID_SPAN = 1 << 30  # drawn at random per call, so two concurrent calls practically never share one


@dataclass(frozen=True)
class Limits:
    wall_s: float = 5.0
    cpu_s: int = 5
    memory_mb: int = 512  # address space
    output_bytes: int = 16_384  # per stream, kept (more is "capped"); the jail is killed past 4x this
    # largest file it may write, and the size of its /tmp (the program included); /tmp also holds at most
    # `files` names (file_mb * 256: each file, folder, link, FIFO or socket counts as a 4 KiB page)
    file_mb: int = 16
    open_files: int = 64
    code_bytes: int = 1 << 20  # a longer program is not run

    def __post_init__(self):
        # zero would not mean "nothing": tmpfs reads size=0 and nr_inodes=0 as unlimited (tmpfs.rst)
        for key, value in vars(self).items():
            kinds = (int, float) if key == "wall_s" else (int,)
            if isinstance(value, bool) or not isinstance(value, kinds) or value <= 0:
                raise ValueError(
                    f"sandbox limit {key}={value!r} is not allowed: every limit ({', '.join(vars(self))}) must "
                    "be a positive whole number (wall_s may be fractional seconds; memory_mb and file_mb are MiB)"
                )

    @property
    def files(self) -> int:
        """How many names (files, folders, links, FIFOs, sockets) /tmp may hold."""
        return self.file_mb * FILES_PER_MB

    @property
    def cgroup_mb(self) -> int:
        """The call's memory cgroup limit: the address space, /tmp's data and its names' kernel memory,
        and the jail's own processes."""
        names_mb = -(-self.files * NAME_KERNEL_BYTES >> 20)
        return self.memory_mb + self.file_mb + names_mb + OVERHEAD_MB


@dataclass
class Result:
    stdout: str
    stderr: str
    exit_code: int | None  # the program's exit status; None when it did not exit (signal, limit, refusal)
    timed_out: bool = False
    output_capped: bool = False  # a stream wrote more than output_bytes: what is kept is a prefix
    # "wall", "output" (past 4x output_bytes), "memory" (the cgroup's limit), a signal's name (the
    # program was killed by it), "rejected" (not run: not text, or too long) or "sandbox" (the jail
    # itself failed; stderr says why)
    killed_by: str | None = None
    # "files" or "bytes" when the program left /tmp full (no name or no byte free): why a write failed
    # with ENOSPC ("No space left on device")
    tmp_full: str | None = None

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
        if self.killed_by == "memory":
            return "Error: memory limit exceeded"
        if self.killed_by in ("rejected", "sandbox"):
            return ("Error: " + shown(self.stderr.strip()))[:limit]
        if self.killed_by and self.killed_by.startswith("SIG"):
            return f"Error: killed by {self.killed_by}"
        if self.killed_by == "output" or self.output_capped and self.exit_code == 0:
            return shown(self.stdout)[:limit] + "\n[output truncated]"
        if self.exit_code != 0:
            tail = "\n".join(self.stderr.strip().splitlines()[-error_lines:])
            error = ("Error:\n" + shown(tail)) if tail else f"Error: exit code {self.exit_code}"
            note = TMP_FULL.get(self.tmp_full, "")
            return error[: limit - len(note)] + note
        return shown(self.stdout)[:limit]


TMP_FULL = {  # appended to an error observation, so the policy reads which cap it met
    "files": "\n[/tmp is full: it holds a limited number of files and folders]",
    "bytes": "\n[/tmp is full: it holds a limited number of bytes]",
}


_FENCE = re.compile(r"`{3,}")
# tags chat templates give a meaning (Qwen's tool calls, reasoning blocks); a tokenizer may hold them
# as single added tokens that are not special, so splitting special tokens does not keep them text
_TEMPLATE_TAG = re.compile(r"<(/?(?:tool_call|tool_response|tools|think)>)")


def _escape_char(c: str) -> str:
    if " " <= c <= "~" or c in "\n\t":
        return c
    n = ord(c)
    return f"\\x{n:02x}" if n < 0x100 else f"\\u{n:04x}" if n < 0x10000 else f"\\U{n:08x}"


def shown(text: str) -> str:
    """Program output as an observation carries it: printable ASCII only, every other character
    written as its Python escape (\\x1b, \\u202e, \\U000e0100: nothing invisible, no control or
    bidirectional character, no variation selector or filler); runs of three or more backticks as \\`
    each (they cannot close the output fence); `<|` as `<\\|` and a template tag such as `<tool_call>` as
    `<\\tool_call>`. Ordinary ASCII output is unchanged.
    That no observation text becomes a chat-template token is the chat format's guarantee
    (harness.transcript.chat); this is what a reader of the transcript sees."""
    if not text.isascii() or any(c < " " and c not in "\n\t" or c == "\x7f" for c in text):
        text = "".join(map(_escape_char, text))
    if "```" in text:
        text = _FENCE.sub(lambda m: "\\`" * len(m.group()), text)
    if "<" in text:
        text = _TEMPLATE_TAG.sub(r"<\\\1", text.replace("<|", "<\\|"))
    return text


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


def memory_bound() -> str:
    """How the call's memory is bounded here: with a memory cgroup, or why not (docs/algorithms.md#sandbox)."""
    root, why = memory_cgroup()
    if root is None:
        return f"RLIMIT_AS only: {why}"
    if not kernel_memory_charged():
        return "memory cgroup per call, kernel memory not charged (booted with cgroup.memory=nokmem)"
    return "memory cgroup per call"


def _memfile(name: str, data: bytes) -> int:
    fd = os.memfd_create(name, os.MFD_CLOEXEC)
    os.write(fd, data)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def _uid() -> int | None:
    """A fresh unprivileged uid for the jail when we are root (None: run it as ourselves)."""
    return UID_BASE + secrets.randbelow(UID_SPAN) if os.geteuid() == 0 else None


def run_python(code: str, limits: Limits = Limits(), python: str | None = None) -> Result:
    """Run `code` as /tmp/work/main.py in a fresh jail; return its (capped) output and how it ended."""
    if not isinstance(code, str):
        return Result("", f"the program must be text (str), not {type(code).__name__}", None, killed_by="rejected")
    data = code.encode("utf-8", "surrogatepass")
    if len(data) > limits.code_bytes:
        return Result(
            "", f"program too long ({len(data)} bytes; the limit is {limits.code_bytes})", None, killed_by="rejected"
        )
    python = python or default_python()
    denied, no_processes = seccomp_programs()
    uid = _uid()
    root, _ = memory_cgroup()
    try:
        cgroup = JailCgroup(root, limits.cgroup_mb) if root else None
    except OSError as e:
        return Result("", f"the jail's memory cgroup could not be made: {e}", None, killed_by="sandbox")
    fds = [_memfile("code", data), _memfile("seccomp", denied), _memfile("seccomp-program", no_processes)]
    status_r, status_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
    fds.append(status_w)
    try:
        procs = str(cgroup.procs) if cgroup is not None else ""
        argv = launcher_argv(procs, uid, limits.file_mb, limits.files) + jail_argv(python, fds[0], fds[1])
        argv += ["--", *supervisor_argv(python, status_w, fds[2], limits)]
        try:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
                pass_fds=fds,
            )
        except OSError as e:
            return Result("", f"the jail did not start: {e}", None, killed_by="sandbox")
        for fd in fds:
            os.close(fd)
        fds = []
        streams = _collect(proc, limits)
        report = _read_status(status_r)
        oom = cgroup is not None and cgroup.oom_killed()
    finally:
        for fd in (*fds, status_r):
            os.close(fd)
        if cgroup is not None:
            cgroup.remove()
    return _result(*streams, report, oom)


def _read_status(fd: int) -> tuple[str, str]:
    """The supervisor's report: ("exit", "N"), ("signal", "N"), either with " files" or " bytes" after
    N when /tmp was left full, ("setup", message), or ("", "")."""
    try:
        kind, _, value = os.read(fd, 65_536).decode(errors="replace").partition(" ")
    except BlockingIOError:
        return "", ""
    return kind, value


def _result(
    out: bytes, err: bytes, truncated: bool, flooded: bool, timed_out: bool, report: tuple[str, str], oom: bool
) -> Result:
    stdout, stderr = out.decode("utf-8", "replace"), err.decode("utf-8", "replace")
    kind, value = report
    number, _, full = value.partition(" ") if kind in ("exit", "signal") else (value, "", "")
    tmp_full = full if full in TMP_FULL else None
    killed_by = "wall" if timed_out else "output" if flooded else "memory" if oom else None
    if killed_by is not None:
        return Result(stdout, stderr, None, timed_out, truncated, killed_by, tmp_full)
    if kind == "exit":
        return Result(stdout, stderr, int(number), output_capped=truncated, tmp_full=tmp_full)
    if kind == "signal":
        try:
            name = signal.Signals(int(number)).name
        except ValueError:
            name = f"SIG{number}"
        return Result(stdout, stderr, None, output_capped=truncated, killed_by=name, tmp_full=tmp_full)
    why = value if kind == "setup" else "the jail ended without a report"
    return Result(stdout, (stderr + "\n" + why).strip(), None, output_capped=truncated, killed_by="sandbox")


def _kill(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _collect(proc: subprocess.Popen, limits: Limits) -> tuple[bytes, bytes, bool, bool, bool]:
    """Read both streams until the process ends, keeping `output_bytes` of each; kill it past the wall
    limit or past 4x the cap. Returns (stdout, stderr, truncated, flooded, timed_out): truncated when a
    stream wrote more than it kept, flooded when that made us kill it."""
    keep = limits.output_bytes
    bufs = {proc.stdout: bytearray(), proc.stderr: bytearray()}
    seen = {proc.stdout: 0, proc.stderr: 0}
    sel = selectors.DefaultSelector()
    for f in bufs:
        sel.register(f, selectors.EVENT_READ)
    deadline = time.monotonic() + limits.wall_s
    flooded = timed_out = False
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
                flooded = True
        if flooded:
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
    truncated = any(n > keep for n in seen.values())
    return bytes(bufs[proc.stdout]), bytes(bufs[proc.stderr]), truncated, flooded, timed_out
