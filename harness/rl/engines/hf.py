"""The default KV engine of the rollout (`rollout.backend: hf`): the model's own forward over a
growing HF cache.

`KVBatch` meets `harness.rl.engines.base.KVEngine`: every row is a token stream in one shared cache
with left padding and holes (slots of rows that finished their action while others continued), an
explicit 4D attention mask (a key is visible when it is real and not in the future; every slot sees
itself so no softmax row is empty) and explicit position ids (real tokens before the slot), so each
row computes exactly what a single unpadded forward computes. Holes are squeezed out between turns;
finished episodes leave the batch (`select`).
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, DynamicLayer

from harness.rl.engines.base import attention_layer_types, left_padded, squeeze_order


class GrowingLayer(DynamicLayer):
    """A full-attention cache layer in a buffer that doubles when full: appending a token costs
    O(1) amortised instead of DynamicLayer's O(T) concatenation, so late turns stay cheap."""

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
            self.set(key_states[..., :0, :], value_states[..., :0, :])
        n, L = self.keys.shape[-2], key_states.shape[-2]
        if n + L > self._k.shape[-2]:
            cap = max(n + L, 2 * self._k.shape[-2], 64)
            k = self._k.new_empty(*key_states.shape[:2], cap, key_states.shape[3])  # (B, H, cap, D)
            v = self._v.new_empty(*value_states.shape[:2], cap, value_states.shape[3])
            k[..., :n, :], v[..., :n, :] = self.keys, self.values
            self._k, self._v = k, v
        self._k[..., n : n + L, :], self._v[..., n : n + L, :] = key_states, value_states
        self.keys, self.values = self._k[..., : n + L, :], self._v[..., : n + L, :]
        return self.keys, self.values

    def set(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Replace the contents (after rows were selected or holes squeezed out)."""
        self._k, self._v, self.keys, self.values = keys, values, keys, values


class KVBatch:
    """Rows of token streams sharing one DynamicCache: left padding, holes, explicit masks."""

    def __init__(self, model, pad_id: int):
        self.model, self.pad_id = model, pad_id
        emb = model.get_input_embeddings().weight
        self.device, self.dtype = emb.device, emb.dtype
        self.attn = model.config._attn_implementation
        if self.attn not in ("sdpa", "eager"):
            raise ValueError(
                f"the rollout engine needs attn_implementation 'sdpa' or 'eager' (explicit "
                f"4D masks with holes), got {self.attn!r}"
            )
        layer_types = attention_layer_types(model.config)
        if layer_types is not None:
            raise ValueError(f"the rollout engine supports full-attention models only, got layer types {layer_types}")
        self.reset(0)

    def reset(self, rows: int) -> None:
        self.cache = Cache(layer_class_to_replicate=GrowingLayer)
        self.mask = torch.zeros(rows, 0, dtype=torch.bool, device=self.device)  # (B, T) real slots
        self.length = torch.zeros(rows, dtype=torch.long, device=self.device)  # (B,) real tokens

    def _layers(self):
        return [layer for layer in self.cache.layers if layer.is_initialized]

    def select(self, rows: list[int]) -> None:
        """Keep `rows` (in this order) and squeeze out holes: real slots move right, padding left."""
        idx = torch.tensor(rows, dtype=torch.long, device=self.device)
        mask, self.length = self.mask[idx], self.length[idx]
        order = squeeze_order(mask, self.length)  # (B, T)
        self.mask = mask.gather(1, order)  # (B, T)
        for layer in self._layers():
            k, v = layer.keys[idx], layer.values[idx]  # (B, H, T_old, D)
            g = order[:, None, :, None].expand(-1, k.shape[1], -1, k.shape[3])
            layer.set(k.gather(2, g), v.gather(2, g))

    def feed(self, ids: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
        """Append ids (B, L) whose slots are real where `real` (B, L); logits of the last slot (B, V)."""
        B, L = ids.shape
        Tc = self.mask.shape[1]
        keys = torch.cat([self.mask, real], dim=1)  # (B, Tc+L)
        pos = (self.length[:, None] + real.long().cumsum(1) - 1).clamp(min=0)  # (B, L)
        q = torch.arange(L, device=self.device)[:, None] + Tc  # (L, 1)
        k = torch.arange(Tc + L, device=self.device)[None, :]  # (1, Tc+L)
        visible = (keys[:, None, :] & (k <= q)[None]) | (k == q)[None]  # (B, L, Tc+L)
        visible = visible[:, None]  # (B, 1, L, Tc+L)
        if self.attn == "eager":
            visible = torch.zeros(visible.shape, dtype=self.dtype, device=self.device).masked_fill(
                ~visible, torch.finfo(self.dtype).min
            )
        out = self.model(
            input_ids=ids, attention_mask=visible, position_ids=pos, cache=self.cache, use_cache=True, logits_to_keep=1
        )
        self.mask, self.length = keys, self.length + real.long().sum(1)
        return out.logits[:, -1]

    def prefill(self, new_ids: list[list[int]]) -> torch.Tensor:
        """Append a ragged list of segments, left-padded; logits after each row's last token."""
        return self.feed(*left_padded(new_ids, self.pad_id, self.device))


def prefill_shared(kv: KVBatch, new_ids: list[list[int]]) -> torch.Tensor:
    """`kv.prefill(new_ids)` into an empty cache, with rows whose segments are the same token list run once
    (rollout.share_prefix): the distinct segments are prefilled as rows of their own, then every row takes a
    copy of its segment's cache slots (`select` with repeats) and its logits. Each row computes what it
    computes in the full batch, on fewer rows; the first prefill of a GRPO group's members is one row instead
    of G (docs/trainer.md#shared-prefix)."""
    if kv.mask.shape[1]:
        raise ValueError("prefill_shared: the cache already holds tokens; the rows are no longer the same")
    first: dict[tuple[int, ...], int] = {}
    which = [first.setdefault(tuple(ids), len(first)) for ids in new_ids]
    if len(first) == len(new_ids):
        return kv.prefill(new_ids)
    kv.reset(len(first))
    logits = kv.prefill([list(ids) for ids in first])
    kv.select(which)
    return logits[torch.tensor(which, dtype=torch.long, device=logits.device)]
