"""GiGPO (verl-agent, Feng et al. 2025): episode-level + anchor-state step-level advantages.

A_{i,k} = A^E_i + gigpo_step_weight * A^S_{i,t(k)} on every trained token k of turn t(k).
- A^E: the group's outcome rewards, normalised per `gigpo_mode`. Statistics over the
  group's trajectories by default (the paper); `gigpo_episode_stats="steps"` counts each trajectory
  once per valid turn as verl-agent's `compute_mean_std_cross_steps=True` does.
- A^S: step returns R_{i,t} = sum_{t'>=t} gigpo_gamma^{t'-t} r_{i,t'} (outcome included at
  the last turn, see AdvantageInputs), normalised within step groups = turns of the same
  rollout group with the same anchor state id. Singleton step groups get A^S = 0.
`gigpo_mode` applies to both levels as in verl-agent's code ("mean_norm" drops the std).
Trained tokens with turn_index -1 (observations under mask: off) get A^E only.
The gigpo_* settings come from `AdvantageParams`; their allowed values are checked when the
config loads (`algo.adv.gigpo_mode`, `algo.adv.gigpo_episode_stats`).
"""

from __future__ import annotations

import torch

from .advantage import ADVANTAGE, broadcast, discounted_chain, group_baseline
from .types import AdvantageInputs, AdvantageOutput, AdvantageParams
from .utils import STD_EPS, dense_ids, group_stats


def _check(inputs: AdvantageInputs) -> None:
    if inputs.anchor is None or inputs.turn_rewards is None or inputs.turn_mask is None:
        raise ValueError("algo.adv.estimator gigpo needs anchor, turn_rewards and turn_mask")


def episode_advantage(inputs: AdvantageInputs, params: AdvantageParams) -> torch.Tensor:
    """A^E (N,) from the outcome rewards of each rollout group."""
    R = inputs.rewards.float()
    weight = inputs.turn_mask.bool().sum(1) if params.gigpo_episode_stats == "steps" else None
    mean, std, _ = group_baseline(R, inputs.group, weight)
    a = R - mean
    return a / (std + STD_EPS) if params.gigpo_mode == "mean_std_norm" else a


def step_advantage(inputs: AdvantageInputs, params: AdvantageParams) -> torch.Tensor:
    """A^S (N,K) over anchor-state step groups; 0 on invalid turns and singleton groups."""
    tm = inputs.turn_mask.bool()  # (N,K)
    ret = discounted_chain(
        inputs.turn_rewards.float(), torch.zeros_like(tm, dtype=torch.float), tm, params.gigpo_gamma, 1.0
    )  # (N,K) step returns
    g_inv, _ = dense_ids(inputs.group)
    a_inv, n_anchor = dense_ids(inputs.anchor[tm])
    key = g_inv[:, None].expand_as(tm)[tm] * n_anchor + a_inv  # (M,) (group, anchor)
    x = ret[tm]
    mean, std, cnt = group_stats(x, key)
    a = x - mean
    if params.gigpo_mode == "mean_std_norm":
        a = a / (torch.where(cnt > 1, std, 1.0) + STD_EPS)
    out = torch.zeros_like(ret)
    return out.masked_scatter(tm, torch.where(cnt > 1, a, 0.0))


@ADVANTAGE.register(
    "gigpo",
    doc="episode group advantage + gigpo_step_weight * anchor-state step advantage",
    source="verl-agent GiGPO (Feng et al. 2025)",
)
@torch.no_grad()
def gigpo(inputs: AdvantageInputs, params: AdvantageParams) -> AdvantageOutput:
    """(N,T) advantages: A^E_i + w * A^S_{i, turn_index}; 0 outside the mask."""
    _check(inputs)
    a_ep = broadcast(episode_advantage(inputs, params), inputs.mask)  # (N,T)
    a_st = step_advantage(inputs, params)  # (N,K)
    ti = inputs.turn_index.long()
    on_turn = inputs.mask.bool() & (ti >= 0)
    step_tok = a_st.gather(1, ti.clamp(0, a_st.shape[1] - 1))  # (N,T)
    adv = a_ep + params.gigpo_step_weight * torch.where(on_turn, step_tok, 0.0)
    return AdvantageOutput(adv)
