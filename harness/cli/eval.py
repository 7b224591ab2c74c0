"""`harness eval`: a point's policy on a chosen task set (`harness.experiments.evaluation`)."""

from __future__ import annotations

from pathlib import Path

import typer


def eval_command(
    point: Path = typer.Argument(..., help="A point folder: results/<sweep>/<point id>."),
    checkpoint: str = typer.Option(
        "adapter",
        "--checkpoint",
        help="adapter (the trained policy) or start (the policy RL started from: base model or SFT warm-up).",
    ),
    tasks: int | None = typer.Option(
        None, "--tasks", help="Held-out tasks to play (default: the point's env.heldout_tasks)."
    ),
    games: Path | None = typer.Option(
        None, "--games", help="Play every game of this folder of TextWorld .z8 games instead of the held-out split."
    ),
    samples: int = typer.Option(1, "--samples", help="Sampled episodes per task (each task is also played greedily)."),
    env_option: list[str] = typer.Option(
        [],
        "--env-option",
        help="KEY=VALUE: play a variant of the point's environment (a key of env.options; repeatable), "
        "e.g. deadlock=report on Sokoban. The policy stays the point's.",
    ),
    name: str | None = typer.Option(None, "--name", help="Name of the result files (default: from the options)."),
    device: str = typer.Option("auto", "--device", help="auto (cuda when present), cpu or cuda."),
) -> None:
    """Evaluate a point's policy on a task set, greedily and sampled; resumable.

    Writes POINT/eval/NAME.json (summary) and POINT/eval/NAME.tasks.jsonl (one row per episode),
    and prints a one-line summary. Sampled episodes use the same random streams for every point,
    so two points' results are paired by task and sample."""
    from harness.config.errors import ConfigError
    from harness.experiments.evaluation import EvalRequest, one_line, run_eval

    if device not in ("auto", "cpu", "cuda"):
        raise ConfigError(f"--device {device!r} is not a device; choose one of: auto, cpu, cuda")
    req = EvalRequest(
        point=point,
        checkpoint=checkpoint,
        tasks=tasks,
        games=games,
        samples=samples,
        name=name,
        device=device,
        env_options=tuple(env_option),
    )
    print(one_line(run_eval(req)))


def register(app: typer.Typer) -> None:
    """Add `eval` to the harness CLI."""
    app.command("eval")(eval_command)
