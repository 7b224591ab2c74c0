"""`harness sweep --backend ray`: a real Ray head started here (127.0.0.1 only, no dashboard), results
identical to the local backend's with the real trainer, retries, a local instance started by the
command itself, and the message when ray is not installed. The point files travel through Ray's object
store (--transfer objects, the default) from a node-local folder that is not the results folder, or
are written in place (--transfer shared-fs); a sweep with a seed budget takes the same looks on a
cluster; a point over the size limit fails with a message; and (slow) a cluster of two nodes loses
one mid-point and still ends with the local backend's files, byte for byte.

Run the slow test alone with:
    .venv/bin/python -m pytest tests/harness/experiments/test_ray_backend.py -m slow
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
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
from tests.support.pause import PAUSED, pause_at, paused, wait_until

pytest.importorskip("ray")  # the optional extra `dist`

from tests.helpers import REPO  # noqa: E402

RAY = Path(sys.executable).parent / "ray"
LOOPBACK_ONLY = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0"}
TOKEN = secrets.token_hex(32)  # the test head's authentication token
HEAD: dict[str, Path] = {}  # the ray_head fixture's node-local folder for points: HEAD["scratch"]


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
    HEAD["scratch"] = Path(temp) / "scratch"  # where its tasks run points (--transfer objects)
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
        env=cli_env(
            **LOOPBACK_ONLY, RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=TOKEN, HARNESS_RAY_SCRATCH=str(HEAD["scratch"])
        ),
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
        shutil.rmtree(temp, ignore_errors=True)


def write_sweep(tmp_path: Path, base: dict, grid: dict, points: list | None = None) -> Path:
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({"name": "s", "base": base, "grid": grid, "points": points or [], "seeds": [0]}))
    return path


def files(d: Path) -> dict[str, str]:
    return {p.name: p.read_text() for p in d.iterdir() if p.is_file()}


# the files of a point that hold wall times, process ids, host names or Ray node ids: compared apart
VARYING = ("events.jsonl", "summary.json", "timings.jsonl", "checkpoint/state.pt")  # state.pt: cost.wall_s


def tree(d: Path) -> dict[str, bytes]:
    """Every file under `d` (hidden ones included) by relative path, except VARYING and the marker a
    paused fake trainer leaves (tests/support/pause.py). PEFT writes the adapter config's
    target_modules from a set, in an order that changes with the process's hash seed: sorted here."""
    out = {p.relative_to(d).as_posix(): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}
    if "adapter/adapter_config.json" in out:
        config = json.loads(out["adapter/adapter_config.json"])
        config["target_modules"] = sorted(config["target_modules"])
        out["adapter/adapter_config.json"] = json.dumps(config, sort_keys=True).encode()
    return {k: v for k, v in out.items() if k not in VARYING and k != PAUSED}


def ran_in(d: Path) -> list[str]:
    """The node-local folders the attempts of the point in `d` ran in (--transfer objects)."""
    return [e["dir"] for e in read_jsonl(d / "events.jsonl") if e["event"] == "ray_task"]


def same_summary(a: Path, b: Path) -> None:
    sa, sb = json.loads((a / "summary.json").read_text()), json.loads((b / "summary.json").read_text())
    wall = "cost/wall_s"  # the one measurement in a summary that differs between two runs
    assert sa["metrics"].pop(wall) > 0 and sb["metrics"].pop(wall) > 0
    assert sa["metrics"] == sb["metrics"] and sa["status"] == sb["status"] == "done"
    assert sa["config_hash"] == sb["config_hash"] and sa["packages"] == sb["packages"]
    assert sa["updates_logged"] == sb["updates_logged"]


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
        a, b = tmp_path / "local" / "s" / p.id, tmp_path / "ray" / "s" / p.id
        assert tree(a) == tree(b)  # every metrics row, bit for bit, and the adapter's weights
        assert len(read_jsonl(b / "metrics.jsonl")) == 3 and (b / "checkpoint" / "state.pt").is_file()
        same_summary(a, b)
        where = ran_in(b)  # --transfer objects: a folder of the head node, not the results folder
        assert len(where) == 1 and Path(where[0]).is_relative_to(HEAD["scratch"]) and not Path(where[0]).exists()


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


def checkpoint_at(d: Path) -> int | None:
    try:
        return json.loads((d / "checkpoint" / "state.json").read_text())["update"]
    except (OSError, ValueError):
        return None


