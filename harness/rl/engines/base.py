"""What every rollout engine shares: the turn it returns and the two contracts an engine meets.

- A **KV engine** (`KVEngine`: `harness.rl.engines.hf.KVBatch`, `harness.rl.engines.static.StaticKVBatch`)
  holds the rows' token streams in a KV cache and computes next-token logits; our sampler
  (`harness.rl.rollout.generate_turn`) draws the tokens from them. Rows are left-padded, rows that
  finished their action leave holes, positions count real tokens only and every slot sees itself,
  so each row computes exactly what a single unpadded forward computes.
- A **turn sampler** (`TurnSampler`: `harness.rl.engines.vllm.VLLMSampler`) samples a whole turn
  itself from each row's full context; `harness.rl.rollout.collect` recognises it by `sample_turn`.

Both give one `TurnOutput` per turn.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch


@dataclass
class TurnOutput:
    ids: list[list[int]]
    logprobs: list[list[float]]
    raw_logprobs: list[list[float] | None]  # unconstrained log-probs; None for unconstrained rows
    overflow: list[bool]
    allowed: list[list[list[int]] | None] | None = None  # per token, the ids it was drawn from (constrained rows)
    members: list[int] | None = None  # cross-policy sampling: the pool member of each row (0 = current)
    # our sampler: per token, the entropy of the tempered distribution over the vocabulary and of the
    # distribution drawn from (`harness.rl.sampling.Draw`); None where the engine does not record them
    entropy: list[list[float]] | None = None
    entropy_constrained: list[list[float]] | None = None


class KVEngine(Protocol):
    """Rows of token streams in one KV cache (see the module docstring)."""

    def reset(self, rows: int) -> None:
        """Empty the cache for `rows` new rows."""

    def select(self, rows: list[int]) -> None:
        """Keep `rows` (in this order) and squeeze out holes."""

    def feed(self, ids: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
        """Append ids (B, L), real where `real` (B, L); logits of the last slot (B, V)."""

    def prefill(self, new_ids: list[list[int]]) -> torch.Tensor:
        """Append a ragged list of segments, left-padded; logits after each row's last token (B, V)."""


class TurnSampler(Protocol):
    """An engine that samples a turn itself from each row's whole context (token ids in and out)."""

    def sample_turn(
        self,
        new_ids: list[list[int]],
        tries: list | None,
        *,
        generator: torch.Generator | list[torch.Generator],
        eot_id: int,
        max_new_tokens: int,
        temperature: float,
        top_p: float,
        greedy: bool,
    ) -> TurnOutput:
        """One action per row of `new_ids` (each a row's whole context)."""


def left_padded(rows: list[list[int]], pad_id: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Ragged segments as (B, L) ids left-padded with pad_id, and (B, L) bool: the real slots."""
    L = max(len(x) for x in rows)
    ids = torch.full((len(rows), L), pad_id, dtype=torch.long)
    real = torch.zeros(len(rows), L, dtype=torch.bool)
    for b, x in enumerate(rows):
        ids[b, L - len(x) :] = torch.tensor(x, dtype=torch.long)
        real[b, L - len(x) :] = True
    return ids.to(device), real.to(device)


def attention_layer_types(config) -> list[str] | None:
    """The model's attention layer types when any is not full attention (sliding windows); None
    when every layer attends to the whole context, the only kind both KV engines support."""
    types = set(getattr(config, "layer_types", None) or ["full_attention"])
    if types != {"full_attention"} or getattr(config, "use_sliding_window", False):
        return sorted(types)
    return None


def squeeze_order(mask: torch.Tensor, length: torch.Tensor) -> torch.Tensor:
    """For each row of `mask` (B, T_old, True = real slot), the slots to keep so that its real
    tokens end up right-aligned in (B, max length): a stable sort puts the holes first and the
    real slots after them in their order, and the last max-length slots are kept."""
    T = int(length.max()) if len(length) else 0
    return torch.sort(mask.to(torch.int8), dim=1, stable=True).indices[:, mask.shape[1] - T :]
