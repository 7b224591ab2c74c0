"""What the code sandbox is built from (docs/algorithms.md#sandbox): the minimal root, the seccomp
programs and the supervisor that runs inside. `envs/sandbox.py` runs a program in it.

The jail is bubblewrap (Debian package `bubblewrap`, the tool Flatpak is built on), started as an
unprivileged user, so every namespace it makes belongs to a fresh user namespace:
- a root file system made from nothing: an empty tmpfs, remounted read-only once built, holding
  read-only binds of exactly the files the interpreter needs (the `python3` binary, its standard
  library, the shared libraries that they and the standard library's extension modules link), five
  device nodes (null, zero, full, random, urandom) and a private tmpfs on /tmp. No /proc, /sys, /etc,
  /home, no checkout, no venv, no host /tmp: no path there leads to the host;
- new user, mount, pid, ipc, net, uts and cgroup namespaces; no capabilities; no_new_privs; further
  user namespaces disabled;
- two seccomp filters compiled by libseccomp (Debian `python3-seccomp`): DENIED for the supervisor
  and the program, NO_PROCESSES added for the program alone (its supervisor must fork it once).

bubblewrap mounts a tmpfs with a size but no other option, so the /tmp it binds is mounted by the
LAUNCHER, which runs before it in a mount namespace of its own: `size` caps the bytes of /tmp, `nr_inodes`
the number of names in it. Empty files, folders, symlinks, FIFOs and sockets cost no data pages, each
only kernel memory (an inode and a dentry, 0.2 to 1.5 KiB), so without `nr_inodes` a program could make
hundreds of thousands of them within `size`; tmpfs counts every inode and every extra hard link against
`nr_inodes` (mm/shmem.c, shmem_reserve_inode and shmem_link; Documentation/filesystems/tmpfs.rst).

The supervisor is the namespace's first process (pid 1): the kernel delivers no signal from inside
the namespace to a pid 1 that has no handler for it, it is not dumpable and there is no /proc, so the
program cannot stop it, trace it or read its descriptors. It forks the program, applies its limits and
filter, execs `python3 -I main.py`, and reports how it ended (exit code or signal) on a pipe only it
holds, which is how a `sys.exit(137)` is told apart from a SIGKILL.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from functools import lru_cache

SYSTEM_PYTHON = "/usr/bin/python3"  # the interpreter the code runs under, and libseccomp's bindings
# Names /tmp may hold per MiB of file_mb: each file, folder, link, FIFO or socket is allowed as one 4 KiB
# page of it, so file_mb = 16 allows 4096 (the root of /tmp, /tmp/work and main.py among them)
FILES_PER_MB = 256
# kernel memory one name may hold, in the call's cgroup limit: Linux 6.18 charged 0.2 KiB for a hard link,
# 0.9 for an empty file, folder, FIFO or short symlink, 1.0 for a socket, 1.5 for a 250-character name
NAME_KERNEL_BYTES = 2048
SANDBOX_UID = 1000  # the program's uid and gid inside its user namespace
WORK = "/tmp/work"
DEVICES = ("null", "zero", "full", "random", "urandom")

# Denied for everything in the jail (EPERM unless noted). Namespaces and mounts: the filesystem and
# namespace isolation is not undone from inside. Keyrings: the kernel's keyrings are per user, not per
# namespace. ptrace and friends: no reading or writing another process. Memory that RLIMIT_AS does not
# count: SysV shared memory, message queues and semaphores, POSIX message queues, memfd, Linux AIO
# contexts (a system-wide count), pages pinned into pipes (vmsplice, splice, tee). State shared with
# the host through the bound files: timestamps (utime*), extended attributes, file locks (flock and the
# fcntl lock commands below), inotify watches, and the page cache's residency (fadvise, readahead,
# mincore, cachestat, preadv2/pwritev2 with RWF_NOWAIT). The rest is kernel surface no program here
# needs (io_uring, bpf, perf, userfaultfd, modules, clocks, swap ...).
DENIED = (
    *("unshare", "setns", "mount", "umount2", "pivot_root", "chroot"),
    *("open_tree", "move_mount", "fsopen", "fsconfig", "fsmount", "fspick", "mount_setattr"),
    *("keyctl", "add_key", "request_key"),
    *("ptrace", "process_vm_readv", "process_vm_writev", "process_madvise", "process_mrelease"),
    *("pidfd_open", "pidfd_getfd", "pidfd_send_signal", "kcmp"),
    *("memfd_create", "memfd_secret", "shmget", "shmat", "shmctl", "shmdt"),
    *("msgget", "msgsnd", "msgrcv", "msgctl", "semget", "semop", "semtimedop", "semctl"),
    *("mq_open", "mq_unlink", "mq_timedsend", "mq_timedreceive", "mq_notify", "mq_getsetattr"),
    *("io_setup", "io_submit", "io_getevents", "io_pgetevents", "io_destroy", "io_cancel"),
    *("vmsplice", "splice", "tee"),
    *("utime", "utimes", "utimensat", "futimesat"),
    *("setxattr", "lsetxattr", "fsetxattr", "removexattr", "lremovexattr", "fremovexattr"),
    *("flock", "inotify_init", "inotify_init1", "inotify_add_watch", "fanotify_init", "fanotify_mark"),
    *("fadvise64", "readahead", "mincore", "cachestat", "preadv2", "pwritev2"),
    *("io_uring_setup", "io_uring_enter", "io_uring_register", "bpf", "perf_event_open", "userfaultfd"),
    *("kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module", "reboot"),
    *("swapon", "swapoff", "acct", "quotactl", "quotactl_fd", "syslog", "vhangup", "lookup_dcookie"),
    *("settimeofday", "clock_settime", "clock_adjtime", "adjtimex", "sethostname", "setdomainname"),
    *("iopl", "ioperm", "modify_ldt", "name_to_handle_at", "open_by_handle_at"),
    *("personality", "uselib", "nfsservctl"),
)
CLONE_NAMESPACES = (0x00020000, 0x02000000, 0x04000000, 0x08000000, 0x10000000, 0x20000000, 0x40000000, 0x00000080)
AF_UNIX, SOL_SOCKET = 1, 1
# fcntl: growing a pipe (kernel memory outside RLIMIT_AS) and every lock command (locks on the bound
# files are shared with the host and other jails)
FCNTL_DENIED = {"F_SETPIPE_SZ": 1031, "F_GETLK": 5, "F_SETLK": 6, "F_SETLKW": 7}
FCNTL_DENIED |= {"F_OFD_GETLK": 36, "F_OFD_SETLK": 37, "F_OFD_SETLKW": 38}
IOCTL_DENIED = {"TIOCSTI": 0x5412, "TIOCLINUX": 0x541C}
# madvise: huge pages (a huge page pinned by one byte) and reclaim hints that evict shared page cache
MADVISE_DENIED = {"MADV_HUGEPAGE": 14, "MADV_COLD": 20, "MADV_PAGEOUT": 21, "MADV_COLLAPSE": 25}
# setsockopt(SOL_SOCKET, ...): socket buffers beyond the default size
SOCKOPT_DENIED = {"SO_SNDBUF": 7, "SO_RCVBUF": 8, "SO_SNDBUFFORCE": 32, "SO_RCVBUFFORCE": 33}
LOW32 = 0xFFFFFFFF  # the kernel reads int arguments as 32 bits: compare those, not all 64
# Numbers above every system call libseccomp 2.5 knows are refused with ENOSYS ("not implemented"), so a
# call a newer kernel added (statmount, listmount, open_tree_attr, ...) is closed until it is reviewed.
UNKNOWN_SYSCALLS = (457, 512)
NO_PROCESSES = ("fork", "vfork", "clone")  # EPERM; clone3 gets ENOSYS so libc falls back to clone

_COMPILE = r"""
import errno, json, os, sys
import seccomp
spec = json.loads(sys.argv[1])
f = seccomp.SyscallFilter(seccomp.ALLOW)
f.set_attr(seccomp.Attr.ACT_BADARCH, seccomp.KILL_PROCESS)  # i386 or x32 numbers: killed, not filtered
f.set_attr(seccomp.Attr.CTL_OPTIMIZE, 2)
eperm = seccomp.ERRNO(errno.EPERM)
for name in spec["deny"]:
    f.add_rule(eperm, name)
