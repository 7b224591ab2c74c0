"""Per-call cost of the code sandbox (envs/sandbox.py) against the same interpreter run bare.

Both sides run the same programs with the same interpreter (/usr/bin/python3 -I main.py) in the same
process, alternating, so the ratio says what the jail costs (namespaces, binds, seccomp, the
supervisor) on top of starting Python; it is a ratio, not a pass/fail time."""

from __future__ import annotations

import os
import statistics
import subprocess
import tempfile
import time

from envs.sandbox import Limits, default_python, run_python

PROGRAMS = {
    "print": "print(6 * 7)\n",
    "tir_expert": "from math import lcm\nn, p, q, r = 5000, 3, 7, 10\nprint(n // p + n // q - n // lcm(p, q))\n",
}


def _bare_seconds(code: str, folder: str) -> float:
    path = os.path.join(folder, "main.py")
    with open(path, "w") as f:
        f.write(code)
    t0 = time.perf_counter()
    subprocess.run([default_python(), "-I", "main.py"], cwd=folder, capture_output=True, check=True)
    return time.perf_counter() - t0


def _sandbox_seconds(code: str) -> float:
    t0 = time.perf_counter()
    result = run_python(code, Limits(wall_s=30.0))
    elapsed = time.perf_counter() - t0
    if not result.ok:
        raise RuntimeError(f"the sandbox did not run the benchmark program: {result.observation()}")
    return elapsed


def bench_sandbox(repeats: int = 30) -> dict:
    """Median seconds per call of each program, bare and sandboxed, and their ratio."""
    out = {}
    with tempfile.TemporaryDirectory() as folder:
        for name, code in PROGRAMS.items():
            _bare_seconds(code, folder), _sandbox_seconds(code)  # warm-up: page cache, seccomp compiled once
            bare, boxed = [], []
            for _ in range(repeats):
                bare.append(_bare_seconds(code, folder))
                boxed.append(_sandbox_seconds(code))
            b, s = statistics.median(bare), statistics.median(boxed)
            out[name] = {"bare_s": round(b, 4), "sandbox_s": round(s, 4), "ratio": round(s / b, 2)}
    return out
