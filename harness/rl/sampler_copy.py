"""The policy that samples the training rollouts (`rollout.sampler_dtype`, `rollout.staleness`).

`same` (default): the trainer's own model, so the sampler's log-probs differ from the trainer's
recomputation only by the arithmetic of incremental decoding. `bfloat16` / `float32`: a copy of the
policy in that dtype, which stands in for an inference engine that samples in another precision
than the trainer (vLLM in bf16 against an fp32 trainer, or the reverse). Before every rollout the
copy takes the trainer's current trainable weights, cast to its dtype; frozen weights were cast once
when the copy was made. The copy holds a second set of the model's weights (on the trainer's device).
The held-out evaluation always uses the trainer's model.

`rollout.staleness: k` (deterministic asynchronous rollout, docs/algorithms.md#staleness): the
episodes of update u are sampled with the trainable weights the trainer had at the start of update
u - k (the weights before any update while u - k < 1), as an asynchronous system whose rollout runs
k updates ahead of the learner would sample them, but in a fixed order, so a run is bit-reproducible
and the lag is exactly k. The last k + 1 snapshots of the trainable weights are kept (on the CPU) and
go into the checkpoint, so a resumed run samples exactly as an uninterrupted one.

`rollout.cross_policy` (AgentRL) keeps its stale pool here too (`StalePool`); the weight helpers
below also serve the concurrent rollout's hand-off (harness.rl.concurrent).

This module belongs to the rollout worker (harness.rl.worker), not to the engines (harness.rl.engines):
it decides *which weights* a rollout samples with (the trainer's current ones, a cast copy, a
snapshot k updates old, a stale pool member), a question of the run's schedule that any engine
(hf, static) then runs unchanged. The engines only decide *how* a given model computes a turn.
"""

from __future__ import annotations

import copy
from collections import deque
from collections.abc import Mapping

import torch
from torch import nn

from harness.model.base import DTYPES


def trainable_names(model: nn.Module) -> list[str]:
    """Names of the parameters the trainer updates (the adapter under LoRA)."""
    return [n for n, p in model.named_parameters() if p.requires_grad]


@torch.no_grad()
def copy_weights(target: Mapping[str, torch.Tensor], source: Mapping[str, torch.Tensor], names: list[str]) -> None:
    """target[n] <- source[n] for each name (copy_ casts to the target's dtype and device)."""
    for n in names:
        target[n].copy_(source[n])


@torch.no_grad()
def snapshot(model: nn.Module, names: list[str]) -> dict[str, torch.Tensor]:
    """CPU copies of the named parameters."""
    named = dict(model.named_parameters())
    return {n: named[n].detach().to("cpu", copy=True) for n in names}


def frozen_copy(model: nn.Module, sampler_dtype: str) -> nn.Module:
    """A gradient-free eval-mode copy of `model`, cast to `sampler_dtype` unless it is `same`."""
    out = copy.deepcopy(model)
    if sampler_dtype != "same":
        out = out.to(DTYPES[sampler_dtype])
    return out.eval().requires_grad_(False)


class Snapshots:
    """The last `size` snapshots of a model's trainable weights, oldest first; they go into the checkpoint."""

    def __init__(self, model: nn.Module, size: int):
        self.model, self.names = model, trainable_names(model)
        self.ring: deque[dict[str, torch.Tensor]] = deque(maxlen=size)

    def take(self) -> None:
        self.ring.append(snapshot(self.model, self.names))

    def state_dict(self) -> list[dict[str, torch.Tensor]]:
        return list(self.ring)

    def load_state_dict(self, snapshots: list[dict[str, torch.Tensor]] | None) -> None:
        self.ring.clear()
        self.ring.extend(snapshots or [])


class SamplerModel:
    """`model()`: the module to sample the next rollout with (see the module docstring)."""

    def __init__(self, trainer_model: nn.Module, sampler_dtype: str, staleness: int = 0):
        self.trainer_model, self.staleness = trainer_model, staleness
        self.snapshots = Snapshots(trainer_model, staleness + 1)
        lagged_or_cast = sampler_dtype != "same" or staleness > 0
        self.copy = frozen_copy(trainer_model, sampler_dtype) if lagged_or_cast else None

    def record(self) -> None:
        """Keep the trainer's current trainable weights: call once before each update's rollout."""
        if self.staleness > 0:
            self.snapshots.take()

    def model(self) -> nn.Module:
        """The trainer's model (same dtype, no lag), or the copy with the trainable weights of k updates
        ago (the oldest snapshot kept), or else the trainer's current ones."""
        if self.copy is None:
            return self.trainer_model
        lagged = self.staleness > 0 and self.snapshots.ring
        source = self.snapshots.ring[0] if lagged else dict(self.trainer_model.named_parameters())
        copy_weights(dict(self.copy.named_parameters()), source, self.snapshots.names)
        return self.copy

    def state_dict(self) -> list[dict[str, torch.Tensor]]:
        return self.snapshots.state_dict()

    def load_state_dict(self, snapshots: list[dict[str, torch.Tensor]] | None) -> None:
        self.snapshots.load_state_dict(snapshots)

    @property
    def dtype(self) -> torch.dtype:
        return next((self.copy or self.trainer_model).parameters()).dtype


class StalePool:
    """The stale members of cross-policy sampling (`rollout.cross_policy`, AgentRL).

    Every `refresh_every` updates (at the start of updates 1, 1 + R, 1 + 2R, ...) the pool keeps a
    snapshot of the trainer's trainable weights; member j (1-based) samples with the j-th most recent
    snapshot (the oldest one while fewer than j exist). Each member is a copy of the policy in the
    sampler's dtype, loaded when the snapshots change. The snapshots go into the checkpoint."""

    def __init__(self, trainer_model: nn.Module, sampler_dtype: str, members: int, refresh_every: int):
        self.refresh_every = refresh_every
        self.snapshots = Snapshots(trainer_model, members)
        self.copies = [frozen_copy(trainer_model, sampler_dtype) for _ in range(members)]

    def record(self, update: int) -> None:
        """Call at the start of `update` (1-based), before its rollout."""
        if self.copies and (update - 1) % self.refresh_every == 0:
            self.snapshots.take()
            self._load()

    def _load(self) -> None:
        newest_first = list(reversed(self.snapshots.ring))
        if not newest_first:
            return
        for j, c in enumerate(self.copies):
            snap = newest_first[min(j, len(newest_first) - 1)]
            copy_weights(dict(c.named_parameters()), snap, self.snapshots.names)

    def members(self) -> list[nn.Module]:
        """The stale members (member j = the j-th most recent snapshot)."""
        return self.copies

    def state_dict(self) -> list[dict[str, torch.Tensor]]:
        return self.snapshots.state_dict()

    def load_state_dict(self, snapshots: list[dict[str, torch.Tensor]] | None) -> None:
        self.snapshots.load_state_dict(snapshots)
        self._load()
