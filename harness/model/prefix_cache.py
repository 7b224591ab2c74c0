"""The shared prefix of a group's rows run once through a key-value cache (train.learner.prefix_impl: kv_cache).

Two decoder passes (docs/trainer.md#shared-prefix). Stage 1 runs each cluster's common prefix, the clusters
batched and right-padded to the longest prefix, with use_cache=True: its keys and values keep their autograd
graph. Stage 2 copies each row's cluster cache (index_select over the batch, differentiable) and runs every
row's rest, right-padded to the longest rest, on top of it: a rest token sees its cluster's real prefix keys
and its own earlier rest tokens (an explicit 4D mask; a padding slot sees at least itself, so no softmax row
is empty), at positions P + 0, 1, ... Attention then costs G * R * (P + R) per group of G rows with prefix P
and rests R, where the packed sequence of Prefix Grouper (Liu et al. 2025) costs (P + G * R)^2; in exchange
the prefix's keys and values are copied once per row. The gradient reaching the prefix sums over its rows
through the copies, as through the packed sequence.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers.cache_utils import DynamicCache


def _additive(see: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A boolean visibility mask (N, 1, Q, K) as the additive float mask both sdpa and eager take."""
    return torch.zeros(see.shape, dtype=dtype, device=see.device).masked_fill_(~see, torch.finfo(dtype).min)


def refuse_checkpointing(decoder: nn.Module, impl: str, why: str) -> None:
    """train.learner.prefix_impl `impl` cannot run a training forward under activation checkpointing, for the
    reason `why`: raise where it would (a pass without gradients replays nothing and runs)."""
    checkpointed = any(getattr(m, "gradient_checkpointing", False) for m in decoder.modules())
    if checkpointed and decoder.training and torch.is_grad_enabled():
        raise ValueError(
            f"train.learner.prefix_impl {impl!r} with model.gradient_checkpointing: true: {why}; set "
            "model.gradient_checkpointing: false or train.learner.prefix_impl: packed"
        )


def _prefix_pass(decoder: nn.Module, input_ids: torch.Tensor, first: list[int], prefix: torch.Tensor, dtype):
    """Stage 1: the clusters' prefixes (C, Pmax), right-padded; their hidden states (C, Pmax, H) and cache."""
    dev, Pmax = input_ids.device, int(prefix.max())
    ids = input_ids[torch.tensor(first, device=dev), :Pmax]  # (C, Pmax): slots past a cluster's P are padding
    q, k = torch.arange(Pmax, device=dev)[:, None], torch.arange(Pmax, device=dev)[None, :]
    real = k < prefix.to(dev)[:, None, None]  # (C, 1, Pmax)
    see = ((k <= q)[None] & real) | (k == q)[None]  # (C, Pmax, Pmax)
    cache = DynamicCache()
    out = decoder(
        input_ids=ids,
        attention_mask=_additive(see[:, None], dtype),
        position_ids=q.T.expand(len(first), -1),
        cache=cache,
        use_cache=True,
    )
    return out.last_hidden_state, cache


def _rest_pass(decoder, input_ids, lengths, own: torch.Tensor, cache: DynamicCache | None, Pmax: int, dtype):
    """Stage 2: each row's rest (B, R) on its cluster's cached prefix (`own` (B,): each row's prefix length);
    the rests' hidden states (B, R, H)."""
    dev = input_ids.device
    rest = (lengths - own).to(dev)  # (B,)
    R = int(rest.max())
    j = torch.arange(R, device=dev)[None, :]  # (1, R)
    own = own.to(dev)
    cols = (own[:, None] + j).clamp(max=input_ids.shape[1] - 1)  # (B, R)
    ids = input_ids.gather(1, cols)  # (B, R), padding slots hold some token of the row
    real = j < rest[:, None]  # (B, R)
    kp = torch.arange(Pmax, device=dev)[None, None, :]  # (1, 1, Pmax)
    see_prefix = (kp < own[:, None, None]).expand(-1, R, -1)  # (B, R, Pmax)
    q, k = j[0][:, None], j  # (R, 1), (1, R)
    see_rest = ((k <= q)[None] & real[:, None, :]) | (k == q)[None]  # (B, R, R)
    see = torch.cat([see_prefix, see_rest], dim=2)[:, None]  # (B, 1, R, Pmax + R)
    out = decoder(
        input_ids=ids,
        attention_mask=_additive(see, dtype),
        position_ids=own[:, None] + j,
        cache=cache,
        use_cache=cache is not None,
    )
    return out.last_hidden_state


def kv_cache_hidden_states(
    decoder: nn.Module, input_ids: torch.Tensor, lengths: torch.Tensor, clusters: list[tuple[list[int], int]]
) -> torch.Tensor:
    """Last hidden states (B, T, H) of the right-padded rows `input_ids` (B, T) with real `lengths` (B,), on the
    CPU), each cluster (its rows, the length P of their common prefix) running its prefix once (module
    docstring). Positions past a row's length get a finite placeholder (slot 0); every caller masks them."""
    # under checkpointing transformers drops the cache of every layer (use_cache=False) in a training forward
    refuse_checkpointing(
        decoder, "kv_cache", "checkpointed layers keep no cache, so the rows' rests would not see their prefix"
    )
    dev, dtype = input_ids.device, next(decoder.parameters()).dtype
    B = input_ids.shape[0]
    prefix = torch.tensor([P for _, P in clusters])  # (C,)
    of = torch.zeros(B, dtype=torch.long)  # (B,) each row's cluster
    for c, (rows, _) in enumerate(clusters):
        of[rows] = c
    own, Pmax = prefix[of], int(prefix.max())  # (B,) each row's prefix length
    parts = []  # per row, the hidden states of [prefix slots, rest slots]
    cache = None
    if Pmax > 0:
        h_prefix, cache1 = _prefix_pass(decoder, input_ids, [rows[0] for rows, _ in clusters], prefix, dtype)
        idx = of.to(dev)
        parts.append(h_prefix.index_select(0, idx))  # (B, Pmax, H)
        cache = DynamicCache(ddp_cache_data=[(k.index_select(0, idx), v.index_select(0, idx)) for k, v, _ in cache1])
    if int((lengths - own).max()) > 0:
        parts.append(_rest_pass(decoder, input_ids, lengths, own, cache, Pmax, dtype))  # (B, R, H)
    h = torch.cat(parts, dim=1)  # (B, Pmax + R, H)
    t = torch.arange(input_ids.shape[1])[None, :]  # (1, T)
    src = torch.where(t < own[:, None], t, Pmax + t - own[:, None])  # (B, T) slot of each position
    src = torch.where(t < lengths[:, None], src, 0)
    return h[torch.arange(B, device=dev)[:, None], src.to(dev)]  # (B, T, H)


__all__ = ["kv_cache_hidden_states"]
