"""`harness eval`: evaluate a point's policy on a chosen task set, resumably.

    harness eval results/clipping/ppo-token__seed=0__3f2a1b9c --tasks 256 --samples 4

The policy is the point's trained adapter (`--checkpoint adapter`) or the policy RL started from
(`--checkpoint start`: the base model, or its SFT warm-up, with the adapter at its initial zero
update). Tasks: the environment's held-out split (`--tasks N`), or every game of a folder of
TextWorld games (`--games DIR`). `--env-option KEY=VALUE` plays a variant of the point's
environment (e.g. `deadlock=report` on Sokoban, `checker=lenient` on FrozenLake); the policy is
always the one the point trained, built from the point's own config. Each task is played greedily
once and sampled `--samples` times, with the evaluation streams of `harness.rl.evaluate` (the same
sampling numbers for every point, so two points' results are paired by task and sample).

Files, in the point folder: `eval/<name>.tasks.jsonl` (one row per episode, appended chunk by
chunk: an interrupted evaluation resumes where it stopped) and `eval/<name>.json` (the summary).
"""

from __future__ import annotations

import json
import re
import statistics
from dataclasses import dataclass
from pathlib import Path

import yaml

from analysis.tasks import OPTIONAL_FIELDS
from envs.registry import env_class
from harness.config.errors import ConfigError
from harness.config.loading import parse_override, validate_run_config
from harness.config.schema import RunConfig
from harness.experiments.provenance import code_version
from harness.store import ADAPTER, CONFIG, EVAL_DIR, append_jsonl, atomic_write_json, read_jsonl

CHECKPOINTS = ("adapter", "start")


@dataclass(frozen=True)
class EvalRequest:
    point: Path
    checkpoint: str = "adapter"
    tasks: int | None = None  # held-out tasks (default: the point's env.heldout_tasks)
    games: Path | None = None  # a folder of TextWorld games instead of the held-out split
    samples: int = 1
    name: str | None = None
    device: str = "auto"
    chunk: int = 64  # tasks per resumable chunk
    env_options: tuple[str, ...] = ()  # "key=value" overrides of the point's env.options


