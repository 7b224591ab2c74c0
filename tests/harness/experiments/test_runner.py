"""The runner: point folders, skip / retry / resume, failures isolated, SIGKILL and Ctrl-C safety.

Uses the deterministic fake trainer of tests/support/fake_trainer.py (HARNESS_TRAIN_FN hook).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from harness.experiments.point import RunOptions, read_status, run_point
from harness.experiments.runner import plan, run_sweep
from harness.experiments.sweep import load_sweep
from harness.experiments.tracking import RunLogger
from harness.store import atomic_write_text, read_jsonl
from tests.helpers import REPO  # noqa: E402
from tests.helpers.configs import SMALL_SHAPE
from tests.helpers.sweeps import BASE, calls, check_complete, make_sweep, opts
from tests.support import fake_trainer
from tests.support.pause import pause_at, paused, resume, start_interruptible, wait_until


def test_a_sweep_writes_every_point_folder(tmp_path):
    sweep = load_sweep(make_sweep(tmp_path))
    result = run_sweep(sweep, opts(tmp_path))
    assert result.ok and result.counts["done"] == 4
    for p in sweep.points:
        d = tmp_path / "results" / "s" / p.id
        assert read_status(d) == "done"
        check_complete(d, p.seed, p.config.algo.lr, 6)
        summary = json.loads((d / "summary.json").read_text())
        assert summary["status"] == "done" and summary["config_hash"] == p.config_hash
        assert summary["metrics"]["final/success"] == fake_trainer.metric(p.seed, 6, p.config.algo.lr)
        assert summary["code_version"]["commit"] and summary["packages"]["torch"]
        assert summary["cpu"]["torch_kernels"] and summary["cpu"]["model"]  # what decides the float bits
        assert summary["timings"]["attempts"] == 1 and summary["timings"]["wall_s"] >= 0
        assert "algo:" in (d / "config.yaml").read_text()
        assert not [f for f in os.listdir(d) if ".tmp" in f]  # atomic writes leave nothing behind
    manifest = json.loads((tmp_path / "results" / "s" / "sweep.json").read_text())
    assert [p["id"] for p in manifest["points"]] == [p.id for p in sweep.points]


def test_rerun_skips_done_points(tmp_path):
    sweep = load_sweep(make_sweep(tmp_path))
    run_sweep(sweep, opts(tmp_path))
    again = run_sweep(sweep, opts(tmp_path))
    assert again.counts["skipped"] == 4 and again.counts["done"] == 0
    for p in sweep.points:
        assert len(calls(tmp_path / "results" / "s" / p.id)) == 1


def test_a_second_run_with_another_base_warns_and_is_never_pooled(tmp_path, capsys):
    from analysis.report import write_report
    from analysis.table import table_for

    path, folder = make_sweep(tmp_path), tmp_path / "results" / "s"
    run_sweep(load_sweep(path), opts(tmp_path))
    assert "another base config" not in capsys.readouterr().out
    second = load_sweep(path, ["train.updates=3"])
    run_sweep(second, opts(tmp_path))
    out = capsys.readouterr().out
    assert "already holds 4 point(s) of another base config (4 with train.updates = 6 there, 3 here)" in out
    manifest = json.loads((folder / "sweep.json").read_text())
    assert manifest["command"] == f"harness sweep {path} -o train.updates=3"
    assert manifest["base_config"]["train.updates"] == 3 and "algo.lr" not in manifest["base_config"]
    run_sweep(load_sweep(path, ["train.updates=3"], [0, 1, 2]), opts(tmp_path))  # more seeds: same base
    assert "already holds 4 point(s)" in capsys.readouterr().out  # only the updates=6 points
    data = table_for(folder, ["final/success"]).data
    assert sorted(data["config_group"]) == ["", "", "train.updates=6", "train.updates=6"]
    for group, updates, seeds in (("", 3, (0, 1, 2)), ("train.updates=6", 6, (0, 1))):
        rows = data[data["config_group"] == group].set_index("algo.lr")  # axis values as shown: text
        for lr, row in rows.iterrows():
            mean = sum(fake_trainer.metric(s, updates, float(lr)) for s in seeds) / len(seeds)
            assert row["final"] == pytest.approx(mean)  # never pooled across the two bases
        assert rows.loc["0.0002", "delta"] == pytest.approx(1.0e-4)  # Δ to the baseline of its own base
    text = write_report(folder).read_text()
    assert "6 of 6 points of this sweep's config finished (6 done)" in text
    assert "4 points of other base configs (train.updates=6: 4 done)" in text


def test_failures_do_not_stop_the_sweep_and_are_retried_only_on_request(tmp_path):
    points = (
        "  - {label: bad, model.name: fake-fail}\n  - {label: flaky, model.name: fake-flaky}\n"
        "  - {label: nan, model.name: fake-diverge}\n"
    )
    sweep = load_sweep(make_sweep(tmp_path, points=points, grid="algo.lr: [1.0e-4]", seeds="[0]"))
    first = run_sweep(sweep, opts(tmp_path))
    assert first.counts == {
        "done": 1,
        "diverged": 1,
        "failed": 2,
        "skipped": 0,
        "busy": 0,
        "corrupt": 0,
        "elsewhere": 0,
    }
    assert not first.ok
    dirs = {p.variant: tmp_path / "results" / "s" / p.id for p in sweep.points}
    assert read_status(dirs["bad"]) == "failed"
    assert "boom from fake-fail" in (dirs["bad"] / "traceback.txt").read_text()
    assert json.loads((dirs["bad"] / "summary.json").read_text())["error"].startswith("RuntimeError")
    diverged = json.loads((dirs["nan"] / "summary.json").read_text())
    assert diverged["status"] == "diverged" and diverged["metrics"] == {"diverged_at": 2}

    assert [a for _, a in plan(sweep, opts(tmp_path))] == ["done", "failed", "failed", "diverged"]
    second = run_sweep(sweep, opts(tmp_path))
    assert second.counts["skipped"] == 4

    (dirs["flaky"] / "heal").touch()
    third = run_sweep(sweep, opts(tmp_path, retry_failed=True))
    assert third.counts["done"] == 1 and third.counts["failed"] == 1 and third.counts["skipped"] == 2
    assert read_status(dirs["flaky"]) == "done" and not (dirs["flaky"] / "traceback.txt").exists()
    assert len(calls(dirs["nan"])) == 1  # diverged is a result: never retried


def test_interrupted_point_stays_resumable_and_resumes_from_its_checkpoint(tmp_path, monkeypatch):
    sweep = load_sweep(make_sweep(tmp_path, grid="algo.lr: [1.0e-4]", seeds="[0, 1]"))
    monkeypatch.setenv("FAKE_INTERRUPT_AT", "5")
    result = run_sweep(sweep, opts(tmp_path))
    assert result.interrupted
    first = tmp_path / "results" / "s" / sweep.points[0].id
    assert read_status(first) == "running"
    assert not (tmp_path / "results" / "s" / sweep.points[1].id).exists()  # the sweep stopped
    monkeypatch.delenv("FAKE_INTERRUPT_AT")
    assert run_sweep(sweep, opts(tmp_path)).ok
    assert [c["start"] for c in calls(first)] == [0, 4]
    check_complete(first, 0, 1e-4, 6)


def test_logger_drops_rows_after_the_checkpoint_and_torn_lines(tmp_path):
    logger = RunLogger(tmp_path)
    for u in range(1, 6):
        logger.log(u, {"x": float(u)})
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"update": 6, "x"')  # a kill mid-append
    logger = RunLogger(tmp_path)  # resumed
    logger.truncate_after(3)
    logger.log(4, {"x": 40.0})
    assert [(r["update"], r["x"]) for r in read_jsonl(tmp_path / "metrics.jsonl")] == [
        (1, 1.0),
        (2, 2.0),
        (3, 3.0),
        (4, 40.0),
    ]


def test_logger_never_duplicates_an_update_even_without_truncate(tmp_path):
    logger = RunLogger(tmp_path)
    for u in range(0, 4):
        logger.log(u, {"x": 1.0})
        logger.log_samples(u, [{"t": u}])
    logger = RunLogger(tmp_path)  # restarted from scratch (no checkpoint)
    logger.log_samples(0, [{"t": "again"}])
    logger.log(0, {"x": 2.0})
    assert [r["update"] for r in read_jsonl(tmp_path / "metrics.jsonl")] == [0]
    assert [r["t"] for r in read_jsonl(tmp_path / "samples.jsonl")] == ["again"]


def test_atomic_write_keeps_the_old_content_when_interrupted(tmp_path, monkeypatch):
    path = tmp_path / "f.txt"
    atomic_write_text(path, "old")

    def broken(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", broken)
    with pytest.raises(OSError):
        atomic_write_text(path, "new")
    assert path.read_text() == "old"


def test_a_point_locked_by_another_process_is_not_run_twice(tmp_path):
    import fcntl

    sweep = load_sweep(make_sweep(tmp_path, grid="algo.lr: [1.0e-4]", seeds="[0]"))
    point = sweep.points[0]
    d = tmp_path / "results" / "s" / point.id
    d.mkdir(parents=True)
    with open(d / ".lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        assert run_point(point, "s", opts(tmp_path))["status"] == "busy"
    assert run_point(point, "s", opts(tmp_path))["status"] == "done"


def test_workers_run_points_in_processes_and_survive_a_crash(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    sweep = load_sweep(
        make_sweep(
            tmp_path,
            points="  - {label: crash, model.name: fake-crash}\n",
            grid="algo.lr: [1.0e-4, 2.0e-4]",
            seeds="[0]",
        )
    )
    o = RunOptions(results=tmp_path / "results", train_fn="tests.support.fake_trainer:train", workers=2)
    result = run_sweep(sweep, o)
    assert result.counts["done"] == 2 and result.counts["failed"] == 1
    crash = next(p for p in sweep.points if p.variant == "crash")
    assert "worker process died with exit code 3" in result.errors[crash.id]
    assert read_status(tmp_path / "results" / "s" / crash.id) == "failed"
    for p in sweep.points:
        if p.variant != "crash":
            check_complete(tmp_path / "results" / "s" / p.id, p.seed, p.config.algo.lr, 6)


def test_workers_live_for_the_sweep_and_dead_workers_are_replaced(tmp_path, monkeypatch):
    # workers live for the whole sweep (start-up once per worker, not per point); the first two
    # points kill both workers, and fresh workers take the remaining four
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    points = "".join(f"  - {{label: lr{x}, algo.lr: {x}}}\n" for x in ["3.0e-4", "4.0e-4", "5.0e-4", "6.0e-4"])
    grid = "model.name: [fake-crash], algo.lr: [1.0e-4, 2.0e-4]"
    sweep = load_sweep(make_sweep(tmp_path, points=points, grid=grid, seeds="[0]"))
    assert [p.config.model.name for p in sweep.points][:3] == ["fake-crash", "fake-crash", "tiny"]
    result = run_sweep(
        sweep, RunOptions(results=tmp_path / "results", train_fn="tests.support.fake_trainer:train", workers=2)
    )
    assert result.counts["done"] == 4 and result.counts["failed"] == 2
    pid = {p.id: calls(tmp_path / "results" / "s" / p.id)[0]["pid"] for p in sweep.points}
    crashed, others = [pid[p.id] for p in sweep.points[:2]], [pid[p.id] for p in sweep.points[2:]]
    # four points in one or two processes (the replacements), none of them a dead worker or this one
    assert len(set(others)) < len(others) and not set(others) & {*crashed, os.getpid()}


def test_a_worker_that_dies_before_making_its_folder_is_recorded_failed(tmp_path):
    # seen in a sweep under load: a spawned worker died while unpickling its arguments, before
    # run_point made the point's folder; recording the crash must not take the sweep down
    from harness.experiments.runner import _mark_crashed

    sweep = load_sweep(make_sweep(tmp_path, grid="algo.lr: [1.0e-4]", seeds="[0]"))
    point = sweep.points[0]
    res = _mark_crashed("s", point, opts(tmp_path), 1)
    assert res["status"] == "failed" and "exit code 1" in res["error"]
    assert read_status(tmp_path / "results" / "s" / point.id) == "failed"


def test_same_seed_gives_identical_metrics(tmp_path):
    sweep = load_sweep(make_sweep(tmp_path, grid="algo.lr: [1.0e-4]", seeds="[3]"))
    run_sweep(sweep, RunOptions(results=tmp_path / "a", train_fn=fake_trainer.train))
    run_sweep(sweep, RunOptions(results=tmp_path / "b", train_fn=fake_trainer.train))
    pid = sweep.points[0].id
    assert (tmp_path / "a" / "s" / pid / "metrics.jsonl").read_bytes() == (
        tmp_path / "b" / "s" / pid / "metrics.jsonl"
    ).read_bytes()


# ----------------------------------------------------------------------------- killing the real CLI
def _cli_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(PYTHONPATH=str(REPO), HARNESS_TRAIN_FN="tests.support.fake_trainer:train", **extra)
    return env


def _cli_sweep(tmp_path: Path, lrs: str, updates: int, workers: int) -> tuple[Any, list[Path], list[str]]:
    """A one-seed sweep over algo.lr: (sweep, its point folders, the `harness sweep` command)."""
    sweep_file = make_sweep(
        tmp_path, grid=f"algo.lr: [{lrs}]", seeds="[0]", base=BASE.replace("updates: 6", f"updates: {updates}")
    )
    sweep = load_sweep(sweep_file)
    results = tmp_path / "results"
    cmd = [
        sys.executable,
        "-m",
        "harness",
        "sweep",
        str(sweep_file),
        "--results",
        str(results),
        "--no-mlflow",
        "--workers",
        str(workers),
    ]
    return sweep, [results / "s" / p.id for p in sweep.points], cmd


@pytest.mark.parametrize("workers", [1, 2])
def test_sigkill_mid_sweep_then_rerun_loses_and_repeats_nothing(tmp_path, workers):
    sweep, dirs, cmd = _cli_sweep(tmp_path, "1.0e-4, 2.0e-4, 3.0e-4", 12, workers)
    for d in dirs[1:]:  # the first point finishes; the others stop past a checkpoint (update 7 of 12)
        pause_at(d, 7)
    proc = subprocess.Popen(
        cmd, cwd=tmp_path, env=_cli_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
    )
    # with one worker the third point never starts; with two it runs beside the second
    wait_until(lambda: read_status(dirs[0]) == "done" and all(map(paused, dirs[1 : workers + 1])), proc)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    before = {d: read_status(d) for d in dirs}
    assert before[dirs[0]] == "done" and before[dirs[1]] == "running"
    for d in dirs:  # a point that never started keeps its pause request
        (d / "fake_pause_at").unlink(missing_ok=True)
    rerun = subprocess.run(cmd, cwd=tmp_path, env=_cli_env(), capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    for p, d in zip(sweep.points, dirs):
        assert read_status(d) == "done"
        check_complete(d, p.seed, p.config.algo.lr, 12)
        starts = [c["start"] for c in calls(d)]
        if before[d] == "done":
            assert starts == [0]  # finished before the kill: not recomputed
        elif before[d] == "running":
            assert starts == [0, 6]  # resumed from its last checkpoint
        else:
            assert starts == [0]


def test_ctrl_c_stops_cleanly_and_the_rerun_resumes(tmp_path):
    sweep, dirs, cmd = _cli_sweep(tmp_path, "1.0e-4, 2.0e-4", 40, workers=2)
    proc = start_interruptible(cmd, tmp_path, _cli_env(FAKE_PAUSE_AT="3"))
    wait_until(lambda: all(map(paused, dirs)), proc)  # both points wait after update 3 for the signal
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130, out
    assert "interrupted" in out and "Traceback" not in out
    assert all(read_status(d) == "running" for d in dirs)
    rerun = subprocess.run(cmd, cwd=tmp_path, env=_cli_env(), capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    for p, d in zip(sweep.points, dirs):
        check_complete(d, p.seed, p.config.algo.lr, 40)
        assert [c["start"] for c in calls(d)] == [0, 2]


def test_two_sweeps_sharing_a_folder_both_exit_0_when_every_point_ends_done(tmp_path):
    sweep, dirs, cmd = _cli_sweep(tmp_path, "1.0e-4, 2.0e-4, 3.0e-4", 4, workers=1)
    pause_at(dirs[0], 2)  # the first sweep holds the first point until the second has done the rest
    first = subprocess.Popen(cmd, cwd=tmp_path, env=_cli_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    wait_until(lambda: paused(dirs[0]), first)
    second = subprocess.Popen(cmd, cwd=tmp_path, env=_cli_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    wait_until(lambda: all(read_status(d) == "done" for d in dirs[1:]), second)
    resume(dirs[0])  # the second sweep is waiting for the first point: let it finish
    outs = [p.communicate(timeout=300)[0].decode() for p in (first, second)]
    assert [first.returncode, second.returncode] == [0, 0], outs
    assert "1 done, 0 diverged, 0 failed, 2 skipped (finished before)" in outs[0]
    assert "2 done, 0 diverged, 0 failed, 0 skipped (finished before), 1 finished by another process" in outs[1]
    for p, d in zip(sweep.points, dirs):
        check_complete(d, p.seed, p.config.algo.lr, 4)
        assert len(calls(d)) == 1  # every point trained once


def test_real_trainer_same_config_and_seed_give_identical_metrics_on_cpu(tmp_path):
    """The same config and seed, once in this process with environments in-process, once in a fresh
    process (its own hash seed, its own model cache: the tokenizer and the pre-training run again)
    with environments in worker processes: identical metrics.jsonl."""
    from harness.experiments.sweep import single_point

    overrides = [
        "train.updates=2",
        "train.eval_every=1",
        "train.eval_episodes=2",
        "rollout.group_size=2",
        "rollout.tasks_per_update=2",
        "model.tiny.pretrain_demos=8",
        "model.tiny.pretrain_epochs=1",
        # the one-layer shape of the fast tests (the paths are the config's; ~1/3 of the time)
        *(f"model.tiny.{k}={v}" for k, v in SMALL_SHAPE.items()),
        "env.heldout_tasks=2",
        "train.checkpoint_every=0",
        "train.device=cpu",
        "tracking.mlflow=false",
    ]
    config = REPO / "configs" / "frozenlake_tiny.yaml"
    point = single_point(config, overrides).points[0]
    assert run_point(point, "det", RunOptions(results=tmp_path / "a"))["status"] == "done"
    workers = single_point(config, overrides + ["env.workers=2"]).points[0]
    cmd = [sys.executable, "-m", "harness", "run", str(config), *(f"-o{o}" for o in overrides), "-oenv.workers=2"]
    env = {**_cli_env(), "HARNESS_CACHE": str(tmp_path / "cache"), "PYTHONHASHSEED": "random", "HARNESS_TRAIN_FN": ""}
    out = subprocess.run(
        [*cmd, "--name", "det", "--out", str(tmp_path / "b")], env=env, capture_output=True, text=True, timeout=600
    )
    assert out.returncode == 0, out.stdout + out.stderr
    a = (tmp_path / "a" / "det" / point.id / "metrics.jsonl").read_bytes()
    assert a and a == (tmp_path / "b" / "det" / workers.id / "metrics.jsonl").read_bytes()


@pytest.mark.slow
def test_textworld_runs_are_identical_with_and_without_env_workers(tmp_path):
    """The TextWorld learning config, cut to two updates on a small model: environments in worker
    processes or in-process, the same metrics.jsonl (about 4 minutes: 70 games are generated)."""
    from harness.experiments.sweep import single_point

    pytest.importorskip("textworld")
    overrides = [
        "train.updates=2",
        "train.eval_every=1",
        "train.eval_episodes=4",
        "train.mi_every=0",
        "rollout.tasks_per_update=2",
        "rollout.group_size=2",
        "env.train_tasks=4",
        "env.heldout_tasks=4",
        "model.tiny.pretrain_demos=8",
        "model.tiny.pretrain_epochs=1",
        "model.tiny.hidden_size=32",
        "model.tiny.num_layers=1",
        "model.tiny.intermediate_size=64",
        f"env.options.cache_dir={tmp_path / 'games'}",
        "tracking.mlflow=false",
    ]
    rows = []
    for workers in (2, 0):
        point = single_point(REPO / "configs" / "textworld_learn.yaml", overrides + [f"env.workers={workers}"]).points[
            0
        ]
        assert run_point(point, "tw", RunOptions(results=tmp_path / str(workers)))["status"] == "done"
        rows.append((tmp_path / str(workers) / "tw" / point.id / "metrics.jsonl").read_bytes())
    assert rows[0] and rows[0] == rows[1]


def test_a_run_of_some_seeds_keeps_the_points_of_the_rest_in_the_manifest(tmp_path):
    """`--seeds 2` beside an earlier run of seeds 0 and 1: sweep.json lists all three seeds' points
    (in the sweep's order), their seeds, and a command that reproduces them; another base replaces it."""
    from analysis.load import load_results

    path, folder = make_sweep(tmp_path), tmp_path / "results" / "s"
    full = load_sweep(path)
    run_sweep(full, opts(tmp_path))
    more = load_sweep(path, seeds=[2])
    run_sweep(more, opts(tmp_path))
    manifest = json.loads((folder / "sweep.json").read_text())
    everything = load_sweep(path, seeds=[0, 1, 2])
    assert [p["id"] for p in manifest["points"]] == [p.id for p in everything.points]
    assert manifest["seeds"] == [0, 1, 2]
    assert manifest["command"] == f"harness sweep {path} --seeds 0,1,2"
    assert [p["label"] for p in manifest["points"]] == [p.label for p in everything.points]
    df = load_results(folder)
    assert df.attrs["sweep"].seeds == [0, 1, 2] and len(df) == 6 and df["status"].eq("done").all()
    run_sweep(full, opts(tmp_path))  # the file's own seeds again: still every point listed
    again = json.loads((folder / "sweep.json").read_text())
    assert [p["id"] for p in again["points"]] == [p.id for p in everything.points]
    other = load_sweep(path, ["train.updates=3"])
    run_sweep(other, opts(tmp_path))  # another base: its own manifest, nothing merged in
    replaced = json.loads((folder / "sweep.json").read_text())
    assert [p["id"] for p in replaced["points"]] == [p.id for p in other.points]
    assert replaced["seeds"] == [0, 1]


def test_workers_that_would_ask_for_more_threads_than_cpus_are_named():
    """--workers N runs N points at once, each with train.threads torch threads (0: one per CPU): above the
    machine's CPUs the warning names the workers, the threads, the CPUs and both ways out."""
    from types import SimpleNamespace

    from harness.experiments.runner import oversubscription

    def pts(threads, n=4):
        return [SimpleNamespace(config=SimpleNamespace(train=SimpleNamespace(threads=threads)))] * n

    assert oversubscription(pts(1), 2, 2) is None  # the tiny sweeps: one thread a worker
    assert oversubscription(pts(2), 1, 2) is None  # one point at a time
    assert oversubscription(pts(2, n=1), 2, 2) is None  # one point left: one worker runs
    text = oversubscription(pts(2), 2, 2)
    assert "--workers 2 with train.threads 2" in text and "runs 4 compute threads" in text and "2 CPUs" in text
    assert "use --workers 1, or train.threads 1" in text
    assert "runs 8 compute threads" in oversubscription(pts(0), 2, 4)  # 0: torch's default, one per CPU
    one = oversubscription(pts(1), 3, 2)
    assert "runs 3 compute threads" in one and one.endswith("use --workers 2")  # no fewer threads to offer
