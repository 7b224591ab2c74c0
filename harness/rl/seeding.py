"""One seed drives python, numpy and torch (environments and sampling take it from the config).

A run's process is seeded once, when it starts (`start_process`): the trainer's process by
`harness.rl.trainer.Trainer`, the concurrent rollout process by `harness.rl.worker.RolloutWorker.standalone`
(a spawned process inherits nothing). Every random stream of the loop is derived from
(train.seed, update, ...) by `stream`, so it does not depend on what ran before it.
"""

from __future__ import annotations

import os
import random

import numpy as np
import torch


def seed_everything(seed: int, deterministic: bool = True) -> None:
    """Seed python, numpy and torch; with `deterministic`, ask torch for deterministic kernels.

    On CPU this makes the same config and seed give identical metrics. On CUDA, cuBLAS needs
    CUBLAS_WORKSPACE_CONFIG set before its first use, so it is set here when missing; kernels
    without a deterministic version warn instead of failing (`warn_only=True`).

    Deterministic mode also fills every new tensor's memory with NaN (torch.utils.deterministic.
    fill_uninitialized_memory), a debugging aid that makes a read of uninitialised memory visible; we
    switch it off. Its cost is small: 4% of the SmolLM2 FrozenLake recipe's update (bfloat16 autocast
    allocates a cast of every activation: 10.4 s with it, 10.0 s without), nothing measurable on the
    float32 path (docs/benchmarks.md#learner). It changes no number: a kernel that read uninitialised
    memory would have put NaN into the losses and metrics of earlier runs, and runs with and without the
    fill write byte-identical metrics (tests/harness/rl/test_seeding.py; whole points in docs/trainer.md).
    """
    random.seed(seed)
    os.environ["PYTHONHASHSEED"] = str(seed)  # for child processes; this one's hash seed is fixed
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    if deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.utils.deterministic.fill_uninitialized_memory = False
        torch.backends.cudnn.benchmark = False
        torch.backends.cudnn.deterministic = True


def start_process(seed: int, threads: int = 0) -> None:
    """The start of a process that runs part of a run: seed everything from `seed` (train.seed) and
    use `threads` CPU threads (train.threads; 0 = torch's default)."""
    seed_everything(seed)
    if threads:
        torch.set_num_threads(threads)


def stream(seed: int, *salt: int) -> torch.Generator:
    """A torch generator seeded from (seed, *salt), e.g. (train.seed, update, round)."""
    g = torch.Generator()
    g.manual_seed(int(np.random.SeedSequence([seed, *salt]).generate_state(1)[0]))
    return g
