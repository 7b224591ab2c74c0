"""The baseline run: a tiny trainer run whose metrics are recorded in tests/support/data/trainer_metrics_baseline.json.

The record was written by the trainer as it was before the off-policy axis (rollout.sampler_dtype,
algo.correction, diag/mismatch_*) existed; tests/harness/rl/test_mismatch.py checks that the defaults
(`sampler_dtype: same`, `correction: none`) still give exactly its metrics. `run` uses only the API
both versions share. To write the record again:

    python -m tests.helpers.baseline tests/support/data/trainer_metrics_baseline.json

Bits depend on the CPU code path (docs/trainer.md, "Determinism, checkpoints and resume"): the file keeps one
record per path (`machine`: AVX2 and AVX512 kernels of this project's machines so far, both made by the
trainer before the off-policy axis, commit 5b8edd7^) and the test compares with the record of its own path.
Pinning the kernels does not stand in for a record: on an AVX512 machine, ATEN_CPU_CAPABILITY=avx2 with
MKL_CBWR=AVX2 (and oneDNN's ISA capped) still differs from the AVX2 record from update 1 on (27 metrics,
about 1e-5 relative). The writer below adds or replaces the record of the machine it runs on.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

from tests.helpers import SUPPORT
from tests.helpers.configs import TINY, merge

RECORD = SUPPORT / "data" / "trainer_metrics_baseline.json"
# TINY for two updates, two minibatches and a k3 KL term, no checkpoints, no samples
CONFIG = merge(
    TINY,
    {
        "algo": {"minibatches": 2, "kl": {"estimator": "k3", "coef": 0.05}},
        "train": {"updates": 2, "checkpoint_every": 0},
        "tracking": {"samples": 0},
    },
)


def run(out: Path, config: dict | None = None) -> list[dict]:
    """Train CONFIG (or `config`) into `out`; the rows of its metrics.jsonl."""
    from harness.config.schema import RunConfig
    from harness.experiments.tracking import RunLogger
    from harness.rl.trainer import train

    logger = RunLogger(out)
    train(RunConfig.model_validate(config or CONFIG), out, logger)
    logger.close("done")
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def record(path: Path = RECORD) -> tuple[dict, dict | None]:
    """(the recorded config, this machine's record or None when its CPU code path has none)."""
    data = json.loads(path.read_text())
    mine = [r for r in data["records"] if r["machine"] == machine()]
    return data["config"], (mine[0] if mine else None)


def machine() -> dict:
    """What the bits depend on besides code and seed."""
    import torch

    from harness.experiments.provenance import cpu_code_path

    return {"cpu": cpu_code_path(), "torch": torch.__version__}


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ["HARNESS_CACHE"] = tempfile.mkdtemp(prefix="baseline-cache-")
    target = Path(sys.argv[1])
    rows = run(Path(tempfile.mkdtemp(prefix="baseline-run-")))
    old = json.loads(target.read_text()) if target.exists() else {"config": CONFIG, "records": []}
    assert old["config"] == CONFIG, f"{target} was recorded with another config"
    records = [r for r in old["records"] if r["machine"] != machine()] + [{"machine": machine(), "rows": rows}]
    target.write_text(json.dumps({"config": CONFIG, "records": records}, indent=1) + "\n")
    print(f"wrote {len(rows)} rows for {machine()} to {target}")
