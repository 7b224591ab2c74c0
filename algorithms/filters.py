"""`algo.filter.name`: dynamic filtering of rollout groups before the update (docs/algorithms.md#filtering).

Signature: `fn(rewards (N,), group (N,), params: FilterParams) -> FilterResult` with
`keep (N,)` bool over trajectories (a group is kept or dropped whole) and 0-dim stats
(kept_group_frac, kept_traj_frac, zero_var_frac, num_groups). Nothing kept raises
`EmptyBatchError` (stats attached): an empty selection is never returned silently.
Score = in-group unbiased reward std; a group whose rewards are all equal (or a singleton)
has score 0 and counts as zero-variance.
"""

from __future__ import annotations

import torch

from .registry import Registry
from .types import EmptyBatchError, FilterFn, FilterParams, FilterResult
from .utils import dense_ids, group_stats

GROUP_FILTER: Registry[FilterFn] = Registry("algo.filter.name", "dynamic filtering of rollout groups")


def group_scores(rewards: torch.Tensor, group: torch.Tensor):
    """(inv (N,) dense group index, score (G,) in-group std, zero_var (G,) bool)."""
    R = rewards.float()
    inv, n = dense_ids(group)
    hi = torch.full((n,), -torch.inf, device=R.device).scatter_reduce(0, inv, R, "amax")
    lo = torch.full((n,), torch.inf, device=R.device).scatter_reduce(0, inv, R, "amin")
    zero_var = hi == lo  # exact, unlike a float std
    _, std, _ = group_stats(R, inv)
    score = torch.zeros(n, device=R.device).scatter(0, inv, torch.nan_to_num(std, nan=0.0))
    return inv, torch.where(zero_var, 0.0, score), zero_var


def _result(name: str, keep_group: torch.Tensor, inv: torch.Tensor, zero_var: torch.Tensor) -> FilterResult:
    keep = keep_group[inv]  # (N,)
    n = max(keep_group.numel(), 1)
    stats = {
        "kept_group_frac": keep_group.sum() / n,
        "kept_traj_frac": keep.float().sum() / max(keep.numel(), 1),
        "zero_var_frac": zero_var.sum() / n,
        "num_groups": torch.tensor(float(keep_group.numel())),
    }
    if not bool(keep.any()):
        raise EmptyBatchError(
            f"algo.filter.name {name}: no group kept out of {keep_group.numel()} "
            f"({int(zero_var.sum())} with zero reward variance); skip or resample this "
            f"update",
            stats,
        )
    return FilterResult(keep, stats)


@GROUP_FILTER.register("none", doc="keep every group", source="baseline (no filtering)")
def no_filter(rewards, group, params: FilterParams) -> FilterResult:
    """Keep all trajectories (stats still reported)."""
    inv, _, zero_var = group_scores(rewards, group)
    return _result("none", torch.ones_like(zero_var), inv, zero_var)


@GROUP_FILTER.register(
    "dapo",
    doc="drop groups whose rewards are all equal; refills the batch only with algo.filter.max_extra_rounds > 0",
    source="DAPO dynamic sampling (Yu et al. 2025)",
)
def dapo(rewards, group, params: FilterParams) -> FilterResult:
    """Keep groups with nonzero reward variance. Resampling to refill is the trainer's."""
    inv, _, zero_var = group_scores(rewards, group)
    return _result("dapo", ~zero_var, inv, zero_var)


def _order(score: torch.Tensor) -> torch.Tensor:
    return torch.argsort(score, descending=True, stable=True)  # ties: first group first


@GROUP_FILTER.register(
    "ragen_top_p",
    doc="shortest top-std prefix holding >= top_p of the total std score",
    source="RAGEN-2 / StarPO-S (Wang et al. 2025)",
)
def ragen_top_p(rewards, group, params: FilterParams) -> FilterResult:
    """Sort groups by score desc; keep the shortest prefix with cumsum >= p * total;
    groups with score 0 are never kept."""
    inv, score, zero_var = group_scores(rewards, group)
    order = _order(score)
    cs = torch.cumsum(score[order], 0)
    total = cs[-1] if cs.numel() else cs.sum()
    n_keep = int((cs < params.top_p * total).sum()) + 1  # cs[-1] == total: p = 1 keeps all
    keep = torch.zeros_like(zero_var)
    keep[order[:n_keep]] = True
    return _result("ragen_top_p", keep & (score > 0), inv, zero_var)


@GROUP_FILTER.register(
    "ragen_top_k",
    doc="keep the top fraction top_k of groups by std score",
    source="RAGEN (Wang et al. 2025) rollout_filter_ratio",
)
def ragen_top_k(rewards, group, params: FilterParams) -> FilterResult:
    """Keep max(1, floor(k * G)) highest-score groups (RAGEN's int(ratio * G)); as in RAGEN
    a zero-score group is kept when it ranks inside the top k."""
    inv, score, zero_var = group_scores(rewards, group)
    n_keep = max(1, int(params.top_k * score.numel() + 1e-9))
    keep = torch.zeros_like(zero_var)
    keep[_order(score)[:n_keep]] = True
    return _result("ragen_top_k", keep, inv, zero_var)
