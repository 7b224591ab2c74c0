"""Frozen weights held in the learner's low precision (docs/trainer.md#learner-precision).

Under bfloat16 autocast every matrix product casts its float32 operands to bfloat16. Autocast keeps
the casts of trainable leaf tensors (the LoRA factors) for the length of its region, but not those of
frozen ones: the base model's linear weights are cast again at every forward of every micro-batch
and pass. On the SmolLM2 FrozenLake recipe that copying was 17% of an update's CPU time (a profile
of one update, docs/benchmarks.md#learner). `frozen_linears_in(model, dtype)` puts a `dtype` copy of
each frozen linear weight (and bias) in place of the float32 tensor for the length of the context,
so autocast finds it already in its dtype and casts nothing. Inside `casts_kept(model)` (one update,
during which frozen weights cannot change) each weight is cast once and the copy reused by every
pass; outside it a context casts afresh, because a cache that outlived the update could go stale
unseen (a write through `.data`, as a weight reset does, leaves the version counter alone).

PEFT's adapter layers cast their input to the adapter's float32 before the adapter's product, which
autocast then casts back to bfloat16: two copies of the activations per adapted layer whose input is
already bfloat16 (the attention output into o_proj), and a round trip that changes no value
(bfloat16 -> float32 -> bfloat16 is exact, and so is the backward's). The context switches that
cast off (PEFT's own `cast_input_dtype_enabled`), so the adapter reads the bfloat16 input directly.

The cast is the one autocast makes (`Tensor.to`, round to nearest even) and the products see the
same operands, so every number is the same bit for bit; the float32 weights stay the model's own
outside the context (the sampler, evaluation and checkpoints read them). Only `nn.Linear` modules
are touched: an embedding whose weight is tied to the output layer keeps its float32 table (autocast
never casts a lookup), while the output layer gets the copy.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import torch
from torch import nn

# model -> {id(float32 tensor): (key of that tensor's state, its cast)}, while casts_kept(model) runs
_KEPT: weakref.WeakKeyDictionary[nn.Module, dict[int, tuple[tuple, torch.Tensor]]] = weakref.WeakKeyDictionary()


# inside autocast_only(): frozen_linears_in changes nothing (the code before it, for benches and tests)
_OFF: ContextVar[bool] = ContextVar("harness_frozen_casts_off", default=False)


@contextmanager
def autocast_only() -> Iterator[None]:
    """Inside: `frozen_linears_in` leaves the model as it is, so autocast casts every frozen weight at
    every product and PEFT casts its inputs, as before this module: the baseline its equality tests and
    `harness.bench.learner.bench_weight_casts` compare against."""
    token = _OFF.set(True)
    try:
        yield
    finally:
        _OFF.reset(token)


def _state(t: torch.Tensor, dtype: torch.dtype) -> tuple:
    return (t.data_ptr(), t._version, tuple(t.shape), t.dtype, dtype)


def _frozen(t: torch.Tensor | None) -> bool:
    return t is not None and not t.requires_grad and t.dtype == torch.float32


@contextmanager
def casts_kept(model: nn.Module) -> Iterator[None]:
    """Inside: `frozen_linears_in(model, ...)` casts each frozen weight once and reuses the copy; the
    caller promises the frozen weights do not change meanwhile (the length of one update)."""
    outer = _KEPT.get(model)
    _KEPT[model] = outer if outer is not None else {}
    try:
        yield
    finally:
        if outer is None:
            _KEPT.pop(model, None)


@contextmanager
def frozen_linears_in(model: nn.Module, dtype: torch.dtype) -> Iterator[None]:
    """Inside: every `nn.Linear` of `model` whose weight is frozen float32 holds a `dtype` copy of its
    weight and bias instead (module docstring); outside, its own tensors again. Nothing inside
    `autocast_only()`."""
    if _OFF.get():
        yield
        return
    kept = _KEPT.get(model)
    casts = kept if kept is not None else {}
    swapped: list[tuple[nn.Module, str, nn.Parameter]] = []
    uncast: list[nn.Module] = []
    try:
        for module in model.modules():
            if getattr(module, "cast_input_dtype_enabled", False):  # a PEFT adapter layer
                module.cast_input_dtype_enabled = False
                uncast.append(module)
            if not isinstance(module, nn.Linear) or not _frozen(module.weight):
                continue
            for name in ("weight", "bias"):
                p = module._parameters.get(name)
                if not _frozen(p):
                    continue
                key = _state(p, dtype)
                hit = casts.get(id(p))
                if hit is None or hit[0] != key:
                    hit = (key, p.detach().to(dtype))
                    casts[id(p)] = hit
                module._parameters[name] = nn.Parameter(hit[1], requires_grad=False)
                swapped.append((module, name, p))
        yield
    finally:
        for module, name, p in reversed(swapped):
            module._parameters[name] = p
        for module in uncast:
            module.cast_input_dtype_enabled = True