@pytest.mark.parametrize("transfer", ["objects", "shared-fs"])
def test_an_interrupted_ray_sweep_resumes_from_checkpoints(tmp_path, transfer):
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
        "--transfer",
        transfer,
    ]
    scratch = tmp_path / "scratch"  # the local instance's node-local folder (its workers get our variables)
    env = cli_env(
        HARNESS_TRAIN_FN="tests.support.tune_fake_trainer:train", FAKE_PAUSE_AT="3", HARNESS_RAY_SCRATCH=str(scratch)
    )
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    dirs = [results / "s" / p.id for p in load_sweep(path).points]
    # both wait after update 3 for the signal; with objects, once the driver holds their checkpoint 3
    ready = paused if transfer == "shared-fs" else (lambda d: checkpoint_at(d) == 3)
    wait_until(lambda: all(map(ready, dirs)), proc)
    proc.send_signal(signal.SIGTERM)  # the CLI turns it into Ctrl-C: running tasks are cancelled
    out = proc.communicate(timeout=120)[0]
    assert proc.returncode == 130 and "interrupted: run the same command again" in out, out
    for d in dirs:
        assert (d / "status").read_text().strip() == "running"
        events = [e["event"] for e in read_jsonl(d / "events.jsonl")]
        assert events == (["start", "interrupted"] if transfer == "shared-fs" else ["ray_task", "start", "interrupted"])
    again = subprocess.run(cmd, cwd=REPO, env={**env, "FAKE_PAUSE_AT": ""}, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and "sweep s: 2 done" in again.stdout, again.stdout + again.stderr
    for d in dirs:
        starts = [c["start"] for c in read_jsonl(d / "fake_calls.jsonl")]
        assert starts == [0, 3]  # resumed from its checkpoint
        assert [r["update"] for r in read_jsonl(d / "metrics.jsonl")] == list(range(13))
        where = ran_in(d)
        assert len(where) == (0 if transfer == "shared-fs" else 2)
        assert all(Path(w).is_relative_to(scratch) and not Path(w).exists() for w in where)
    if transfer == "shared-fs":
        assert "--transfer shared-fs: all 1 Ray node(s) see" in again.stdout


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


def test_a_seed_budget_takes_the_same_looks_on_a_cluster(tmp_path, ray_head):
    """Each look's new points go to the cluster (--transfer objects): the same looks, points and files as
    the local pool's, every point run in a folder of the head node."""
    from tests.support import sequential_trainer

    def sweep_file(folder: Path) -> Path:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "base.yaml").write_text("env: {name: frozenlake}\ntrain: {updates: 2}\ntracking: {mlflow: false}\n")
        path = folder / "s.yaml"
        path.write_text(
            "name: s\nbase: base.yaml\ngrid: {algo.lr: [1.0e-4, 2.0e-4, 3.0e-4, 4.0e-4]}\n"
            "seeds: {start: 3, step: 3, max: 6}\nequivalence_margin: 0.05\n"
        )
        return path

    reference = tmp_path / "ref"
    run_sweep(load_sweep(sweep_file(reference)), RunOptions(reference / "results", train_fn=sequential_trainer.train))
    path, results = sweep_file(tmp_path / "ray"), tmp_path / "ray" / "results"
    args = ("sweep", str(path), "--backend", "ray", "--address", ray_head, "--results", str(results), "--no-mlflow")
    out = harness(*args, HARNESS_TRAIN_FN="tests.support.sequential_trainer:train", RAY_AUTH_TOKEN=TOKEN)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "look 2 of 2: 6 seeds for" in out.stdout
    ref = reference / "results" / "s"
    assert json.loads((results / "s" / "looks.json").read_text()) == json.loads((ref / "looks.json").read_text())
    ran = sorted(d.name for d in (results / "s").iterdir() if d.is_dir())
    assert ran == sorted(d.name for d in ref.iterdir() if d.is_dir()) and len(ran) > 12  # two looks' points
    for name in ran:
        assert tree(results / "s" / name) == tree(ref / name), name
        where = ran_in(results / "s" / name)
        assert len(where) == 1 and Path(where[0]).is_relative_to(HEAD["scratch"]), where
    assert not any((HEAD["scratch"] / "points").iterdir())  # each attempt's folder is removed after it


