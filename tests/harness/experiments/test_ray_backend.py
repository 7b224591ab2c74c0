"""`harness sweep --backend ray`: a real Ray head started here (127.0.0.1 only, no dashboard), results
identical to the local backend's with the real trainer, retries, a local instance started by the
command itself, and the message when ray is not installed.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import yaml

from harness.experiments.runner import RunOptions, run_sweep
from harness.experiments.sweep import load_sweep
from harness.store import read_jsonl
from tests.support.pause import paused, wait_until

pytest.importorskip("ray")  # the optional extra `dist`

from tests.helpers import REPO  # noqa: E402

RAY = Path(sys.executable).parent / "ray"
LOOPBACK_ONLY = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0"}
TOKEN = secrets.token_hex(32)  # the test head's authentication token


def cli_env(**env: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO), **env}


def harness(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "harness", *args],
        cwd=REPO,
        env=cli_env(**env),
        capture_output=True,
        text=True,
        timeout=900,  # a guard against hangs: two suites in parallel on 2 cores took 300 s once
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def outside_ip() -> str | None:
    """This host's address on its main interface (no packet is sent), or None."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("192.0.2.123", 9))
            ip = s.getsockname()[0]
    except OSError:
        return None
    return None if ip.startswith("127.") else ip


def reachable(ip: str, port: int) -> bool:
    try:
        with socket.create_connection((ip, port), timeout=1):
            return True
    except OSError:
        return False


@pytest.fixture(scope="module")
def ray_head():
    """`ray start --head --block` on 127.0.0.1 with token authentication (TOKEN); stopped (SIGTERM to
    that process) after the module."""
    port, temp = free_port(), tempfile.mkdtemp(prefix="rayh", dir="/tmp")  # short: Unix socket paths
    log = open(Path(temp) / "head.log", "w")
    proc = subprocess.Popen(
        [
            str(RAY),
            "start",
            "--head",
            "--node-ip-address",
            "127.0.0.1",
            "--port",
            str(port),
            "--include-dashboard",
            "false",
            "--num-cpus",
            "2",
            "--disable-usage-stats",
            "--temp-dir",
            temp,
            "--block",
        ],
        env=cli_env(**LOOPBACK_ONLY, RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=TOKEN),
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 120
        while "Ray runtime started" not in (Path(temp) / "head.log").read_text():
            assert proc.poll() is None and time.monotonic() < deadline, (Path(temp) / "head.log").read_text()
            time.sleep(0.2)
        yield f"127.0.0.1:{port}"
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=90)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def write_sweep(tmp_path: Path, base: dict, grid: dict, points: list | None = None) -> Path:
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({"name": "s", "base": base, "grid": grid, "points": points or [], "seeds": [0]}))
    return path


def files(d: Path) -> dict[str, str]:
    return {p.name: p.read_text() for p in d.iterdir() if p.is_file()}


def test_head_listens_on_loopback_only(ray_head):
    port = int(ray_head.rpartition(":")[2])
    assert reachable("127.0.0.1", port)
    ip = outside_ip()
    if ip is None:
        pytest.skip("no non-loopback interface to check")
    assert not reachable(ip, port)


