"""One seed drives python, numpy and torch (environments and sampling take it from the config)."""

from __future__ import annotations

import os
import random


def seed_everything(seed: int, deterministic: bool = True) -> None:
    """Seed python, numpy and torch; with `deterministic`, ask torch for deterministic kernels.

    On CPU this makes the same config and seed give identical metrics. On CUDA, cuBLAS needs
    CUBLAS_WORKSPACE_CONFIG set before its first use, so it is set here when missing; kernels
    without a deterministic version warn instead of failing (`warn_only=True`).
    """
    random.seed(seed)
    os.environ["PYTHONHASHSEED"] = str(seed)  # for child processes; this one's hash seed is fixed
    import numpy as np
    import torch

    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    if deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.backends.cudnn.benchmark = False
        torch.backends.cudnn.deterministic = True