def test_a_driver_killed_on_a_cluster_resumes_from_what_results_holds(tmp_path, ray_head):
    """SIGKILL to the driver while its points wait after update 3 on the cluster (the one-shot pause file
    travels with the point's folder): running the same command again resumes each point from the
    checkpoint the driver had written, and the metrics equal an uninterrupted local run's."""
    from tests.support import tune_fake_trainer

    base = {"env": {"name": "frozenlake"}, "train": {"updates": 8, "checkpoint_every": 1}}
    base["tracking"] = {"mlflow": False}
    path, results = write_sweep(tmp_path, base, {"algo.lr": [1.0e-3, 2.0e-3]}), tmp_path / "ray"
    sweep = load_sweep(path)
    assert run_sweep(sweep, RunOptions(tmp_path / "local", train_fn=tune_fake_trainer.train)).ok
    dirs = [results / "s" / p.id for p in sweep.points]
    for d in dirs:
        pause_at(d, 3)
    cmd = [sys.executable, "-m", "harness", "sweep", str(path), "--backend", "ray", "--address", ray_head]
    cmd += ["--results", str(results), "--no-mlflow"]
    env = cli_env(HARNESS_TRAIN_FN="tests.support.tune_fake_trainer:train", RAY_AUTH_TOKEN=TOKEN)
    driver = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    # both paused, checkpoint 3 here, and the status the driver writes after a change set's checkpoint too
    wait_until(lambda: all(checkpoint_at(d) == 3 and (d / "status").exists() for d in dirs), driver)
    driver.kill()
    driver.wait(timeout=60)
    for d in dirs:
        assert (d / "status").read_text() == "running\n" and not (d / "summary.json").exists()
    again = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and "sweep s: 2 done" in again.stdout, again.stdout + again.stderr
    for p, d in zip(sweep.points, dirs, strict=True):
        assert [c["start"] for c in read_jsonl(d / "fake_calls.jsonl")] == [0, 3]
        assert (d / "metrics.jsonl").read_bytes() == (tmp_path / "local" / "s" / p.id / "metrics.jsonl").read_bytes()
        assert [e["resume"] for e in read_jsonl(d / "events.jsonl") if e["event"] == "start"] == [False, True]


def test_a_point_over_the_size_limit_fails_with_a_message(tmp_path, ray_head):
    base = {"env": {"name": "frozenlake"}, "train": {"updates": 2}, "tracking": {"mlflow": False}}
    path = write_sweep(tmp_path, base, {"algo.lr": [1.0e-3]})
    (point,) = load_sweep(path).points
    d = tmp_path / "r" / "s" / point.id
    d.mkdir(parents=True)
    (d / "big.bin").write_bytes(os.urandom(2 * 2**20))  # the point's folder: 2 MiB before it starts
    args = ("sweep", str(path), "--backend", "ray", "--address", ray_head, "--results", str(tmp_path / "r"))
    out = harness(
        *args,
        "--max-point-mb",
        "1",
        "--no-mlflow",
        HARNESS_TRAIN_FN="tests.support.tune_fake_trainer:train",
        RAY_AUTH_TOKEN=TOKEN,
    )
    assert out.returncode == 1 and "sweep s: 0 done, 0 diverged, 1 failed" in out.stdout, out.stdout + out.stderr
    assert (d / "status").read_text() == "failed\n" and (d / "big.bin").stat().st_size == 2 * 2**20
    message = (d / "traceback.txt").read_text()
    assert "over the 1 MiB a point may ship through Ray's object store" in message and "--max-point-mb" in message


