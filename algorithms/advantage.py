"""`algo.adv.estimator`: advantage estimators (docs/algorithms.md#advantages).

Signature: `fn(inputs: AdvantageInputs, params: AdvantageParams) -> AdvantageOutput` with
`advantages (N,T)` exactly 0 outside `inputs.mask`. Advantages are computed without grad.
Singleton groups follow verl: baseline mean 0 and std 1, so their advantage is the raw reward.
GiGPO lives in `gigpo.py` and registers into the same `ADVANTAGE` registry.
"""

from __future__ import annotations

import torch

from .registry import Registry
from .types import AdvantageFn, AdvantageInputs, AdvantageOutput, AdvantageParams
from .utils import STD_EPS, group_stats, masked_sum, masked_whiten, turn_rewards_to_tokens

ADVANTAGE: Registry[AdvantageFn] = Registry("algo.adv.estimator", "advantage estimator")

# Estimators that return the value targets (returns) a critic is fitted on.
CRITIC_ESTIMATORS = ("gae", "reinforce_pp")


def broadcast(a: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Trajectory-level `a (N,)` onto every trained token -> (N,T), 0 elsewhere."""
    a = a if a.is_floating_point() else a.float()
    return torch.where(mask.bool(), a[:, None], 0.0)


def group_baseline(rewards: torch.Tensor, group: torch.Tensor, weight=None):
    """(mean, std, count), each (N,), of `rewards` within the group; singletons: mean 0, std 1."""
    mean, std, cnt = group_stats(rewards, group, weight)
    single = cnt <= 1
    return torch.where(single, 0.0, mean), torch.where(single, 1.0, std), cnt


def token_rewards(inputs: AdvantageInputs) -> torch.Tensor:
    """Per-token rewards (N,T): `inputs.token_rewards`, else the turn rewards on the last
    trained token of each turn, else the outcome R_i on the last trained token of the row."""
    if inputs.token_rewards is not None:
        return inputs.token_rewards.float()
    if inputs.turn_rewards is not None:
        return turn_rewards_to_tokens(inputs.turn_rewards.float(), inputs.turn_index, inputs.mask)
    N, T = inputs.mask.shape
    idx = torch.arange(T, device=inputs.mask.device).expand(N, T)
    pos = torch.where(inputs.mask.bool(), idx, -1).amax(1)  # (N,) last trained token
    out = torch.zeros(N, T, device=inputs.mask.device)
    src = torch.where(pos >= 0, inputs.rewards.float(), 0.0)[:, None]
    return out.scatter_add_(1, pos.clamp(min=0)[:, None], src)


def discounted_chain(rewards, values, mask, gamma: float, lam: float):
    """GAE along the trained tokens of each row; untrained tokens are skipped, so their
    rewards and values (even NaN) never enter. All (N,T); returns advantages (0 off-mask).

    delta_k = r_k + gamma V_k' - V_k, k' the next trained token (V = 0 after the last one);
    A_k = delta_k + gamma lam A_k'. With values = 0 and lam = 1 this is the discounted return.
    """
    N, T = rewards.shape
    m = mask.bool()
    adv = torch.zeros_like(rewards)
    next_v = torch.zeros_like(rewards[:, 0])
    next_a = torch.zeros_like(rewards[:, 0])
    for t in reversed(range(T)):
        a = rewards[:, t] + gamma * next_v - values[:, t] + gamma * lam * next_a
        mt = m[:, t]
        next_a = torch.where(mt, a, next_a)
        next_v = torch.where(mt, values[:, t], next_v)
        adv[:, t] = torch.where(mt, a, 0.0)
    return adv


@ADVANTAGE.register(
    "grpo",
    doc="(R - group mean) / (group unbiased std + eps)",
    source="GRPO (Shao et al. 2024); verl core_algos.py, TRL",
)
@torch.no_grad()
def grpo(inputs: AdvantageInputs, params: AdvantageParams) -> AdvantageOutput:
    """A_i = (R_i - mean_g R) / (std_g R + eps), std with n - 1, broadcast -> (N,T)."""
    R = inputs.rewards.float()
    mean, std, _ = group_baseline(R, inputs.group)
    return AdvantageOutput(broadcast((R - mean) / (std + STD_EPS), inputs.mask))


@ADVANTAGE.register("dr_grpo", doc="R - group mean (no std division)", source="Dr.GRPO (Liu et al. 2025)")
@torch.no_grad()
def dr_grpo(inputs: AdvantageInputs, params: AdvantageParams) -> AdvantageOutput:
    """A_i = R_i - mean_g R, broadcast -> (N,T)."""
    R = inputs.rewards.float()
    mean, _, _ = group_baseline(R, inputs.group)
    return AdvantageOutput(broadcast(R - mean, inputs.mask))


@ADVANTAGE.register(
    "rloo",
    doc="R - mean of the other G-1 rewards of the group",
    source="RLOO (Ahmadian et al. 2024); verl core_algos.py",
)
@torch.no_grad()
def rloo(inputs: AdvantageInputs, params: AdvantageParams) -> AdvantageOutput:
    """A_i = R_i - (sum_{j != i} R_j) / (G - 1), broadcast -> (N,T); singletons: R_i."""
    R = inputs.rewards.float()
    mean, _, cnt = group_stats(R, inputs.group)
    loo = (mean * cnt - R) / (cnt - 1).clamp(min=1)
    return AdvantageOutput(broadcast(torch.where(cnt > 1, R - loo, R), inputs.mask))


@ADVANTAGE.register(
    "reinforce_pp",
    doc="discounted token returns (KL-in-reward by caller), whitened over batch",
    source="REINFORCE++ (Hu 2025); verl core_algos.py",
)
@torch.no_grad()
def reinforce_pp(inputs: AdvantageInputs, params: AdvantageParams) -> AdvantageOutput:
    """G_k = sum over later trained tokens of gamma^l r; A = masked_whiten(G). (N,T).

    verl resets the running return at every untrained token, which in a concatenated
    multi-turn row would cut the return at each observation; here observations are skipped.
    """
    r = token_rewards(inputs)
    ret = discounted_chain(r, torch.zeros_like(r), inputs.mask, params.gamma, 1.0)
    adv = masked_whiten(ret, inputs.mask)
    return AdvantageOutput(adv, ret)


@ADVANTAGE.register(
    "reinforce_pp_baseline",
    doc="summed token rewards minus group mean, whitened over the batch",
    source="REINFORCE++-baseline (Hu 2025); verl core_algos.py",
)
@torch.no_grad()
def reinforce_pp_baseline(inputs: AdvantageInputs, params: AdvantageParams) -> AdvantageOutput:
    """score_i = sum_k r_{i,k} (trained tokens); A = masked_whiten(score_i - mean_g). (N,T)."""
    score = masked_sum(token_rewards(inputs), inputs.mask, dim=1)  # (N,)
    mean, _, _ = group_baseline(score, inputs.group)
    adv = masked_whiten(broadcast(score - mean, inputs.mask), inputs.mask)
    return AdvantageOutput(adv)


@ADVANTAGE.register(
    "gae",
    doc="GAE over action tokens with a critic; observations skipped",
    source="PPO (Schulman et al. 2017); GAE (Schulman et al. 2016); verl",
)
@torch.no_grad()
def gae(inputs: AdvantageInputs, params: AdvantageParams) -> AdvantageOutput:
    """GAE(gamma, lam) along trained tokens; returns = A + V on trained tokens. (N,T).

    Not whitened here (verl whitens inside its GAE): whitening is `algo.adv.norm: batch`,
    which the ppo preset sets. V after the last trained token is 0 (episode end).
    """
    if inputs.values is None:
        raise ValueError("algo.adv.estimator gae needs critic values (inputs.values)")
    r = token_rewards(inputs)
    v = inputs.values.float()
    adv = discounted_chain(r, v, inputs.mask, params.gamma, params.lam)
    returns = torch.where(inputs.mask.bool(), adv + v, 0.0)
    return AdvantageOutput(adv, returns)
