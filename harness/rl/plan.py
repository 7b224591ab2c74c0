"""Which passes an update runs, decided once per update (docs/trainer.md#update-plan).

An update can compute three no-gradient things before its gradient steps: the behaviour log-probs
(and the full-vocabulary entropy diagnostic), the reference log-probs (adapter off) and the critic's
values. The plan says which of them run and where the behaviour log-probs come from:

    behaviour  recompute: a pass of the trainer's model over every row, in eval mode;
               sampler:   the log-probs and entropies our sampler recorded while drawing the tokens;
               first_forward: where the update is one on-policy step, the training forward's own log-probs,
                          detached, filled in as each micro-batch runs (verl's on-policy shortcut), and the
                          sampler's entropies.
               The sampler's are the same policy's only when the sampler is the trainer's own model
               (config-checked, `harness.config.schema.learner_problem`); a critic's values need the
               pass anyway, so with a critic the update recomputes.
    reference  every update where a KL term is trained or in the reward; else every
               train.learner.reference_every updates (1, k + 1, 2k + 1, ...), for diag/kl_* alone.
    shared prefix  with train.learner.shared_prefix, every pass (behaviour, reference, training) runs a
               group's common prefix once (harness.model.logprobs.shared_prefix_hidden_states), its
               micro-batches made of whole groups (harness.rl.batch.prefix_units); train.learner.prefix_impl
               says how: one packed sequence per group, or the prefix's key-value cache under each row's rest.
               The plan holds the two as one value, `UpdatePlan.prefix`: the implementation's name, None
               where no prefix is shared; the learner's functions take it as their `prefix` argument.
    padding free  train.learner.padding_free: each micro-batch runs as one packed row, nothing padded, its
               attention per sequence (harness.model.segmented); `UpdatePlan.prefix` then names the layout
               "padding_free" (rows alone) or "segmented_padding_free" (groups sharing their prefix), and
               the micro-batches stay those of the padded path (harness.rl.batch.groups_shared).

    positions  train.learner.logprob_positions: needed runs the lm_head only where the update reads a log-prob.
    precision  train.learner.precision: bfloat16 runs those passes and the training forward under autocast
               (`UpdatePlan.compute`); weights, gradients and the optimizer stay in their own dtype.

A run whose train.learner is not the default logs the plan beside its metrics (`plan/*`), so every
row says which path produced it; default runs log nothing new and keep their metrics byte for byte.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass

import torch

from harness.config.errors import warn
from harness.config.schema import RunConfig
from harness.model.logprobs import PADDING_FREE, SEGMENTED_PADDING_FREE
from harness.model.precision import frozen_linears_in
from harness.rl.batch import TrainBatch, groups_shared, is_padding_free, shared_impl


@dataclass(frozen=True)
class UpdatePlan:
    behaviour: str  # "recompute", "sampler" or "first_forward"
    reference: bool  # whether the reference log-probs are computed in this update
    # each group's common prefix runs once per pass, computed as this names ("packed", "segmented" or "kv_cache",
    # train.learner.prefix_impl); None: no shared prefix (train.learner.shared_prefix false)
    prefix: str | None = None
    logged: bool = False  # whether plan/* goes into the metrics (train.learner not the default)
    precision: str = "float32"  # compute dtype of the learner's passes (train.learner.precision)
    needed_positions: bool = False  # log-probs only where the update reads them (train.learner.logprob_positions)

    def metrics(self) -> dict[str, torch.Tensor]:
        if not self.logged:
            return {}
        out = {
            "plan/behaviour_recomputed": torch.tensor(float(self.behaviour == "recompute")),
            "plan/behaviour_first_forward": torch.tensor(float(self.behaviour == "first_forward")),
            "plan/reference": torch.tensor(float(self.reference)),
            "plan/shared_prefix": torch.tensor(float(groups_shared(self.prefix))),
            "plan/bf16": torch.tensor(float(self.precision == "bfloat16")),
            "plan/needed_positions": torch.tensor(float(self.needed_positions)),
        }
        # only runs that set another prefix_impl, or padding_free, log it: the others keep their metrics byte
        # for byte
        impl = shared_impl(self.prefix)
        if impl in ("kv_cache", "segmented"):
            out[f"plan/prefix_{impl}"] = torch.tensor(1.0)
        if is_padding_free(self.prefix):
            out["plan/padding_free"] = torch.tensor(1.0)
        return out

    def compute(self, model: torch.nn.Module) -> AbstractContextManager:
        """The context the learner's forward passes of `model` run in: autocast to bfloat16 under
        precision bfloat16 (matrix products in bfloat16; PyTorch keeps softmax, log-softmax, norms and
        reductions in float32) with the frozen linear weights in cached bfloat16 copies, so autocast
        does not cast them again at every forward (harness.model.precision; the same numbers bit for
        bit), else nothing. Backward passes run outside it: autograd replays each op in the dtype its
        forward used (docs/trainer.md#learner-precision)."""
        if self.precision == "float32":
            return nullcontext()
        return _low_precision(model, getattr(torch, self.precision))


@contextmanager
def _low_precision(model: torch.nn.Module, dtype: torch.dtype) -> Iterator[None]:
    device = next(model.parameters()).device
    with torch.autocast(device.type, dtype=dtype), frozen_linears_in(model, dtype):
        yield


DEFAULT_PLAN = UpdatePlan(behaviour="recompute", reference=True)


def cpu_bf16() -> str:
    """The CPU's bfloat16 instructions as /proc/cpuinfo lists them ('' where it lists none or cannot be read):
    without them autocast to bfloat16 runs, emulated, slower than float32."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    except OSError:
        return ""
    return " ".join(sorted(x for x in flags if x in ("avx512_bf16", "amx_bf16", "avx_ne_convert")))


def check_precision(cfg: RunConfig, device: torch.device | str) -> None:
    """A warning where train.learner.precision asks for bfloat16 on a CPU without bfloat16 instructions:
    it runs, emulated, slower than float32, so the setting buys nothing there (and its numbers need not
    match, bit for bit, those of a CPU that has the instructions: the kernels differ)."""
    if cfg.train.learner.precision == "bfloat16" and torch.device(device).type == "cpu" and not cpu_bf16():
        warn(
            "train.learner.precision: bfloat16 on a CPU without bfloat16 instructions (no avx512_bf16 or amx_bf16 "
            "in /proc/cpuinfo): autocast emulates it, slower than float32; set train.learner.precision: float32 "
            "on this machine unless the run must match bfloat16 runs made elsewhere",
            once_key="learner-precision-cpu",
        )


def layout(ln) -> str | None:
    """The learner passes' layout (`UpdatePlan.prefix`) under train.learner `ln`: the shared prefix's
    implementation, a padding-free layout, or None (rows padded, nothing shared)."""
    if ln.padding_free:
        return SEGMENTED_PADDING_FREE if ln.shared_prefix else PADDING_FREE
    return ln.prefix_impl if ln.shared_prefix else None


def make_plan(cfg: RunConfig, update: int, batch: TrainBatch) -> UpdatePlan:
    """The plan of update `update` (1-based) on `batch` under `cfg` (module docstring)."""
    ln = cfg.train.learner
    # both read the sampler's entropies: a rollout that recorded none (e.g. a resumed batch) recomputes
    recorded = ln.behaviour != "recompute" and not cfg.algo.critic.enabled and batch.stream_entropy is not None
    return UpdatePlan(
        behaviour=ln.behaviour if recorded else "recompute",
        reference=ln.reference_every == 1 or (update - 1) % ln.reference_every == 0,
        prefix=layout(ln),
        logged=not ln.is_default,
        precision=ln.precision,
        needed_positions=ln.logprob_positions == "needed",
    )
