"""The tiny configs of the tests: the two-layer trainer config and the one-layer model."""

from __future__ import annotations

import json
from pathlib import Path

from harness.config.schema import RunConfig

# the trainer tests' run: a two-layer tiny Qwen2 pre-trained on expert demonstrations, LoRA, FrozenLake
TINY = {
    "model": {
        "tiny": {
            "hidden_size": 32,
            "num_layers": 2,
            "num_heads": 2,
            "intermediate_size": 64,
            "pretrain_demos": 150,
            "pretrain_epochs": 15,
            "pretrain_lr": 1e-2,
        },
        "lora": {"r": 4, "alpha": 8},
    },
    "env": {"name": "frozenlake", "heldout_tasks": 4, "reward_density": "dense", "format_penalty": 0.1},
    "rollout": {"tasks_per_update": 2, "group_size": 3, "max_new_tokens": 4, "temperature": 2.0},
    "turns": {"max": 4},
    "algo": {"lr": 1e-3, "micro_batch_size": 4},
    "train": {
        "updates": 3,
        "eval_every": 2,
        "eval_episodes": 3,
        "checkpoint_every": 1,
        "threads": 1,
        "mi_every": 2,
        "mi_prompts": 2,
    },
    "tracking": {"mlflow": False, "samples": 1},
}

# a one-layer tiny model that builds in about a second (model.tiny keys)
SMALL_SHAPE = {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "intermediate_size": 64}
SMALL_MODEL = {**SMALL_SHAPE, "vocab_size": 320, "max_position": 256}


def merge(a: dict, b: dict) -> dict:
    """A deep copy of `a` with the nested keys of `b` set."""
    out = json.loads(json.dumps(a))
    for k, v in b.items():
        out[k] = merge(out.get(k, {}), v) if isinstance(v, dict) else v
    return out


def cfg_with(**over) -> RunConfig:
    """TINY with `over` merged in, by section."""
    return RunConfig.model_validate(merge(TINY, over))


def train_tiny(cfg: RunConfig, out: Path, progress=None) -> tuple[list[dict], dict]:
    """Train `cfg` into `out`: (the rows of its metrics.jsonl, its summary)."""
    from harness.experiments.tracking import RunLogger
    from harness.rl.trainer import train

    logger = RunLogger(out)
    summary = train(cfg, out, logger, progress)
    logger.close("done")
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return rows, summary


def small_cfg(**over) -> RunConfig:
    """The one-layer model with a short pre-training; `over` sets dotted attributes ("model.tiny.x")."""
    cfg = RunConfig.model_validate(
        {
            "model": {
                "tiny": {**SMALL_MODEL, "pretrain_demos": 12, "pretrain_epochs": 1, "pretrain_batch_size": 4},
                "lora": {"r": 4, "alpha": 8},
            },
            "train": {"seed": 3},
        }
    )
    for key, value in over.items():
        obj, *path, leaf = [cfg, *key.split(".")]
        for part in path:
            obj = getattr(obj, part)
        setattr(obj, leaf, value)
    return cfg
