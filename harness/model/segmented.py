"""The packed shared prefix with its attention computed per segment (train.learner.prefix_impl: segmented).

Prefix Grouper's packed sequence (`harness.model.logprobs._packed_hidden_states`) runs a group's rows as
one sequence [prefix, rest 1, rest 2, ...]: every linear layer sees each token once and nothing pads, but
the block attention mask makes attention dense over the packed length, (P + G*R)^2 for G rows of prefix P
and rests R, though a rest token sees only the prefix and its own row. On the SmolLM2 FrozenLake recipe
that dense attention was half of the update's CPU time (docs/benchmarks.md#learner).

Here the same packed sequence runs through the decoder, and each attention layer computes only the blocks a
token sees (docs/trainer.md#shared-prefix): the prefix causally over itself, and each rest over [the prefix's
keys, its own keys] with the causal diagonal aligned to its last key (query j of a rest sees the prefix and
the rest's keys 0..j). Attention then costs P^2 + sum_i R_i (P + R_i), as through the key-value cache
(`harness.model.prefix_cache`), without that path's padding of the rests, its second decoder call and its
per-row copies of the prefix's hidden states. The linear layers, norms and rotary positions are the packed
path's, so values and gradients equal it (and the plain path) up to float rounding: a softmax over a
different set of key blocks rounds differently.

The decoder is transformers' own; the attention function is registered with transformers'
AttentionInterface under `ATTN_NAME` and switched on in the model's config only for the length of one
decoder call (`segmented_decoder_call`), which hands the segments to every layer's attention as a keyword
argument (transformers passes a decoder call's extra keywords down to the attention function). Checkpointed
layers would recompute their attention in backward after that switch is undone, so the path refuses
activation checkpointing (as the cache path does), and models with sliding-window layers.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.nn import functional as F
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import repeat_kv

from harness.model.prefix_cache import refuse_checkpointing

ATTN_NAME = "harness_segmented"
SEGMENTS_KW = "harness_segments"  # the decoder call's keyword that carries them to the attention


@dataclass
class Segments:
    """Where each packed row's segments lie: per packed row b, its clusters, each (start, P, rests): a prefix of P
    tokens at [start, start + P) and the [s, e) spans of the rests that read it, laid end to end from the row's
    first token. One cluster per row is Prefix Grouper's layout; several are the padding-free layout
    (train.learner.padding_free), where a cluster with no rests is a sequence of its own.

    Stands in for the attention mask in the decoder call; the masks of the rests (lower-right causal,
    (R, P + R) booleans) are built once per call and shared by every layer."""

    rows: list[list[tuple[int, int, list[tuple[int, int]]]]]
    _masks: dict[tuple[int, int], torch.Tensor] = field(default_factory=dict)

    def __post_init__(self):
        for b, clusters in enumerate(self.rows):
            at = 0
            for start, P, spans in clusters:
                if start != at or P < 0:
                    raise ValueError(f"Segments: packed row {b}'s cluster at {start} does not follow on from {at}")
                at = start + P
                for s, e in spans:
                    if s != at or e < s:
                        raise ValueError(f"Segments: packed row {b}'s span [{s}, {e}) does not follow on from {at}")
                    at = e

    def rest_mask(self, P: int, R: int, device: torch.device) -> torch.Tensor:
        """(R, P + R) booleans: query j sees the prefix's P keys and the rest's keys 0..j."""
        key = (P, R)
        if key not in self._masks:
            self._masks[key] = torch.ones(R, P + R, dtype=torch.bool, device=device).tril(diagonal=P)
        return self._masks[key]


def segmented_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """transformers' attention signature: query (B, Hq, L, d), key and value (B, Hkv, L, d) after the rotary
    embedding; returns (B, L, Hq, d). The segments come as the keyword SEGMENTS_KW, which the decoder passes
    through to every layer's attention; there is no mask. Padding slots past a row's last rest get zeros (never
    read)."""
    segments = kwargs.get(SEGMENTS_KW)
    if not isinstance(segments, Segments) or attention_mask is not None:
        raise TypeError(f"{ATTN_NAME} attention takes the packed rows' Segments as {SEGMENTS_KW} and no mask")
    if dropout:
        raise ValueError(f"{ATTN_NAME} attention does not apply dropout (got {dropout})")
    groups = getattr(module, "num_key_value_groups", 1)
    if groups > 1:
        key, value = repeat_kv(key, groups), repeat_kv(value, groups)
    _, H, L, d = query.shape
    rows = []
    for b, clusters in enumerate(segments.rows):
        q, k, v = query[b : b + 1], key[b : b + 1], value[b : b + 1]
        parts, end = [], 0
        for a, P, spans in clusters:
            kp, vp = k[:, :, a : a + P], v[:, :, a : a + P]
            if P:
                parts.append(F.scaled_dot_product_attention(q[:, :, a : a + P], kp, vp, is_causal=True, scale=scaling))
            end = a + P
            for s, e in spans:
                if e == s:
                    continue
                ks, vs = torch.cat([kp, k[:, :, s:e]], 2), torch.cat([vp, v[:, :, s:e]], 2)
                mask = segments.rest_mask(P, e - s, query.device)
                parts.append(F.scaled_dot_product_attention(q[:, :, s:e], ks, vs, attn_mask=mask, scale=scaling))
                end = e
        if end < L:
            parts.append(query.new_zeros(1, H, L - end, d))
        rows.append(torch.cat(parts, 2))
    return torch.cat(rows, 0).transpose(1, 2).contiguous(), None


AttentionInterface.register(ATTN_NAME, segmented_attention)


@contextmanager
def _attention_switched(decoder: nn.Module):
    """The decoder's config names ATTN_NAME for the length of the block (restored on any exit)."""
    config = decoder.config
    before = config._attn_implementation
    config._attn_implementation = ATTN_NAME
    try:
        yield
    finally:
        config._attn_implementation = before


def refuse(decoder: nn.Module) -> None:
    """Raise where the segmented attention would compute something other than the packed path."""
    refuse_checkpointing(
        decoder,
        "segmented",
        "checkpointed layers recompute their attention in backward, after the segmented attention is switched off",
    )
    kinds = set(getattr(decoder.config, "layer_types", None) or ["full_attention"])
    if kinds != {"full_attention"}:
        raise ValueError(
            f"train.learner.prefix_impl 'segmented' needs full attention in every layer, not {sorted(kinds)}; "
            "set train.learner.prefix_impl: packed"
        )


def segmented_decoder_call(
    decoder: nn.Module, packed_ids: torch.Tensor, positions: torch.Tensor, segments: Segments
) -> torch.Tensor:
    """The decoder over packed rows (Bp, Lp) with `segments` in place of their block mask; (Bp, Lp, H)."""
    refuse(decoder)
    with _attention_switched(decoder):
        out = decoder(
            input_ids=packed_ids,
            attention_mask=None,  # no mask is made for an attention transformers has no mask function for
            **{SEGMENTS_KW: segments},
            position_ids=positions,
            use_cache=False,
        )
    return out.last_hidden_state
