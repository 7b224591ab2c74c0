"""`harness bench`: speed and memory ratios (`harness.bench`)."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from harness.bench.run import run_bench
from harness.config.errors import ConfigError
from harness.experiments.loading import load_run_config

PARTS = ("rollout", "memory", "trl")  # the default set
ALL_PARTS = (*PARTS, "concurrent")


def bench_command(
    config: Path = typer.Argument(
        Path("configs/frozenlake_tiny.yaml"), help="Run config whose model, env and rollout settings are benchmarked."
    ),
    overrides: list[str] = typer.Option([], "-o", "--override", help="key=value config overrides."),
    steps: int = typer.Option(3, help="Timed update steps per side (after one warm-up step)."),
    only: list[str] = typer.Option(
        [], "--only", help="rollout, memory, trl and/or concurrent (default: rollout, memory, trl)."
    ),
    out: Path | None = typer.Option(None, "--out", help="Also write the results as JSON here."),
) -> None:
    """Speed and memory ratios against baselines measured in the same process (not pass/fail).

    rollout: batched (B=16) vs sequential tokens/s, and turn-8 vs turn-1 generation cost;
    memory: chunked vs naive log-prob peak memory; trl: one update vs a TRL GRPOTrainer step;
    concurrent: the training loop with a concurrent rollout process vs the synchronous loop."""
    cfg = load_run_config(config, list(overrides))
    parts = tuple(only) or PARTS
    bad = [p for p in parts if p not in ALL_PARTS]
    if bad:
        raise ConfigError(f"--only {bad[0]!r}: choose from {', '.join(ALL_PARTS)}")
    result = run_bench(cfg, steps=steps, parts=parts)
    text = json.dumps(result, indent=2, default=float)
    print(text)
    if out is not None:
        out.write_text(text + "\n")


def register(app: typer.Typer) -> None:
    """Add `bench` to the harness CLI."""
    app.command("bench")(bench_command)
