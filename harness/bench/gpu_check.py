"""The GPU check: one command, on one NVIDIA GPU with no network, from a fresh clone.

    python3 -m harness.bench.gpu_check [--wheels DIR] [--out gpu_check.json]

It needs only what a PyTorch GPU image has (torch with CUDA, numpy, pandas, matplotlib, pyyaml,
rich, typer, tokenizers, safetensors, huggingface_hub, peft, pytest) plus the wheels in WHEELS,
installed from DIR (default `.whl`) into a private folder with pip's --no-index --no-deps: nothing
is fetched. On a machine with network, `python3 -m harness.bench.gpu_check --download DIR`
fetches them first (for Python 3.12 on x86-64 Linux; --python-version to change).

Steps, each timed and recorded in the JSON report (sized to take under 8 minutes on one H200;
not yet run on one: 7 minutes in --cpu mode on a 2-core CPU):
1. the environment: torch, CUDA, the GPU, transformers and peft versions;
2. the `gpu` tests (in tests/harness/rl/: engines/test_static_kv.py, test_gpu_path.py,
   engines/test_vllm_backend.py: the vLLM ones skip with their reason where vLLM is not installed);
3. `harness bench` on CUDA, parts engines (HF generate vs ours at Qwen2.5-0.5B's shape with random
   weights, batches 64 and 256) and update (that shape, 8 x 2048), with the issue's targets next to
   the measured values;
4. the tiny clipping sweep on CUDA with the static engine: 5 points, seed 0, 3 updates, 32
   held-out maps (`harness sweep sweeps/clipping.yaml -o train.device=cuda ...`);
5. `harness bench` on CUDA, parts rollout and log-prob memory (the tiny model).
The steps share --deadline (default 540 s, inside a 10-minute limit); the report is rewritten
after each step, so a run stopped early keeps what it measured.

`--cpu` runs the same steps on the CPU (with the CPU sizes of `harness bench`), to check the
script itself on a machine without a GPU; its figures are not GPU figures.
Only the standard library is imported here: the harness runs in subprocesses once the wheels
are on their path.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# what the harness needs beyond a PyTorch GPU image (checked against one: torch 2.11, transformers
# 5.17, peft, pytest, pandas, matplotlib, pyyaml, rich, typer, tokenizers 0.23, huggingface_hub 1.33)
WHEELS = (
    "transformers==5.24.0",
    "pydantic==2.14.4",
    "pydantic-core==2.50.5",
    "annotated-types==0.8.0",
    "typing-inspection==0.4.5",
    "gymnasium==1.4.0",
    "farama-notifications==0.0.6",
)
GPU_TESTS = (
    "tests/harness/rl/engines/test_static_kv.py",
    "tests/harness/rl/test_gpu_path.py",
    "tests/harness/rl/engines/test_vllm_backend.py",
)
SWEEP_OVERRIDES = (
    "train.updates=3",
    "train.eval_every=0",
    "train.checkpoint_every=0",
    "train.mi_every=0",
    "train.eval_episodes=32",
    "env.heldout_tasks=32",
    "train.threads=0",
    "rollout.backend=static",
)
TARGETS = {  # issue 18, one H200, Qwen2.5-0.5B shape
    "static engine vs HF generate, batch 256": (">=", 10.0),
    "static engine, fraction of the bandwidth floor, batch 256": (">=", 0.20),
    "update peak memory at 8 x 2048, GiB": ("<=", 16.0),
}


def download(dest: Path, python_version: str) -> int:
    """pip download WHEELS into dest for CPython `python_version` on manylinux x86-64."""
    dest.mkdir(parents=True, exist_ok=True)
    plats = ["manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64"]
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-d", str(dest)]
    cmd += ["--python-version", python_version, "--implementation", "cp"]
    for p in plats:
        cmd += ["--platform", p]
    return subprocess.call(cmd + list(WHEELS))


def install(wheels: Path, target: Path) -> dict:
    files = sorted(str(p) for p in wheels.glob("*.whl"))
    if not files:
        return {"status": "skipped", "reason": f"no wheels in {wheels}"}
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile"]
    cmd += ["--no-cache-dir", "--upgrade", "--target", str(target), *files]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    return {
        "status": "ok" if proc.returncode == 0 else "failed",
        "wheels": [Path(f).name for f in files],
        "output": proc.stdout[-2000:] + proc.stderr[-2000:],
    }


def _run(cmd: list[str], env: dict, timeout: int, log: Path) -> dict:
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
        rc, out = proc.returncode, proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as e:
        rc = 124
        out = (e.stdout or b"").decode(errors="replace") + (e.stderr or b"").decode(errors="replace")
        out += f"\n[timed out after {timeout} s]"
    log.write_text(out)
    return {"command": " ".join(cmd), "rc": rc, "seconds": round(time.perf_counter() - t0, 1), "tail": out[-1500:]}


def environment(env: dict) -> dict:
    code = (
        "import json, torch, transformers, peft;"
        "c = torch.cuda.is_available();"
        "print(json.dumps({'torch': torch.__version__, 'cuda': torch.version.cuda, 'cuda_available': c,"
        "'gpu': torch.cuda.get_device_name(0) if c else None,"
        "'gpu_memory_gib': torch.cuda.get_device_properties(0).total_memory / 2**30 if c else None,"
        "'transformers': transformers.__version__, 'peft': peft.__version__}))"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        return {"error": proc.stderr[-2000:]}
    info = json.loads(proc.stdout.strip().splitlines()[-1])
    info.update(python=platform.python_version(), machine=platform.machine())
    return info


def _pytest_counts(tail: str) -> dict:
    counts = {}
    for n, word in re.findall(r"(\d+) (passed|failed|skipped|error|errors|deselected)", tail):
        counts[word] = int(n)
    return counts


def targets(bench: dict) -> dict:
    """The issue's targets next to the measured values (None where the part did not run)."""
    eng = bench.get("engines", {}).get("by_batch", {}).get("256", {})
    upd = bench.get("update_at_shape", {}).get("checkpointing", {})
    measured = {
        "static engine vs HF generate, batch 256": eng.get("static_vs_generate"),
        "static engine, fraction of the bandwidth floor, batch 256": eng.get("static_fraction_of_floor"),
        "update peak memory at 8 x 2048, GiB": upd.get("peak_gib"),
    }
    out = {}
    for name, (op, bound) in TARGETS.items():
        value = measured[name]
        met = None if value is None else (value >= bound if op == ">=" else value <= bound)
        out[name] = {"target": f"{op} {bound}", "measured": value, "met": met}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m harness.bench.gpu_check", description=__doc__.split("\n\n")[0])
    ap.add_argument("--wheels", type=Path, default=REPO / ".whl", help="folder of the wheels in WHEELS")
    ap.add_argument("--out", type=Path, default=Path("gpu_check.json"), help="the JSON report")
    ap.add_argument("--download", type=Path, default=None, help="only fetch the wheels into this folder")
    ap.add_argument("--python-version", default="3.12", help="with --download: the target's Python")
    ap.add_argument("--cpu", action="store_true", help="run the steps on the CPU (checks the script only)")
    ap.add_argument("--skip", action="append", default=[], help="tests, sweep and/or bench")
    ap.add_argument(
        "--deadline", type=int, default=540, help="seconds for all steps together (each step is cut to fit)"
    )
    args = ap.parse_args(argv)
    if args.download is not None:
        return download(args.download, args.python_version)
    report: dict = {"started": time.strftime("%Y-%m-%d %H:%M:%S"), "mode": "cpu" if args.cpu else "cuda"}
    work = Path(tempfile.mkdtemp(prefix="harness-gpu-check-"))
    site = work / "site"
    report["wheels"] = install(args.wheels, site)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(site), str(REPO), env.get("PYTHONPATH", "")) if p)
    env.update(HF_HUB_OFFLINE="1", HOME=str(work / "home"), HARNESS_CACHE=str(work / "cache"), PYTHONUNBUFFERED="1")
    env.setdefault("MPLBACKEND", "Agg")
    report["environment"] = environment(env)
    device = "cpu" if args.cpu else "cuda"
    if not args.cpu and not report["environment"].get("cuda_available"):
        report["error"] = "no CUDA device visible to torch (use --cpu to check the script on a CPU)"
        args.out.write_text(json.dumps(report, indent=2) + "\n")
        print(report["error"], file=sys.stderr)
        return 2
    py, steps, t_start = sys.executable, {}, time.monotonic()
    report["steps"], report["logs"] = steps, str(work)

    def done(name: str, r: dict) -> None:
        """Record a step and rewrite the report, so a run stopped later keeps what it measured."""
        steps[name] = r
        args.out.write_text(json.dumps(report, indent=2, default=str) + "\n")
        print(f"{name}: rc {r['rc']} in {r['seconds']} s", flush=True)

    def left(cap: int) -> int:
        """A step's time limit: its own cap, within what is left of --deadline (30 s at least)."""
        return max(30, min(cap, int(args.deadline - (time.monotonic() - t_start))))

    def bench(name: str, parts: tuple[str, ...], cap: int) -> None:
        out = work / f"{name}.json"
        cmd = [py, "-m", "harness", "bench", "configs/frozenlake_tiny.yaml", "-o", f"train.device={device}"]
        cmd += ["-o", "train.threads=0", "--steps", "2", "--out", str(out)]
        for part in parts:
            cmd += ["--only", part]
        r = _run(cmd, env, left(cap), work / f"{name}.log")
        r["result"] = json.loads(out.read_text()) if out.exists() else None
        if r["result"] and "engines" in parts:
            report["targets"] = targets(r["result"])
        done(name, r)

    # most important first: the tests, then the figures, then the sweep and the small benches
    if "tests" not in args.skip:
        marker = "gpu" if not args.cpu else "not slow"
        cmd = [py, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", marker, *GPU_TESTS]
        r = _run(cmd, env, left(180), work / "tests.log")
        r["counts"] = _pytest_counts(r["tail"])
        done("gpu_tests", r)
    if "bench" not in args.skip:
        bench("bench_shapes", ("engines", "update"), 300)
    if "sweep" not in args.skip:
        over = [a for o in (*SWEEP_OVERRIDES, f"train.device={device}") for a in ("-o", o)]
        cmd = [py, "-m", "harness", "sweep", "sweeps/clipping.yaml", "--seeds", "0", "--no-mlflow", "--workers", "5"]
        r = _run([*cmd, "--results", str(work / "results"), *over], env, left(240), work / "sweep.log")
        summaries = sorted((work / "results" / "clipping").glob("*/summary.json"))
        finished = [p for p in summaries if json.loads(p.read_text()).get("status") == "done"]
        r["points_done"] = len(finished)
        r["final_metrics"] = {}
        for d in finished:
            rows = (d.parent / "metrics.jsonl").read_text().splitlines()
            last = json.loads(rows[-1]) if rows else {}
            keep = ("eval_sampled/success", "eval_greedy/success", "perf/rollout_tokens", "time/update_s")
            r["final_metrics"][d.parent.name] = {k: last.get(k) for k in keep if k in last}
        done("clipping_sweep", r)
    if "bench" not in args.skip:
        bench("bench_small", ("rollout", "memory"), 180)
    report["finished"] = time.strftime("%Y-%m-%d %H:%M:%S")
    args.out.write_text(json.dumps(report, indent=2, default=str) + "\n")
    failed = [k for k, v in steps.items() if v["rc"] != 0]
    print(f"wrote {args.out}; steps failed: {', '.join(failed) or 'none'}; logs in {work}")
    for name, t in report.get("targets", {}).items():
        print(f"  {name}: {t['measured']} (target {t['target']}, met: {t['met']})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
