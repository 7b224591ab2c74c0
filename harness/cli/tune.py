"""`harness tune`: Optuna search over the config space (study files: `harness.experiments.study`).

Plain functions plus `register(app)`, which `harness.cli.main` calls. Optuna is
imported inside the command, keeping `harness --help` fast. Bad study files are one paragraph on
stderr and exit status 2 (ConfigError, printed by harness.cli.main.main).
"""

from __future__ import annotations

import signal
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
        bool, typer.Option("--show", help="Print the best trial and parameter importances; run nothing.")
    ] = False,
) -> None:
    """Run (or resume, or join) an Optuna study over dotted config keys.

    Trials are ordinary points (the layout of `harness sweep`), tagged in MLflow with the study and
    trial number. Start the same command on several machines with one --storage URL to share the
    study. Ctrl-C stops cleanly; the interrupted trial runs first next time.
    """
    from harness.experiments.checks import check_before_tuning
    from harness.experiments.study import load_study
    from harness.experiments.tracking import default_tracking_uri
    from harness.experiments.tuner import TuneOptions, describe, run_study, show_study

    study = load_study(file)
    check_before_tuning(study)
    if show:
        print("\n".join(show_study(study, results, storage)))
        return
    from harness.cli.console import check_results_dir

    check_results_dir(results, "--results")
    opts = TuneOptions(
        results=results,
        storage=storage,
        n_trials=n_trials,
        mlflow_uri=None if no_mlflow else default_tracking_uri(results),
        say=lambda s: print(s, flush=True),
    )
    _sigterm_as_interrupt()
    try:
        ostudy = run_study(study, opts)
    except KeyboardInterrupt:
        print("interrupted: run the same command again to resume (the interrupted trial runs first)", flush=True)
        raise typer.Exit(130) from None
    print("\n".join(describe(study, ostudy, results)))


def register(app: typer.Typer) -> None:
    """Add `tune` to the harness CLI."""
    app.command("tune")(tune)