def point_config(point: Path) -> RunConfig:
    path = point / CONFIG
    if not path.is_file():
        raise ConfigError(
            f"{point}: not a point folder (no config.yaml); give a folder such as results/<sweep>/<point id>"
        )
    try:
        raw = yaml.safe_load(path.read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        raise ConfigError(f"{path}: cannot read the point's config ({type(e).__name__})") from None
    return validate_run_config(raw, str(path))


def check_request(req: EvalRequest, cfg: RunConfig) -> None:
    if req.checkpoint not in CHECKPOINTS:
        raise ConfigError(
            f"--checkpoint {req.checkpoint!r} is not a checkpoint; choose one of: {', '.join(CHECKPOINTS)}"
        )
    if req.checkpoint == "adapter" and not (req.point / ADAPTER).is_dir():
        raise ConfigError(
            f"{req.point}: no adapter/ folder (the point has not finished); use --checkpoint start "
            f"or finish the point first"
        )
    if req.samples < 1 or req.samples > 1024:
        raise ConfigError(f"--samples {req.samples}: give a number of sampled episodes per task from 1 to 1024")
    if req.tasks is not None and not 1 <= req.tasks <= 100_000:
        raise ConfigError(f"--tasks {req.tasks}: give a number of held-out tasks from 1 to 100000")
    if req.games is not None and cfg.env.name != "textworld":
        raise ConfigError(
            f"--games {req.games}: a folder of games needs a TextWorld point; this point's "
            f"env.name is {cfg.env.name!r} (use --tasks N for its held-out split)"
        )
    if req.games is not None and not req.games.is_dir():
        raise ConfigError(f"--games {req.games}: not a directory of TextWorld .z8 games")
    if req.tasks is not None and req.games is not None:
        raise ConfigError("--tasks and --games both given: choose one task set")


def with_env_options(req: EvalRequest, cfg: RunConfig) -> tuple[RunConfig, str]:
    """The point's config with the `--env-option` overrides of env.options (validated like a config
    file's), and a name suffix for them ("" without any)."""
    if not req.env_options:
        return cfg, ""
    options = dict(cfg.env.options)
    words = []
    for text in req.env_options:
        key, sep, value = text.partition("=")
        if not sep or not key.strip() or "." in key:
            raise ConfigError(
                f"--env-option {text!r} is not of the form key=value with a key of env.options "
                f"(e.g. --env-option deadlock=report)"
            )
        key, parsed = parse_override(text)  # the value read as YAML, like -o
        options[key] = parsed
        words.append(f"{key}-{value.strip()}")
    raw = cfg.model_dump(mode="json")
    raw["env"]["options"] = options
    cfg = validate_run_config(raw, "--env-option")
    return cfg, "-" + re.sub(r"[^A-Za-z0-9._-]+", "_", "-".join(words))


def task_set(req: EvalRequest, cfg: RunConfig) -> tuple[RunConfig, list[int], str]:
    """(config to evaluate with, task seeds, a name for the task set)."""
    if req.games is None:
        n = req.tasks or cfg.env.heldout_tasks
        return cfg, env_class(cfg.env.name).task_seeds("heldout", n, cfg.env.options), f"heldout{n}"
    options = {**cfg.env.options, "game_dir": str(req.games.resolve())}
    raw = cfg.model_dump(mode="json")
    raw["env"]["options"] = options
    cfg = validate_run_config(raw, f"--games {req.games}")
    try:
        seeds = env_class("textworld")(options).game_dir_seeds()
    except ValueError as e:
        raise ConfigError(f"--games {req.games}: {e}") from None
    return cfg, seeds, f"games-{req.games.resolve().name}"


def summarise(rows: list[dict]) -> dict:
    out = {}
    for mode in ("greedy", "sampled"):
        sel = [r for r in rows if r["mode"] == mode]
        if sel:
            fields = ("success", "return", "turns", *(k for k in OPTIONAL_FIELDS if all(k in r for r in sel)))
            out[mode] = {
                "episodes": len(sel),
                "tasks": len({r["task"] for r in sel}),
                **{k: statistics.fmean(r[k] for r in sel) for k in fields},
            }
    return out


def run_eval(req: EvalRequest, log=print) -> Path:
    """Evaluate (or finish evaluating) and write the summary; returns its path."""
    from harness.experiments.policy_eval import PolicyEvaluator

    point_cfg = point_config(req.point)
    check_request(req, point_cfg)
    cfg, variant = with_env_options(req, point_cfg)
    cfg, seeds, set_name = task_set(req, cfg)
    name = req.name or f"{req.checkpoint}-{set_name}-x{req.samples}{variant}"
    folder = req.point / EVAL_DIR
    folder.mkdir(exist_ok=True)
    rows_path, summary_path = folder / f"{name}.tasks.jsonl", folder / f"{name}.json"
    done = {(r["mode"], r["task"], r["sample"]) for r in read_jsonl(rows_path)}
    todo = [s for s in seeds if any((m, s, k) not in done for m, k in _episodes(req.samples))]
    if todo:
        with PolicyEvaluator(req.point, point_cfg, cfg, req.checkpoint, req.device) as evaluator:
            for start in range(0, len(todo), req.chunk):
                chunk = todo[start : start + req.chunk]
                append_jsonl(rows_path, evaluator.play(chunk, req.samples, done))
                log(f"  {min(start + req.chunk, len(todo))}/{len(todo)} tasks evaluated")
    rows = read_jsonl(rows_path)
    summary = {
        "point": str(req.point),
        "checkpoint": req.checkpoint,
        "task_set": set_name,
        **({"env_options": cfg.env.options} if req.env_options else {}),
        "tasks": len(seeds),
        "samples": req.samples,
        "results": summarise(rows),
        "code_version": code_version(),
    }
    atomic_write_json(summary_path, summary)
    return summary_path


def _episodes(samples: int) -> list[tuple[str, int]]:
    return [("greedy", 0)] + [("sampled", k) for k in range(samples)]


def one_line(path: Path) -> str:
    s = json.loads(path.read_text())
    parts = [
        f"{mode} success {r['success']:.3f} ({r['tasks']} tasks x {r['episodes'] // max(r['tasks'], 1)})"
        + "".join(f", {k.replace('_', ' ')} {r[k]:.3f}" for k in OPTIONAL_FIELDS if k in r)
        for mode, r in s["results"].items()
    ]
    return f"eval {path.stem} of {s['checkpoint']}: " + ", ".join(parts) + f" -> {path}"
