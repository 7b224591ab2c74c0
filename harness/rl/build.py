"""A run's policy built from its config: the model pipeline (harness.model.pipeline: base model ->
SFT warm-up -> adapter) fed with the run's demonstrations (harness.rl.demos), so that model/ never
plays an environment and a cache hit plays none."""

from __future__ import annotations

from pathlib import Path

import torch

from harness.config.schema import RunConfig
from harness.model.pipeline import attach_adapter, base_model, sft_warmup
from harness.model.policy import Policy
from harness.rl.demos import Demonstrations


def resolve_device(device: str) -> str:
    """train.device, with `auto` resolved to cuda where a GPU is present, else cpu."""
    return ("cuda" if torch.cuda.is_available() else "cpu") if device == "auto" else device


def build_policy(cfg: RunConfig, cache_dir: Path, device: str, demos: Demonstrations) -> tuple[Policy, str]:
    """(the trainable policy, the folder or hub id its weights were loaded from: vLLM loads the same)."""
    source, info = base_model(cfg, cache_dir, demos)
    source, info = sft_warmup(cfg, source, info, cache_dir, device, demos)
    return attach_adapter(cfg, source, info, device), source


def load_policy(cfg: RunConfig, cache_dir: Path, device: str, demos: Demonstrations | None = None) -> Policy:
    """The starting policy of a run (`demos`: the run's demonstrations; None: the config's, made here)."""
    return build_policy(cfg, cache_dir, device, demos or Demonstrations.of(cfg))[0]
