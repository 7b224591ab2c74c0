"""The policy that samples the training rollouts (`rollout.sampler_dtype`).

`same` (default): the trainer's own model, so the sampler's log-probs differ from the trainer's
recomputation only by the arithmetic of incremental decoding. `bfloat16` / `float32`: a copy of the
policy in that dtype, which stands in for an inference engine that samples in another precision
than the trainer (vLLM in bf16 against an fp32 trainer, or the reverse). Before every rollout the
copy takes the trainer's current trainable weights, cast to its dtype; frozen weights were cast once
when the copy was made. The copy holds a second set of the model's weights (on the trainer's device).
The held-out evaluation always uses the trainer's model.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from harness.model.base import DTYPES


class SamplerModel:
    """`model()`: the module to sample the next rollout with (see the module docstring)."""

    def __init__(self, trainer_model: nn.Module, sampler_dtype: str):
        self.trainer_model = trainer_model
        self.copy: nn.Module | None = None
        if sampler_dtype != "same":
            self.copy = copy.deepcopy(trainer_model).to(DTYPES[sampler_dtype]).eval()
            self._trainable = [n for n, p in trainer_model.named_parameters() if p.requires_grad]
            self.copy.requires_grad_(False)

    @torch.no_grad()
    def model(self) -> nn.Module:
        """The trainer's model (same), or the copy with the trainer's current trainable weights."""
        if self.copy is None:
            return self.trainer_model
        source = dict(self.trainer_model.named_parameters())
        target = dict(self.copy.named_parameters())
        for name in self._trainable:
            target[name].copy_(source[name])  # copy_ casts to the copy's dtype
        return self.copy

    @property
    def dtype(self) -> torch.dtype:
        return next((self.copy or self.trainer_model).parameters()).dtype
