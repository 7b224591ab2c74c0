"""`algo.adv.norm`: the scope advantages are normalised over (docs/algorithms.md#normalization).

Signature: `fn(advantages (N,T), inputs: AdvantageInputs, params: AdvantageParams)
-> advantages (N,T)`, applied after the estimator; 0 outside `inputs.mask` stays 0.
`env_std` rebuilds the advantage from the outcome rewards (ERPO's definition needs them), so
it only makes sense after an outcome estimator: see `check_norm_compatible`.
"""

from __future__ import annotations

import torch

from .advantage import broadcast, group_baseline
from .registry import Registry
from .types import AdvantageInputs, AdvantageParams, NormFn
from .utils import STD_EPS, WHITEN_EPS, group_stats, masked_whiten

ADV_NORM: Registry[NormFn] = Registry("algo.adv.norm", "normalization scope of the advantages")

# env_std replaces (R - group mean) / group std by (R - group mean) / env std: the same
# numerator as these estimators, so it is ERPO whichever of them a sweep holds fixed.
ENV_STD_ESTIMATORS = ("grpo", "dr_grpo")


def check_norm_compatible(estimator: str, norm: str) -> None:
    """Raise ValueError for an (adv.estimator, adv.norm) pair that has no meaning."""
    if norm == "env_std" and estimator not in ENV_STD_ESTIMATORS:
        raise ValueError(
            f"algo.adv.norm env_std rebuilds (R - group mean) / env std and only "
            f"combines with algo.adv.estimator in {list(ENV_STD_ESTIMATORS)}, "
            f"not {estimator!r}"
        )


@ADV_NORM.register("group", doc="identity: the estimator's own (group) normalisation", source="GRPO (Shao et al. 2024)")
def group_norm(advantages, inputs: AdvantageInputs, params: AdvantageParams):
    """Returns `advantages (N,T)` unchanged."""
    return advantages


@ADV_NORM.register(
    "batch", doc="whiten all trained-token advantages of the batch", source="REINFORCE++ (Hu 2025); verl masked_whiten"
)
@torch.no_grad()
def batch_norm(advantages, inputs: AdvantageInputs, params: AdvantageParams):
    """(A - mean) * rsqrt(var + eps) over every trained token of the batch. (N,T)."""
    return masked_whiten(advantages, inputs.mask)


@ADV_NORM.register(
    "task", doc="re-standardize trained-token advantages per task id", source="AgentRL (task advantage normalization)"
)
@torch.no_grad()
def task_norm(advantages, inputs: AdvantageInputs, params: AdvantageParams):
    """Per task id: (A - mean) * rsqrt(var + eps) over its trained tokens (unbiased var,
    as `batch`; a task with a single trained token gets 0). (N,T)."""
    if inputs.task is None:
        raise ValueError("algo.adv.norm task needs task ids (inputs.task)")
    m = inputs.mask.bool()
    tid = inputs.task[:, None].expand_as(m)[m]  # (M,) task of each trained token
    x = advantages[m]
    mean, std, cnt = group_stats(x, tid)
    var = torch.where(cnt > 1, std**2, 0.0)
    out = torch.zeros_like(advantages)
    return out.masked_scatter(m, (x - mean) * torch.rsqrt(var + WHITEN_EPS))


@ADV_NORM.register("env_std", doc="(R - group mean) / std of R over the env's trajectories", source="AutoForge ERPO")
@torch.no_grad()
def env_std_norm(advantages, inputs: AdvantageInputs, params: AdvantageParams):
    """A_i = (R_i - mean_g R) / (std_{env(i)} R + eps), std (n - 1) over the valid (>= 1
    trained token) trajectories of env(i); singleton env: std 1. Ignores `advantages`."""
    if inputs.env is None:
        raise ValueError("algo.adv.norm env_std needs env ids (inputs.env)")
    R = inputs.rewards.float()
    valid = inputs.mask.bool().any(1)  # (N,)
    mean, _, _ = group_baseline(R, inputs.group)
    _, std, cnt = group_stats(R, inputs.env, weight=valid)
    std = torch.where(cnt > 1, std, 1.0)
    return broadcast((R - mean) / (std + STD_EPS), inputs.mask)
