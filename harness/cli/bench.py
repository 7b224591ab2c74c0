"""`harness bench`: speed and memory ratios (`harness.bench`)."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from harness.bench.run import run_bench
from harness.config.errors import ConfigError
from harness.config.loading import load_run_config

PARTS = ("rollout", "memory", "trl", "engines", "update", "sandbox")  # the default set
ALL_PARTS = (*PARTS, "concurrent", "real", "real_update", "learner", "rollout_share")
SHAPES = ("0.5b", "1.5b", "small")


def bench_command(
    config: Path = typer.Argument(
        Path("configs/frozenlake_tiny.yaml"), help="Run config whose model, env and rollout settings are benchmarked."
    ),
    overrides: list[str] = typer.Option([], "-o", "--override", help="key=value config overrides."),
    steps: int = typer.Option(3, help="Timed update steps per side (after one warm-up step)."),
    only: list[str] = typer.Option(
        [],
        "--only",
        help="rollout, memory, trl, engines, update, sandbox, concurrent, real, real_update, learner and/or "
        "rollout_share (default: all but concurrent, real, real_update, learner and rollout_share).",
    ),
    out: Path | None = typer.Option(None, "--out", help="Also write the results as JSON here."),
    shape: str | None = typer.Option(
        None,
        "--shape",
        help="Model shape of engines and update: 0.5b, 1.5b or small (default: 0.5b on a GPU, else small).",
    ),
) -> None:
    """Speed and memory ratios against baselines measured in the same process (not pass/fail).

    rollout: batched (B=16) vs sequential tokens/s, and turn-8 vs turn-1 generation cost;
    memory: chunked vs naive log-prob peak memory; trl: one update vs a TRL GRPOTrainer step, the
    same number of generated tokens on both sides;
    concurrent: the training loop with a concurrent rollout process vs the synchronous loop;
    engines: HF generate vs our sampler (hf, static) vs the bandwidth floor at a real model's shape;
    update: tokens/s and peak memory of a LoRA update at that shape, with and without checkpointing;
    sandbox: seconds per call of the code sandbox vs the same interpreter run bare;
    real: the config's model (e.g. smollm2-135m-instruct) on this machine: the matmul floor, HF
    generate vs our engines at batches 32 and 1, and `--steps` updates split into rollout, log-probs
    and update, with the peak resident memory; real_update: the same without the sampling part;
    learner: on one rollout batch, the update under the default plan vs the update plan's other paths
    (harness.rl.plan: the sampler's log-probs, the shared prefix, bfloat16 compute, and their
    combinations), `--steps` interleaved repeats a side, with each dtype's matmul rate. `--only learner
    --only trl` prints the equal-work comparison with TRL's GRPOTrainer beside it;
    rollout_share: the first training rollout with rollout.share_prefix against without, `--steps`
    interleaved rounds, and whether the actions and sampler log-probs are the same bit for bit."""
    cfg = load_run_config(config, list(overrides))
    parts = tuple(only) or PARTS
    bad = [p for p in parts if p not in ALL_PARTS]
    if bad:
        raise ConfigError(f"--only {bad[0]!r}: choose from {', '.join(ALL_PARTS)}")
    if shape is not None and shape not in SHAPES:
        raise ConfigError(f"--shape {shape!r}: choose from {', '.join(SHAPES)}")
    result = run_bench(cfg, steps=steps, parts=parts, shape=shape)
    text = json.dumps(result, indent=2, default=float)
    print(text)
    if out is not None:
        out.write_text(text + "\n")


def register(app: typer.Typer) -> None:
    """Add `bench` to the harness CLI."""
    app.command("bench")(bench_command)
