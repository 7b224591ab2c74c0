"""A tiny trainer run whose metrics are recorded in `data/trainer_metrics_baseline.json`.

The record was written by the trainer as it was before the off-policy axis (rollout.sampler_dtype,
algo.correction, diag/mismatch_*) existed; test_mismatch.py checks that the defaults
(`sampler_dtype: same`, `correction: none`) still give exactly its metrics. This module uses only
the API both versions share, so it can regenerate the record from any checkout:

    PYTHONPATH=<checkout> python tests/harness/baseline_run.py tests/harness/data/trainer_metrics_baseline.json

Bits depend on the CPU code path (docs/trainer.md, "Determinism, checkpoints and resume"): the record keeps the
path it was made on and the test compares only on the same path.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

CONFIG = {
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
    "algo": {"lr": 1e-3, "micro_batch_size": 4, "minibatches": 2, "kl": {"estimator": "k3", "coef": 0.05}},
    "train": {
        "updates": 2,
        "eval_every": 2,
        "eval_episodes": 3,
        "checkpoint_every": 0,
        "threads": 1,
        "mi_every": 2,
        "mi_prompts": 2,
    },
    "tracking": {"mlflow": False, "samples": 0},
}


def run(out: Path, config: dict | None = None) -> list[dict]:
    """Train CONFIG (or `config`) into `out`; the rows of its metrics.jsonl."""
    from harness.config.schema import RunConfig
    from harness.experiments.tracking import RunLogger
    from harness.rl.trainer import train

    logger = RunLogger(out)
    train(RunConfig.model_validate(config or CONFIG), out, logger)
    logger.close("done")
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def machine() -> dict:
    """What the bits depend on besides code and seed."""
    import torch

    from harness.experiments.provenance import cpu_code_path

    return {"cpu": cpu_code_path(), "torch": torch.__version__}


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ["HARNESS_CACHE"] = tempfile.mkdtemp(prefix="baseline-cache-")
    rows = run(Path(tempfile.mkdtemp(prefix="baseline-run-")))
    Path(sys.argv[1]).write_text(json.dumps({"machine": machine(), "config": CONFIG, "rows": rows}, indent=1) + "\n")
    print(f"wrote {len(rows)} rows to {sys.argv[1]}")
