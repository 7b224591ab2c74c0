"""`harness tune`: Optuna search over the config space (study files: `harness.experiments.study`).

Plain functions plus `register(app)`, which `harness.cli.main` calls. Optuna is
imported inside the command, keeping `harness --help` fast. Bad study files are one paragraph on
stderr and exit status 2 (ConfigError, printed by harness.cli.main.main).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Annotated, Any

import typer


def _sigterm_as_interrupt() -> None:
    def handler(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, handler)


def tune(
    file: Annotated[Path, typer.Argument(help="Study YAML file (see sweeps/tune_grpo.yaml).")],
    storage: Annotated[
        str | None,
        typer.Option(
            "--storage",
            help="Optuna RDB storage URL shared by every worker, e.g. postgresql://user@host/db "
            "(default: sqlite:///RESULTS/<name>/optuna.db).",
        ),
    ] = None,
    n_trials: Annotated[
        int | None,
        typer.Option("--n-trials", min=1, help="Finished trials the study aims at (default: the file's n_trials)."),
    ] = None,
    results: Annotated[
        Path, typer.Option("--results", help="Results root: trials' points go to RESULTS/<name>/<point>/.")
    ] = Path("results"),
    no_mlflow: Annotated[bool, typer.Option("--no-mlflow", help="Do not log to MLflow.")] = False,
    show: Annotated[
        bool,
        typer.Option(
            "--show",
            help="Print every trial (marking those whose policy did not move), the best one and "
            "parameter importances; run nothing.",
        ),
    ] = False,
    workers: Annotated[
        int,
        typer.Option(
            "--workers",
            min=1,
            max=64,
            help="Worker processes on this machine sharing the study's storage (each runs one trial at a time).",
        ),
    ] = 1,
    quiet_end: Annotated[
        bool, typer.Option("--quiet-end", hidden=True, help="A --workers child: no summary at the end.")
    ] = False,
) -> None:
    """Run (or resume, or join) an Optuna study over dotted config keys.

    Trials are ordinary points (the layout of `harness sweep`), tagged in MLflow with the study and
    trial number. `--workers N` runs N workers here; the same command on several machines with one
    --storage URL shares the study too. Ctrl-C stops cleanly; the interrupted trial runs first next time.
    """
    from harness.experiments.checks import check_before_tuning
    from harness.experiments.study import load_study
    from harness.experiments.tracking import default_tracking_uri
    from harness.experiments.tuner import (
        TuneOptions,
        default_storage,
        describe,
        load_optuna_study,
        open_storage,
        run_study,
        show_study,
        write_manifest,
    )

    study = load_study(file)
    check_before_tuning(study)
    if show:
        print("\n".join(show_study(study, results, storage)))
        return
    from harness.cli.console import check_results_dir

    check_results_dir(results, "--results")
    prefix = "[worker 1] " if workers > 1 else ""
    opts = TuneOptions(
        results=results,
        storage=storage,
        n_trials=n_trials,
        mlflow_uri=None if no_mlflow else default_tracking_uri(results),
        say=lambda s: print(prefix + s, flush=True),
    )
    _sigterm_as_interrupt()
    others: list[subprocess.Popen] = []
    try:
        if workers > 1:
            storage = opts.storage = storage or default_storage(results, study.name)
            load_optuna_study(study, open_storage(storage, study.spec.heartbeat_s))  # created once, before the others
            others = _start_workers(file, results, storage, n_trials, no_mlflow, workers - 1)
        ostudy = run_study(study, opts)
        failed = _wait_workers(others)
        if others:
            write_manifest(study, ostudy, results)  # with the other workers' last trials
    except KeyboardInterrupt:
        _stop_workers(others)
        print("interrupted: run the same command again to resume (the interrupted trial runs first)", flush=True)
        raise typer.Exit(130) from None
    if not quiet_end:
        print("\n".join(describe(study, ostudy, results)))
    if failed:
        print(f"error: {failed} of the other {workers - 1} worker(s) failed; their lines above say why", flush=True)
        raise typer.Exit(1)


def _start_workers(
    file: Path, results: Path, storage: str, n_trials: int | None, no_mlflow: bool, n: int
) -> list[subprocess.Popen]:
    """`n` more `harness tune` processes on the same storage, their output prefixed [worker k]."""
    cmd = [sys.executable, "-m", "harness", "tune", str(file), "--results", str(results), "--storage", storage]
    cmd += (["--n-trials", str(n_trials)] if n_trials else []) + (["--no-mlflow"] if no_mlflow else [])
    procs = []
    for k in range(2, n + 2):
        proc = subprocess.Popen(
            cmd + ["--quiet-end"],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            bufsize=1,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            start_new_session=True,  # Ctrl-C reaches this process only, which passes it on once (_stop_workers)
        )
        proc.relay = threading.Thread(target=_relay, args=(proc, f"[worker {k}] "), daemon=True)
        proc.relay.start()
        procs.append(proc)
    return procs


def _relay(proc: subprocess.Popen, prefix: str) -> None:
    for line in proc.stdout:
        print(prefix + line.rstrip("\n"), flush=True)


def _wait_workers(procs: list[subprocess.Popen]) -> int:
    """Wait for the other workers; how many ended with an error (an interrupted one counts)."""
    failed = sum(proc.wait() != 0 for proc in procs)
    for proc in procs:
        proc.relay.join(timeout=10)  # their last lines before ours
    return failed


def _stop_workers(procs: list[subprocess.Popen]) -> None:
    """Ctrl-C or SIGTERM here: each other worker gets one SIGTERM (it requeues its running trial, as
    this one does) and a while to finish; one that does not is killed (its trial is requeued once its
    heartbeat is stale)."""
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)  # handled like Ctrl-C, even where SIGINT is ignored (nohup, &)
    for proc in procs:
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
        proc.relay.join(timeout=10)


def register(app: typer.Typer) -> None:
    """Add `tune` to the harness CLI."""
    app.command("tune")(tune)
