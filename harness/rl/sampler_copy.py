"""The policy that samples the training rollouts (`rollout.sampler_dtype`, `rollout.staleness`).

`same` (default): the trainer's own model, so the sampler's log-probs differ from the trainer's
recomputation only by the arithmetic of incremental decoding. `bfloat16` / `float32`: a copy of the
policy in that dtype, which stands in for an inference engine that samples in another precision
than the trainer (vLLM in bf16 against an fp32 trainer, or the reverse). Before every rollout the
copy takes the trainer's current trainable weights, cast to its dtype; frozen weights were cast once
when the copy was made. The copy holds a second set of the model's weights (on the trainer's device).
The held-out evaluation always uses the trainer's model.

`rollout.staleness: k` (deterministic asynchronous rollout, docs/algorithms.md section 11): the
episodes of update u are sampled with the trainable weights the trainer had at the start of update
u - k (the weights before any update while u - k < 1), as an asynchronous system whose rollout runs
k updates ahead of the learner would sample them, but in a fixed order, so a run is bit-reproducible
and the lag is exactly k. The last k + 1 snapshots of the trainable weights are kept (on the CPU) and
go into the checkpoint, so a resumed run samples exactly as an uninterrupted one.
"""

from __future__ import annotations

import copy
from collections import deque

import torch
from torch import nn

from harness.model.base import DTYPES


class SamplerModel:
    """`model()`: the module to sample the next rollout with (see the module docstring)."""

    def __init__(self, trainer_model: nn.Module, sampler_dtype: str, staleness: int = 0):
        self.trainer_model = trainer_model
        self.staleness = staleness
        self.copy: nn.Module | None = None
        self._trainable = [n for n, p in trainer_model.named_parameters() if p.requires_grad]
        self.snapshots: deque[dict[str, torch.Tensor]] = deque(maxlen=staleness + 1)
        if sampler_dtype != "same" or staleness > 0:
            self.copy = copy.deepcopy(trainer_model)
            if sampler_dtype != "same":
                self.copy = self.copy.to(DTYPES[sampler_dtype])
            self.copy.eval().requires_grad_(False)

    @torch.no_grad()
    def record(self) -> None:
        """Keep the trainer's current trainable weights: call once before each update's rollout."""
        if self.staleness > 0:
            named = dict(self.trainer_model.named_parameters())
            self.snapshots.append({n: named[n].detach().to("cpu", copy=True) for n in self._trainable})

    @torch.no_grad()
    def model(self) -> nn.Module:
        """The trainer's model (same dtype, no lag), or the copy with the trainable weights of k updates
        ago (the oldest snapshot kept), or else the trainer's current ones."""
        if self.copy is None:
            return self.trainer_model
        if self.staleness > 0 and self.snapshots:
            source = self.snapshots[0]
        else:
            source = dict(self.trainer_model.named_parameters())
        target = dict(self.copy.named_parameters())
        for name in self._trainable:
            target[name].copy_(source[name])  # copy_ casts to the copy's dtype and device
        return self.copy

    def state_dict(self) -> list[dict[str, torch.Tensor]]:
        """The snapshots kept (for the checkpoint)."""
        return list(self.snapshots)

    def load_state_dict(self, snapshots: list[dict[str, torch.Tensor]] | None) -> None:
        self.snapshots.clear()
        self.snapshots.extend(snapshots or [])

    @property
    def dtype(self) -> torch.dtype:
        return next((self.copy or self.trainer_model).parameters()).dtype


class StalePool:
    """The stale members of cross-policy sampling (`rollout.cross_policy`, AgentRL).

    Every `refresh_every` updates (at the start of updates 1, 1 + R, 1 + 2R, ...) the pool keeps a
    snapshot of the trainer's trainable weights; member j (1-based) samples with the j-th most recent
    snapshot (the oldest one while fewer than j exist). Each member is a copy of the policy in the
    sampler's dtype. The snapshots go into the checkpoint."""

    def __init__(self, trainer_model: nn.Module, sampler_dtype: str, members: int, refresh_every: int):
        self.trainer_model, self.refresh_every = trainer_model, refresh_every
        self._trainable = [n for n, p in trainer_model.named_parameters() if p.requires_grad]
        self.snapshots: deque[dict[str, torch.Tensor]] = deque(maxlen=members)
        self.copies: list[nn.Module] = []
        for _ in range(members):
            c = copy.deepcopy(trainer_model)
            if sampler_dtype != "same":
                c = c.to(DTYPES[sampler_dtype])
            self.copies.append(c.eval().requires_grad_(False))

    @torch.no_grad()
    def record(self, update: int) -> None:
        """Call at the start of `update` (1-based), before its rollout."""
        if self.copies and (update - 1) % self.refresh_every == 0:
            named = dict(self.trainer_model.named_parameters())
            self.snapshots.append({n: named[n].detach().to("cpu", copy=True) for n in self._trainable})

    @torch.no_grad()
    def members(self) -> list[nn.Module]:
        """The stale members with their snapshots loaded (member j = the j-th most recent snapshot)."""
        if not self.copies:
            return []
        newest_first = list(reversed(self.snapshots))
        for j, c in enumerate(self.copies):
            snap = newest_first[min(j, len(newest_first) - 1)]
            target = dict(c.named_parameters())
            for name in self._trainable:
                target[name].copy_(snap[name])
        return self.copies

    def state_dict(self) -> list[dict[str, torch.Tensor]]:
        return list(self.snapshots)

    def load_state_dict(self, snapshots: list[dict[str, torch.Tensor]] | None) -> None:
        self.snapshots.clear()
        self.snapshots.extend(snapshots or [])
