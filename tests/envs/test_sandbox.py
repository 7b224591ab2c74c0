"""The code sandbox (envs/sandbox.py) against a corpus of hostile programs: each is contained (the call
ends with an error or a kill, the harness goes on, nothing outside the sandbox changes), and
ordinary code still runs. Real kernel mechanisms, no mocks: these tests need root, as the sandbox does."""

from __future__ import annotations

import os
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from envs.sandbox import Limits, check_available, run_python

REPO = Path(__file__).resolve().parents[2]
# a wall clock well above what these calls take (~0.1-0.4 s here), so a loaded machine does not turn
# a containment check into a wall kill; the tests that are about time assert their own bounds
FAST = Limits(wall_s=15.0, cpu_s=3, memory_mb=256)


@pytest.fixture(scope="module", autouse=True)
def available():
    check_available()  # raises with the reason (e.g. not root) instead of skipping silently


def test_ordinary_code_runs_and_errors_are_cut_to_their_last_lines():
    r = run_python("import math\nprint(sum(i * i for i in range(10)), math.gcd(12, 18))", FAST)
    assert r.ok and r.stdout == "285 6\n"
    r = run_python("def f(n):\n    return f(n - 1) if n else 1 / 0\nf(50)\n", FAST)
    assert r.exit_code == 1 and r.observation().startswith("Error:")
    assert "ZeroDivisionError" in r.observation() and len(r.observation().splitlines()) <= 6


def test_fork_bomb():
    t0 = time.monotonic()
    r = run_python("import os\nwhile True:\n    os.fork()\n", FAST)
    assert not r.ok and "BlockingIOError" in r.stderr and time.monotonic() - t0 < 3


def test_infinite_loop_is_killed_at_the_wall_limit():
    r = run_python("while True:\n    pass\n", Limits(wall_s=1.0, cpu_s=30))
    assert r.timed_out and r.killed_by == "wall" and r.observation() == "Error: time limit exceeded"
    r = run_python("while True:\n    pass\n", Limits(wall_s=30.0, cpu_s=1))  # or at the CPU limit
    assert not r.ok and r.killed_by == "SIGXCPU" and r.observation() == "Error: CPU time limit exceeded"


def test_memory_bomb():
    # containment, not speed, is checked here: a generous wall clock so a slow or loaded machine (CI
    # once took over 3 s on this call) does not turn the memory error into a wall kill
    roomy = Limits(wall_s=60.0, cpu_s=30, memory_mb=256)
    r = run_python("x = bytearray(4 * 1024 ** 3)\n", roomy)
    assert not r.ok and "MemoryError" in r.stderr
    r = run_python("x = []\nwhile True:\n    x.append(' ' * 10 ** 7)\n", roomy)
    assert not r.ok and "MemoryError" in r.stderr


def test_a_100_mb_print_is_capped():
    t0 = time.monotonic()
    r = run_python("print('x' * 100_000_000)\n", FAST)
    assert r.output_capped and len(r.stdout) <= FAST.output_bytes and time.monotonic() - t0 < 3
    assert r.observation().endswith("[output truncated]")


def test_writing_outside_the_working_directory(tmp_path):
    targets = [REPO / "sandbox_was_here", Path("/tmp/sandbox_was_here"), tmp_path / "x", Path.home() / "x"]
    attempt = (
        "try:\n    open({0!r}, 'w').write('pwned')\n    print('wrote', {0!r})\n"
        "except OSError as e:\n    print('refused', e)"
    )
    code = "\n".join(attempt.format(str(t)) for t in targets)
    r = run_python(code + "\nopen('inside.txt', 'w').write('fine')\nprint(open('inside.txt').read())\n", FAST)
    assert r.ok and r.stdout.splitlines()[-1] == "fine"  # its own working directory is writable
    assert not any(t.exists() for t in targets)  # nothing outside the sandbox changed
    # the private /tmp takes the write, and it is gone with the call
    assert "wrote /tmp/sandbox_was_here" in r.stdout and "refused" in r.stdout


