"""Masked reductions and id-grouped statistics shared by the axes (torch only).

Structure (groups, turn-actions, trajectories, turns) is passed as integer id tensors; these
helpers turn ids into per-member statistics with `torch.unique` + `index_add`, never a Python
loop over items. `torch.where` (not multiplication) keeps NaN/inf at masked positions out.
"""

from __future__ import annotations

import torch

STD_EPS = 1e-6  # added to a group's std before dividing by it (grpo, gigpo, env_std; verl / TRL)
WHITEN_EPS = 1e-8  # inside rsqrt(var + eps) of whitening (verl masked_whiten)


def masked_sum(x: torch.Tensor, mask: torch.Tensor, dim=None) -> torch.Tensor:
    """Sum of `x` where `mask` is nonzero; masked-out values (even NaN) never enter."""
    x = torch.where(mask.bool(), x, torch.zeros_like(x))
    return x.sum() if dim is None else x.sum(dim)


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim=None) -> torch.Tensor:
    """Mean of `x` over positions where `mask` is nonzero (0 where the mask is empty)."""
    count = mask.bool().sum() if dim is None else mask.bool().sum(dim)
    return masked_sum(x, mask, dim) / count.clamp(min=1).to(x.dtype)


def masked_var(x: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance of `x` over masked positions; Bessel-corrected like verl's `masked_var`."""
    mean = masked_mean(x, mask)
    var = masked_mean((x - mean) ** 2, mask)
    if not unbiased:
        return var
    n = mask.bool().sum().to(x.dtype)
    return torch.where(n > 1, var * n / (n - 1).clamp(min=1), var)


def masked_whiten(
    x: torch.Tensor, mask: torch.Tensor, eps: float = WHITEN_EPS, shift_mean: bool = True
) -> torch.Tensor:
    """`(x - mean) / sqrt(var + eps)` over masked positions (any shape); 0 outside the mask.

    verl's convention: unbiased variance, `rsqrt(var + 1e-8)`.
    """
    mean, var = masked_mean(x, mask), masked_var(x, mask)
    out = (x - mean) * torch.rsqrt(var + eps) if shift_mean else x * torch.rsqrt(var + eps)
    return torch.where(mask.bool(), out, torch.zeros_like(out))


def dense_ids(ids: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Map arbitrary integer ids (any shape) to 0..n-1; returns (inverse, n)."""
    if ids.numel() == 0:
        return ids.long(), 0
    uniq, inv = torch.unique(ids, return_inverse=True)
    return inv, uniq.numel()


def group_stats(x: torch.Tensor, group: torch.Tensor, weight: torch.Tensor | None = None):
    """Per-member mean, unbiased std and count of `x (N,)` within its `group (N,)`.

    `weight (N,)` counts member `i` `weight[i]` times (GiGPO cross-step statistics). Groups
    with count <= 1 get std NaN; callers decide what a singleton means. Returns three (N,).
    """
    inv, n = dense_ids(group)
    w = torch.ones_like(x) if weight is None else weight.to(x.dtype)
    cnt = torch.zeros(n, dtype=x.dtype, device=x.device).index_add_(0, inv, w)
    mean = torch.zeros_like(cnt).index_add_(0, inv, w * x) / cnt.clamp(min=1e-12)
    sq = torch.zeros_like(cnt).index_add_(0, inv, w * (x - mean[inv]) ** 2)
    std = torch.where(cnt > 1, (sq / (cnt - 1).clamp(min=1e-12)).sqrt(), torch.nan)
    return mean[inv], std[inv], cnt[inv]


def segment_mean(x: torch.Tensor, seg: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of `x (B,T)` over the masked tokens of each segment id in `seg (B,T)`.

    Segments may span rows (a trajectory in the per-step layout). Returns (B,T): the segment
    mean broadcast to each masked token, 0 elsewhere. Differentiable in `x`.
    """
    valid = mask.bool()
    inv, n = dense_ids(seg[valid])  # (M,)
    xv = x[valid]
    sums = torch.zeros(n, dtype=x.dtype, device=x.device).index_add(0, inv, xv)
    cnt = torch.zeros(n, dtype=x.dtype, device=x.device).index_add_(0, inv, torch.ones_like(xv))
    out = torch.zeros_like(x)
    return out.masked_scatter(valid, (sums / cnt)[inv])


def turn_rewards_to_tokens(turn_rewards: torch.Tensor, turn_index: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Place `turn_rewards (N,K)` on the last trained token of each turn -> (N,T).

    Token `k` belongs to turn `turn_index[i,k]` (-1: none). A turn without trained tokens
    contributes nothing.
    """
    N, T = mask.shape
    K = turn_rewards.shape[1]
    valid = mask.bool() & (turn_index >= 0)
    col = torch.where(valid, turn_index, torch.full_like(turn_index, K)).long()  # K = dummy
    pos = torch.arange(T, device=mask.device).expand(N, T)
    last = torch.full((N, K + 1), -1, dtype=torch.long, device=mask.device)
    last = last.scatter_reduce(1, col, pos, reduce="amax")[:, :K]  # (N,K)
    has = last >= 0
    out = torch.zeros(N, T, dtype=turn_rewards.dtype, device=turn_rewards.device)
    src = torch.where(has, turn_rewards, torch.zeros_like(turn_rewards))
    return out.scatter_add_(1, last.clamp(min=0), src)


def outcome_turn_rewards(
    rewards: torch.Tensor, turn_mask: torch.Tensor, process: torch.Tensor | None = None
) -> torch.Tensor:
    """Per-turn rewards (N,K): optional `process (N,K)` plus outcome `rewards (N,)` on the
    last valid turn of each trajectory (docs/algorithms.md#advantages: "outcome reward counted at the last turn")."""
    N, K = turn_mask.shape
    tm = turn_mask.bool()
    base = (
        torch.zeros(N, K, dtype=rewards.dtype, device=rewards.device)
        if process is None
        else torch.where(tm, process.to(rewards.dtype), torch.zeros_like(process, dtype=rewards.dtype))
    )
    idx = torch.arange(K, device=turn_mask.device).expand(N, K)
    last = torch.where(tm, idx, torch.full_like(idx, -1)).amax(1)  # (N,)
    has = (last >= 0).to(rewards.dtype)
    return base.scatter_add(1, last.clamp(min=0)[:, None], (rewards * has)[:, None])