for number in range(*spec["unknown"]) if spec["unknown"] else ():
    f.add_rule(seccomp.ERRNO(errno.ENOSYS), number)
for name, *conditions in spec["args"]:
    f.add_rule(eperm, name, *(seccomp.Arg(arg, getattr(seccomp, op), *values) for arg, op, *values in conditions))
for name in spec["enosys"]:
    f.add_rule(seccomp.ERRNO(errno.ENOSYS), name)
f.export_bpf(os.fdopen(sys.stdout.fileno(), "wb", closefd=False))
"""


class SandboxUnavailable(RuntimeError):
    """The jail cannot be built on this host (a missing package, or namespaces refused)."""


def _compile(spec: dict) -> bytes:
    try:
        proc = subprocess.run(
            [SYSTEM_PYTHON, "-I", "-c", _COMPILE, json.dumps(spec)], capture_output=True, timeout=60, check=False
        )
    except OSError as e:
        raise SandboxUnavailable(f"cannot run {SYSTEM_PYTHON} to compile the seccomp filter: {e}") from None
    if proc.returncode != 0:
        tail = proc.stderr.decode(errors="replace").strip().splitlines()[-1:]
        raise SandboxUnavailable(
            "the code sandbox compiles its seccomp filter with libseccomp's Python bindings for "
            f"{SYSTEM_PYTHON} (Debian: apt-get install python3-seccomp): {' '.join(tail)}"
        )
    return proc.stdout


@lru_cache(maxsize=1)
def seccomp_programs() -> tuple[bytes, bytes]:
    """(DENIED for the whole jail, NO_PROCESSES for the program) as BPF, compiled once per process."""
    args = [("clone", (0, "MASKED_EQ", flag, flag)) for flag in CLONE_NAMESPACES]
    args.append(("socket", (0, "NE", AF_UNIX)))  # no network, netlink or packet sockets; unix ones are fine
    args += [("fcntl", (1, "MASKED_EQ", LOW32, cmd)) for cmd in FCNTL_DENIED.values()]
    args += [("ioctl", (1, "MASKED_EQ", LOW32, cmd)) for cmd in IOCTL_DENIED.values()]
    args += [("madvise", (2, "MASKED_EQ", LOW32, advice)) for advice in MADVISE_DENIED.values()]
    args += [
        ("setsockopt", (1, "MASKED_EQ", LOW32, SOL_SOCKET), (2, "MASKED_EQ", LOW32, opt))
        for opt in SOCKOPT_DENIED.values()
    ]
    args.append(("prlimit64", (0, "NE", 0)))  # its own limits only: not pid 1's
    denied = _compile({"deny": list(DENIED), "unknown": list(UNKNOWN_SYSCALLS), "args": args, "enosys": ["clone3"]})
    no_processes = _compile({"deny": list(NO_PROCESSES), "unknown": [], "args": [], "enosys": ["clone3"]})
    return denied, no_processes


def _elf_deps(paths: list[str]) -> set[str]:
    """Absolute paths of the shared libraries `paths` load (ldd, glibc's own resolver)."""
    ldd = shutil.which("ldd")
    if ldd is None:
        raise SandboxUnavailable("the code sandbox needs ldd (Debian's libc-bin) to find the interpreter's libraries")
    out = subprocess.run([ldd, *paths], capture_output=True, text=True, check=False).stdout
    deps = set()
    for line in out.splitlines():
        parts = line.split()
        for p in parts:
            if p.startswith("/") and os.path.exists(p):
                deps.add(p)
    return deps - set(paths)


def _stdlib(python: str) -> str:
    out = subprocess.run(
        [python, "-I", "-S", "-c", "import sysconfig; print(sysconfig.get_path('stdlib'))"],
        capture_output=True,
        text=True,
        check=False,
    )
    path = out.stdout.strip()
    if out.returncode != 0 or not os.path.isdir(path):
        raise SandboxUnavailable(f"{python} does not report its standard library: {out.stderr.strip()[-200:]}")
    return path


@lru_cache(maxsize=4)
def root_binds(python: str) -> tuple[tuple[str, str], ...]:
    """(host source, path in the jail) of every read-only bind of the minimal root. Each library is
    bound at its own directory's real path under its link name; the top-level links a merged-/usr
    system has (/lib -> usr/lib) are made by `root_links`."""
    if not os.access(python, os.X_OK):
        raise SandboxUnavailable(
            f"the code sandbox runs programs with {python}, which is not here (apt-get install python3)"
        )
    stdlib = _stdlib(python)
    dynload = os.path.join(stdlib, "lib-dynload")
    modules = sorted(os.path.join(dynload, f) for f in os.listdir(dynload) if f.endswith(".so"))
    binds = {os.path.realpath(python): python, stdlib: stdlib}
    for lib in _elf_deps([os.path.realpath(python), *modules]):
        binds[os.path.realpath(lib)] = os.path.join(os.path.realpath(os.path.dirname(lib)), os.path.basename(lib))
    return tuple(sorted(binds.items(), key=lambda kv: kv[1]))


def root_links() -> tuple[tuple[str, str], ...]:
    """(target, link) for the host's top-level directory links (/lib -> usr/lib on merged /usr)."""
    links = []
    for name in ("bin", "lib", "lib32", "lib64", "libx32", "sbin"):
        path = "/" + name
        if os.path.islink(path):
            links.append((os.readlink(path), path))
    return tuple(links)


def bwrap() -> str:
    path = shutil.which("bwrap")
    if path is None:
        raise SandboxUnavailable("the code sandbox needs bubblewrap (Debian: apt-get install bubblewrap)")
    return path


def jail_argv(python: str, code_fd: int, seccomp_fd: int) -> list[str]:
    """The bubblewrap command line up to (not including) the supervisor, run by the launcher."""
    under_tmp = [src for src, _ in root_binds(python) if src == "/tmp" or src.startswith("/tmp/")]
    if under_tmp:
        raise SandboxUnavailable(
            f"the code sandbox cannot bind {under_tmp[0]}: the jail's own tmpfs covers /tmp where bubblewrap "
            "starts, so the interpreter and its libraries must live outside /tmp"
        )
    argv = [bwrap(), "--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent", "--new-session"]
    argv += ["--as-pid-1", "--cap-drop", "ALL", "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID)]
    argv += ["--hostname", "sandbox", "--clearenv"]
    for src, dest in root_binds(python):
        argv += ["--ro-bind", src, dest]
    for target, link in root_links():
        argv += ["--symlink", target, link]
    for dev in DEVICES:
        argv += ["--dev-bind", f"/dev/{dev}", f"/dev/{dev}"]
    argv += ["--bind", "/tmp", "/tmp", "--perms", "0700", "--dir", WORK]  # the launcher's capped tmpfs
    argv += ["--perms", "0600", "--file", str(code_fd), f"{WORK}/main.py", "--remount-ro", "/"]
    argv += ["--seccomp", str(seccomp_fd), "--chdir", WORK]
    return argv


# Runs first, outside the jail, as the caller. argv: procs uid size_bytes files bwrap-argv... (procs: the
# call's cgroup.procs or ""; uid: the jail's uid or "" to stay the caller). It enters the call's cgroup,
# makes a mount namespace (and, when not root, a user namespace that maps only the caller's ids, as
# user_namespaces(7) allows any user), makes every mount in it private so nothing propagates to the
# host, mounts the capped tmpfs over /tmp, drops to the jail's uid and execs bubblewrap. The namespace and
# its tmpfs end with the last process in it; nothing is mounted where the host sees it.
LAUNCHER = r"""
import ctypes, os, sys
procs, uid, size, files = sys.argv[1:5]
NEWNS, NEWUSER, REC_PRIVATE, NOSUID_NODEV = 0x00020000, 0x10000000, 0x4000 | 0x40000, 0x2 | 0x4
libc = ctypes.CDLL(None, use_errno=True)
def call(what, name, *args):
    if getattr(libc, name)(*args) != 0:
        sys.exit(f"the jail's launcher could not {what}: {os.strerror(ctypes.get_errno())}")
if procs:
    with open(procs, "w") as f:
        f.write(str(os.getpid()))
owner, group = (int(uid), int(uid)) if uid else (os.geteuid(), os.getegid())
if os.geteuid() == 0:
    call("make a mount namespace", "unshare", NEWNS)
else:
    call("make a user and mount namespace", "unshare", NEWNS | NEWUSER)
    for name, text in (("setgroups", "deny"), ("uid_map", f"{owner} {owner} 1"), ("gid_map", f"{group} {group} 1")):
        with open(f"/proc/self/{name}", "w") as f:
            f.write(text)
call("make its mounts private", "mount", None, b"/", None, REC_PRIVATE, None)
options = f"size={size},nr_inodes={files},mode=1777,uid={owner},gid={group}"
call(f"mount /tmp ({options})", "mount", b"tmpfs", b"/tmp", b"tmpfs", NOSUID_NODEV, options.encode())
if uid:
    os.setgroups([])
    os.setresgid(group, group, group)
    os.setresuid(owner, owner, owner)
os.execv(sys.argv[5], sys.argv[5:])
"""


def launcher_argv(procs: str, uid: int | None, file_mb: int, files: int) -> list[str]:
    """The command that enters the cgroup, mounts the capped /tmp and execs what follows it."""
    args = (procs, "" if uid is None else str(uid), str(file_mb << 20), str(files))
    return [SYSTEM_PYTHON, "-I", "-S", "-c", LAUNCHER, *args]


# The jail's pid 1. argv: status_fd filter_fd memory_mb cpu_s file_mb open_files python work (it imports
# little: every module is start-up time of every call). It writes on `status_fd` "exit N", "signal N" or
# "setup <message>", and nothing if it is itself killed; "files" or "bytes" follows the exit or signal
# when /tmp was left full (no name or no byte free), which is why a write failed with ENOSPC.
SUPERVISOR = r"""
import ctypes, os, resource, sys, _signal
status, filter_fd, memory_mb, cpu_s, file_mb, open_files = map(int, sys.argv[1:7])
python, work = sys.argv[7:9]
_signal.signal(2, _signal.SIG_DFL)
libc = ctypes.CDLL(None, use_errno=True)
libc.prctl(4, 0, 0, 0, 0)
program = b""
while chunk := os.read(filter_fd, 65536):
    program += chunk
os.close(filter_fd)
r, w = os.pipe2(os.O_CLOEXEC)
pid = os.fork()
if pid == 0:
    try:
        os.close(r)
        os.close(status)
        for res, soft, hard in (
            (resource.RLIMIT_AS, memory_mb << 20, memory_mb << 20),
            (resource.RLIMIT_CPU, cpu_s, cpu_s + 1),
            (resource.RLIMIT_FSIZE, file_mb << 20, file_mb << 20),
            (resource.RLIMIT_NOFILE, open_files, open_files),
            (resource.RLIMIT_CORE, 0, 0),
            (resource.RLIMIT_MSGQUEUE, 0, 0),
            (resource.RLIMIT_MEMLOCK, 0, 0),
        ):
            resource.setrlimit(res, (soft, hard))
        class Prog(ctypes.Structure):
            _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_char_p)]
        prog = Prog(len(program) // 8, program)
        if libc.prctl(38, 1, 0, 0, 0) != 0 or libc.prctl(22, 2, ctypes.byref(prog), 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "seccomp filter not applied")
        os.closerange(3, w)
        os.closerange(w + 1, 1 << 16)
        env = {"PATH": "/usr/bin:/bin", "HOME": work, "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1",
               "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
        os.execve(python, [python, "-I", "main.py"], env)
    except BaseException as e:
        os.write(w, f"{type(e).__name__}: {e}".encode()[:2000])
        os._exit(125)
os.close(w)
failed = os.read(r, 4096)
_, st = os.waitpid(pid, 0)
try:
    fs = os.statvfs("/tmp")
    full = b" files" if fs.f_ffree == 0 else b" bytes" if fs.f_bavail == 0 else b""
except OSError:
    full = b""
if failed:
    report = b"setup " + failed
elif os.WIFSIGNALED(st):
    report = b"signal %d" % os.WTERMSIG(st) + full
else:
    report = b"exit %d" % os.WEXITSTATUS(st) + full
os.write(status, report)
"""


def supervisor_argv(python: str, status_fd: int, filter_fd: int, limits) -> list[str]:
    numbers = (status_fd, filter_fd, limits.memory_mb, limits.cpu_s, limits.file_mb, limits.open_files)
    return [python, "-I", "-S", "-c", SUPERVISOR, *map(str, numbers), python, WORK]