def test_one_call_cannot_read_another_calls_files():
    writer = "open('secret.txt', 'w').write('s3cr3t')\nimport time\ntime.sleep(1.5)\nprint('done')\n"
    reader = (
        "import os, glob\n"
        "found = glob.glob('/tmp/**/secret.txt', recursive=True) + glob.glob('/proc/*/root/tmp/work/secret.txt')\n"
        "print('found', found, os.listdir('.'))\n"
    )
    with ThreadPoolExecutor(2) as pool:
        w = pool.submit(run_python, writer, FAST)
        time.sleep(0.5)
        r = pool.submit(run_python, reader, FAST).result()
        assert w.result().ok
    assert r.ok and r.stdout.startswith("found [] ['main.py']")
    again = run_python(reader, FAST)  # and nothing is left for a later call
    assert again.stdout.startswith("found [] ['main.py']")


def test_no_socket_reaches_the_host():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.settimeout(2)
    port = server.getsockname()[1]
    accepted = []

    def accept():
        try:
            accepted.append(server.accept())
        except OSError:
            pass

    t = threading.Thread(target=accept)
    t.start()
    code = (
        f"import socket\ns = socket.socket()\ns.settimeout(1)\ns.connect(('127.0.0.1', {port}))\nprint('connected')\n"
    )
    r = run_python(code, FAST)
    t.join()
    server.close()
    assert not r.ok and "connected" not in r.stdout and not accepted
    assert "OSError" in r.stderr or "ConnectionRefusedError" in r.stderr or "Network is unreachable" in r.stderr


def test_spawning_a_shell_fails():
    code = (
        "import os, subprocess\n"
        "print('system', os.system('echo pwned > /tmp/shell_marker'))\n"
        "subprocess.run(['sh', '-c', 'echo pwned'])\n"
    )
    r = run_python(code, FAST)
    assert not r.ok and "BlockingIOError" in r.stderr and "pwned" not in r.stdout
    assert not Path("/tmp/shell_marker").exists()


def test_killing_the_parent_fails():
    host = os.getpid()
    code = (
        "import os, signal\n"
        f"for pid in ({host}, os.getppid(), 1):\n"
        "    try:\n        os.kill(pid, signal.SIGKILL)\n        print('sent', pid)\n"
        "    except OSError as e:\n        print('refused', pid, type(e).__name__)\n"
    )
    r = run_python(code, FAST)
    assert f"refused {host} ProcessLookupError" in r.stdout  # the host's processes are not visible
    assert "refused 1 PermissionError" in r.stdout  # the namespace's first process is root's
    assert os.getpid() == host  # and we are alive to check


def test_ctypes_libc_gets_no_further():
    victim = REPO / "README.md"
    before = victim.read_bytes()
    code = (
        "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "print('system', libc.system(b'touch /tmp/ctypes_marker'))\n"
        f"print('unlink', libc.unlink({str(victim).encode()!r}), ctypes.get_errno())\n"
        "print('setuid', libc.setuid(0), ctypes.get_errno())\n"
        "print('fork', libc.fork())\n"
    )
    r = run_python(code, FAST)
    lines = dict(line.split(" ", 1) for line in r.stdout.splitlines())
    assert lines["system"] != "0" and lines["unlink"].startswith("-1") and lines["setuid"].startswith("-1")
    assert lines["fork"] == "-1"
    assert victim.read_bytes() == before and not Path("/tmp/ctypes_marker").exists()


def test_the_harness_goes_on_while_hostile_calls_run():
    hostile = ["import os\nwhile True:\n    os.fork()\n", "while True:\n    pass\n", "print('x' * 10**8)\n"]
    with ThreadPoolExecutor(4) as pool:
        bad = [pool.submit(run_python, c, Limits(wall_s=2.0, cpu_s=2)) for c in hostile]
        good = [pool.submit(run_python, f"print({i} * 2)", FAST) for i in range(6)]
        assert [g.result().stdout for g in good] == [f"{i * 2}\n" for i in range(6)]
        assert not any(b.result().ok for b in bad)
