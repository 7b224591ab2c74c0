"""`algo.agg`: how per-token losses become one scalar (docs/algorithms.md#aggregation).

Signature: `fn(loss (B,T), mask (B,T), params: AggParams) -> 0-dim tensor`.
Rows whose mask is all zero are excluded from every sequence count. With micro-batching,
pass the whole mini-batch's counts in `AggParams` (see `global_counts`): the sum of the
micro-batch results then equals the full-batch result exactly, for every value.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from .registry import Registry
from .types import AggParams, AggregationFn
from .utils import masked_sum

AGGREGATION: Registry[AggregationFn] = Registry("algo.agg", "loss aggregation over tokens and sequences")


def global_counts(mask: torch.Tensor, params: AggParams) -> AggParams:
    """`params` with the counts of a whole mini-batch `mask (B,T)`, to pass to each of its micro-batches."""
    m = mask.bool()
    return replace(params, num_tokens=float(m.sum()), num_seqs=float(m.any(1).sum()))


def _denominator(local: torch.Tensor, given) -> torch.Tensor:
    d = local if given is None else torch.as_tensor(given, dtype=local.dtype)
    return d.clamp(min=1)  # an empty batch gives 0, not NaN


@AGGREGATION.register(
    "token-mean", doc="sum(L*M) / sum(M) over the whole mini-batch", source="DAPO (Yu et al. 2025); verl agg_loss"
)
def token_mean(loss: torch.Tensor, mask: torch.Tensor, params: AggParams):
    """loss, mask (B,T) -> (). Every trained token weighs the same."""
    n = mask.bool().sum().to(loss.dtype)
    return masked_sum(loss, mask) / _denominator(n, params.num_tokens)


@AGGREGATION.register(
    "seq-mean-token-mean",
    doc="mean over rows of each row's token mean",
    source="GRPO (Shao et al. 2024); verl agg_loss",
)
def seq_mean_token_mean(loss: torch.Tensor, mask: torch.Tensor, params: AggParams):
    """loss, mask (B,T) -> (). Every row weighs the same, whatever its length."""
    tokens = mask.bool().sum(1).to(loss.dtype)  # (B,)
    row = masked_sum(loss, mask, dim=1) / tokens.clamp(min=1)  # (B,) 0 for empty rows
    return row.sum() / _denominator((tokens > 0).sum().to(loss.dtype), params.num_seqs)


@AGGREGATION.register("seq-mean-token-sum", doc="mean over rows of each row's token sum", source="verl agg_loss")
def seq_mean_token_sum(loss: torch.Tensor, mask: torch.Tensor, params: AggParams):
    """loss, mask (B,T) -> (). Longer rows weigh more."""
    tokens = mask.bool().sum(1)
    return masked_sum(loss, mask) / _denominator((tokens > 0).sum().to(loss.dtype), params.num_seqs)


@AGGREGATION.register(
    "seq-mean-token-sum-norm",
    doc="sum(L*M) / (B * agg_len), agg_len a fixed config length (Dr.GRPO)",
    source="Dr.GRPO (Liu et al. 2025); TRL loss_type=dr_grpo",
)
def seq_mean_token_sum_norm(loss: torch.Tensor, mask: torch.Tensor, params: AggParams):
    """loss, mask (B,T) -> (). Divides by B * agg_len as TRL does (B = non-empty rows);
    verl divides by agg_len only, a constant factor B apart. Never the batch's own max."""
    rows = (mask.bool().sum(1) > 0).sum().to(loss.dtype)
    return masked_sum(loss, mask) / (_denominator(rows, params.num_seqs) * params.agg_len)