def test_ray_sweep_matches_the_local_backend_with_the_real_trainer(tmp_path, ray_head):
    from tests.helpers.configs import TINY

    base = json.loads(json.dumps(TINY))
    base["train"].update(updates=2, eval_every=1)
    path = write_sweep(tmp_path, base, {"algo.lr": [1.0e-3, 3.0e-3]})
    sweep = load_sweep(path)
    local = run_sweep(sweep, RunOptions(results=tmp_path / "local"))
    assert local.ok and local.counts["done"] == 2
    out = harness(
        "sweep",
        str(path),
        "--backend",
        "ray",
        "--address",
        ray_head,
        "--results",
        str(tmp_path / "ray"),
        "--no-mlflow",
        HARNESS_TRAIN_FN="",
        RAY_AUTH_TOKEN=TOKEN,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "sweep s: 2 done, 0 diverged, 0 failed" in out.stdout
    for p in sweep.points:
        a, b = files(tmp_path / "local" / "s" / p.id), files(tmp_path / "ray" / "s" / p.id)
        assert set(a) == set(b)
        for name in ("metrics.jsonl", "samples.jsonl", "config.yaml", "status"):
            assert a[name] == b[name], name  # every metrics row, bit for bit
        assert len(read_jsonl(tmp_path / "ray" / "s" / p.id / "metrics.jsonl")) == 3
        sa, sb = json.loads(a["summary.json"]), json.loads(b["summary.json"])
        wall = "cost/wall_s"  # the one measurement in a summary that differs between two runs
        assert sa["metrics"].pop(wall) > 0 and sb["metrics"].pop(wall) > 0
        assert sa["metrics"] == sb["metrics"] and sa["status"] == sb["status"] == "done"
        assert sa["config_hash"] == sb["config_hash"] and sa["packages"] == sb["packages"]


def test_local_instance_on_loopback_with_retries(tmp_path):
    base = {"env": {"name": "frozenlake"}, "train": {"updates": 2, "eval_every": 1}, "tracking": {"mlflow": False}}
    path = write_sweep(
        tmp_path,
        base,
        {"algo.lr": [1.0e-3, 2.0e-3]},
        [{"label": "once", "model.name": "fake-once"}, {"label": "never", "model.name": "fake-fail"}],
    )
    results = tmp_path / "results"
    out = harness(
        "sweep",
        str(path),
        "--backend",
        "ray",
        "--retries",
        "1",
        "--workers",
        "2",
        "--results",
        str(results),
        "--no-mlflow",
        HARNESS_TRAIN_FN="tests.support.tune_fake_trainer:train",
    )
    assert out.returncode == 1, out.stdout + out.stderr  # one point fails for good
    assert "sweep s: 3 done, 0 diverged, 1 failed" in out.stdout
    by_label = {p.label or p.variant: p.id for p in load_sweep(path).points}
    for label, pid in by_label.items():
        d = results / "s" / pid
        calls = read_jsonl(d / "fake_calls.jsonl")
        assert {c["ray_node_ip"] for c in calls} == {"127.0.0.1"}  # the instance it started is loopback only
        starts = [e for e in read_jsonl(d / "events.jsonl") if e["event"] == "start"]
        assert len(starts) == (2 if label in ("once", "never") else 1), label
        assert (d / "status").read_text().strip() == ("failed" if label == "never" else "done")
    assert "fake-fail: attempt 2 fails" in (results / "s" / by_label["never"] / "traceback.txt").read_text()


def test_an_interrupted_ray_sweep_resumes_from_checkpoints(tmp_path):
    base = {
        "env": {"name": "frozenlake"},
        "train": {"updates": 12, "eval_every": 4, "checkpoint_every": 1},
        "tracking": {"mlflow": False},
    }
    path, results = write_sweep(tmp_path, base, {"algo.lr": [1.0e-3, 2.0e-3]}), tmp_path / "results"
    cmd = [
        sys.executable,
        "-m",
        "harness",
        "sweep",
        str(path),
        "--backend",
        "ray",
        "--workers",
        "2",
        "--results",
        str(results),
        "--no-mlflow",
    ]
    env = cli_env(HARNESS_TRAIN_FN="tests.support.tune_fake_trainer:train", FAKE_PAUSE_AT="3")
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    dirs = [results / "s" / p.id for p in load_sweep(path).points]
    wait_until(lambda: all(map(paused, dirs)), proc)  # both wait after update 3 for the signal
    proc.send_signal(signal.SIGTERM)  # the CLI turns it into Ctrl-C: running tasks are cancelled
    out = proc.communicate(timeout=120)[0]
    assert proc.returncode == 130 and "interrupted: run the same command again" in out, out
    for d in dirs:
        assert (d / "status").read_text().strip() == "running"
        assert [e["event"] for e in read_jsonl(d / "events.jsonl")] == ["start", "interrupted"]
    again = subprocess.run(cmd, cwd=REPO, env={**env, "FAKE_PAUSE_AT": ""}, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and "sweep s: 2 done" in again.stdout, again.stdout + again.stderr
    for d in dirs:
        starts = [c["start"] for c in read_jsonl(d / "fake_calls.jsonl")]
        assert starts[0] == 0 and starts[1] >= 1 and len(starts) == 2  # resumed from its checkpoint
        assert [r["update"] for r in read_jsonl(d / "metrics.jsonl")] == list(range(13))


def test_missing_ray_and_misplaced_options_are_clear_messages(tmp_path):
    base = {"env": {"name": "frozenlake"}, "tracking": {"mlflow": False}}
    path = write_sweep(tmp_path, base, {"algo.lr": [1.0e-3]})
    code = (
        "import sys; sys.modules['ray'] = None; from harness.cli.main import main; "
        f"main(['sweep', {str(path)!r}, '--backend', 'ray', '--results', {str(tmp_path / 'r')!r}])"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=cli_env(), capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 1 and "--backend ray needs the `ray` package" in out.stderr
    assert "pip install -e '.[dist]'" in out.stderr and "Traceback" not in out.stderr
    out = harness("sweep", str(path), "--address", "127.0.0.1:1", "--results", str(tmp_path / "r"))
    assert out.returncode == 2 and "--address and --retries apply to --backend ray" in out.stderr


def test_joining_a_cluster_needs_a_token_or_insecure(tmp_path, ray_head):
    base = {"env": {"name": "frozenlake"}, "tracking": {"mlflow": False}}
    path = write_sweep(tmp_path, base, {"algo.lr": [1.0e-3]})
    args = ["sweep", str(path), "--backend", "ray", "--address", ray_head, "--results", str(tmp_path / "r")]
    no_token = {
        "HOME": str(tmp_path / "home"),
        "RAY_AUTH_TOKEN": "",
        "HARNESS_TRAIN_FN": "tests.support.tune_fake_trainer:train",
    }
    out = harness(*args, **no_token)
    assert out.returncode == 2 and "needs its authentication token and none was found" in out.stderr, out.stderr
    assert "--insecure" in out.stderr and "Traceback" not in out.stderr and not (tmp_path / "r").exists()
    out = harness(*args, **no_token, RAY_AUTH_MODE="disabled")
    assert out.returncode == 2 and "RAY_AUTH_MODE=disabled turns Ray's token authentication off" in out.stderr
    out = harness(*args, "--insecure", **no_token)  # the cluster wants its token: Ray refuses the driver
    assert out.returncode == 1 and f"cannot start or reach the Ray cluster at {ray_head}" in out.stderr, out.stderr
    out = harness("sweep", str(path), "--insecure", "--results", str(tmp_path / "r"))
    assert out.returncode == 2 and "--insecure applies to --backend ray --address" in out.stderr


def test_only_the_allow_listed_variables_reach_the_tasks(monkeypatch):
    from harness.experiments.ray_backend import RayExecutor

    secrets_env = {"HF_TOKEN": "hf_x", "MLFLOW_TRACKING_PASSWORD": "pw", "MLFLOW_TRACKING_TOKEN": "t", "AWS_KEY": "k"}
    hooks = {"HARNESS_TRAIN_FN": "evil:train", "HARNESS_TESTING": "1"}
    kept = {"HF_HUB_OFFLINE": "1", "MLFLOW_TRACKING_URI": "http://127.0.0.1:5000", "HARNESS_CACHE": "/c"}
    for k, v in {**secrets_env, **hooks, **kept}.items():
        monkeypatch.setenv(k, v)
    env = RayExecutor(None)._env()
    assert not set(secrets_env) & set(env) and not set(hooks) & set(env)
    assert {k: env[k] for k in kept} == kept and "PYTHONPATH" in env