# ----------------------------------------------------------------------------- two nodes, one lost
def start_node(log: Path, cwd: Path, *args: str, **env: str) -> subprocess.Popen:
    """`ray start ... --block` in a session of its own (its raylet and agents in its process group),
    bound to 127.0.0.1; returns once the node is up. Ray refuses a second node in local-only mode, so
    these nodes run in cluster mode (their ports then listen on every interface, behind TOKEN)."""
    cwd.mkdir(parents=True, exist_ok=True)
    out = open(log, "w")
    proc = subprocess.Popen(
        [str(RAY), "start", "--node-ip-address", "127.0.0.1", "--disable-usage-stats", "--block", *args],
        cwd=cwd,
        env=cli_env(RAY_USAGE_STATS_ENABLED="0", RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=TOKEN, **env),
        stdout=out,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    out.close()
    wait_until(lambda: "Ray runtime started" in log.read_text(), proc, timeout=180)
    return proc


def stop_node(proc: subprocess.Popen, sig: int = signal.SIGKILL) -> None:
    """Kill a node started by start_node: its `ray start`, raylet and agents (the raylet's workers die with it)."""
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass
    proc.wait(timeout=60)


@pytest.mark.slow  # two Ray nodes, four updates of the real trainer on two points (66-113 s on 2 busy cores)
def test_a_node_lost_mid_point_leaves_the_local_backends_files(tmp_path):
    """A head and a worker node (one CPU each, own temp and working folders, the worker's points in its
    own scratch folder); the point on the worker stops after update 2 (FAKE_PAUSE_AT there only) once the
    driver holds a checkpoint, and that node is killed. Ray runs the point again on the head from the
    driver's checkpoint; the results equal an uninterrupted local run's byte for byte (VARYING apart)."""
    from tests.helpers.configs import TINY

    base = json.loads(json.dumps(TINY))
    base["train"].update(updates=4, eval_every=2, checkpoint_every=1)
    path = write_sweep(tmp_path, base, {"algo.lr": [1.0e-3, 3.0e-3]})
    sweep = load_sweep(path)
    local = run_sweep(sweep, RunOptions(results=tmp_path / "local"))  # builds the tiny model in HARNESS_CACHE
    assert local.ok and local.counts["done"] == 2
    temp = Path(tempfile.mkdtemp(prefix="ray2", dir="/tmp"))  # short: Unix socket paths
    port, scratch = free_port(), {"head": temp / "head-scratch", "worker": temp / "worker-scratch"}
    cluster = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "1"}
    head = start_node(
        temp / "head.log", temp / "head-cwd", "--head", "--port", str(port), "--num-cpus", "1",
        "--include-dashboard", "false", "--temp-dir", str(temp / "h"),
        **cluster, HARNESS_RAY_SCRATCH=str(scratch["head"]),
    )  # fmt: skip
    worker = None
    try:
        worker = start_node(
            temp / "worker.log", temp / "worker-cwd", "--address", f"127.0.0.1:{port}", "--num-cpus", "1",
            "--temp-dir", str(temp / "w"),
            **cluster, HARNESS_RAY_SCRATCH=str(scratch["worker"]), FAKE_PAUSE_AT="2",
        )  # fmt: skip
        results = tmp_path / "ray"
        cmd = [sys.executable, "-m", "harness", "sweep", str(path), "--backend", "ray", "--address"]
        cmd += [f"127.0.0.1:{port}", "--retries", "1", "--results", str(results), "--no-mlflow"]
        env = cli_env(HARNESS_TRAIN_FN="tests.support.pausing_trainer:train", RAY_AUTH_TOKEN=TOKEN)
        driver = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

        def held_on_worker() -> Path | None:
            """The point paused on the worker node, once the driver holds a checkpoint of it."""
            for marker in scratch["worker"].glob("points/*/s/*/fake_paused"):
                if (results / "s" / marker.parent.name / "checkpoint" / "state.pt").is_file():
                    return marker.parent
            return None

        wait_until(lambda: held_on_worker() is not None, driver, timeout=600)
        lost = held_on_worker().name
        stop_node(worker)  # the node is lost mid-point: its raylet, agents and the task's worker die
        out = driver.communicate(timeout=600)[0]
        assert driver.returncode == 0 and "sweep s: 2 done, 0 diverged, 0 failed" in out, out
    finally:
        for proc in (worker, head):
            if proc is not None and proc.poll() is None:
                stop_node(proc, signal.SIGTERM)
    for p in sweep.points:
        a, b = tmp_path / "local" / "s" / p.id, results / "s" / p.id
        assert tree(a) == tree(b), p.id  # metrics, samples, eval tasks, config, status, adapter: byte for byte
        same_summary(a, b)
        where, starts = ran_in(b), [e for e in read_jsonl(b / "events.jsonl") if e["event"] == "start"]
        assert not any(Path(w).is_relative_to(results) for w in where)
        if p.id == lost:  # once on the worker, then resumed on the head from the driver's checkpoint
            assert [Path(w).is_relative_to(scratch["worker"]) for w in where] == [True, False]
            assert Path(where[1]).is_relative_to(scratch["head"]) and [s["resume"] for s in starts] == [False, True]
        else:
            assert len(where) == 1 and Path(where[0]).is_relative_to(scratch["head"]) and len(starts) == 1
    shutil.rmtree(temp, ignore_errors=True)


def test_what_the_tasks_of_a_cluster_without_a_shared_filesystem_get(monkeypatch, capsys):
    """--transfer objects on a remote cluster: no MLflow file store and no default cache beside results/
    (the nodes cannot reach them); a tracking server, the user's HARNESS_CACHE and a one-machine cluster
    keep theirs."""
    from harness.experiments.ray_backend import RayExecutor

    monkeypatch.delenv("HARNESS_CACHE", raising=False)
    remote, loopback = RayExecutor("10.0.0.1:6379", insecure=True), RayExecutor("127.0.0.1:6379", insecure=True)
    shared = RayExecutor("10.0.0.1:6379", insecure=True, transfer="shared-fs")
    monkeypatch.setenv("HARNESS_CACHE", "results/.cache")  # what the runner sets when the user did not
    assert "HARNESS_CACHE" not in remote._env()
    assert loopback._env()["HARNESS_CACHE"] == shared._env()["HARNESS_CACHE"] == str(Path("results/.cache").resolve())
    assert RayExecutor("10.0.0.1:6379", insecure=True)._env()["HARNESS_CACHE"]  # set by the user: kept
    store = "sqlite:////srv/sweeps/results/mlflow.db"  # an example path on the driver
    assert remote._task_mlflow(store) is None and "MLflow is off in the Ray tasks" in capsys.readouterr().out
    assert remote._task_mlflow("http://mlflow:5000") == "http://mlflow:5000"
    assert loopback._task_mlflow(store) == shared._task_mlflow(store) == store
