"""The fixed inputs, parameters, outputs and call signatures of every axis.

Inputs and outputs are plain dataclasses of tensors; each axis's signature is a Protocol that its
registry is typed with (`Registry[PolicyLossFn]`, ...). A params field carries the name of the
config key it comes from (`ClipParams.eps_low` <- `algo.clip.eps_low`), so the trainer builds
params from config sections by name. Math of every value: docs/algorithms.md.

Shapes: `N` trajectories in concatenated token form, `T` tokens, `K` turns (padded);
`B` training rows (one per trajectory or one per turn, depending on the layout).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import torch


class EmptyBatchError(RuntimeError):
    """A group filter kept nothing (e.g. every group has zero reward variance).

    The trainer catches it, logs `stats` and skips the update (or samples more groups).
    """

    def __init__(self, message: str, stats: dict[str, torch.Tensor] | None = None):
        super().__init__(message)
        self.stats = stats or {}


# ------------------------------------------------------------------ advantages (docs/algorithms.md#advantages)
@dataclass
class AdvantageInputs:
    """What every advantage estimator and normalization scope reads.

    mask (N,T): 1 on trained tokens. turn_index (N,T) int: the turn each token belongs to,
        -1 on untrained / non-action tokens.
    rewards (N,): outcome reward R_i (grpo, dr_grpo, rloo, gigpo episode level, env_std).
    turn_rewards (N,K), turn_mask (N,K): per-turn rewards r_{i,t}, outcome INCLUDED at the last
        turn (see `utils.outcome_turn_rewards`), so sum_t r_{i,t} is the undiscounted return.
    group (N,), task (N,), env (N,) int: rollout group, task id (adv.norm task), env id
        (adv.norm env_std). anchor (N,K) int: environment-state id before each turn (GiGPO).
    values (N,T): critic values (gae). token_rewards (N,T): per-token rewards for gae /
        reinforce_pp with any KL-in-reward already subtracted by the caller; when None they
        are `turn_rewards` placed on the last trained token of each turn.
    """

    mask: torch.Tensor
    turn_index: torch.Tensor
    rewards: torch.Tensor
    group: torch.Tensor
    turn_rewards: torch.Tensor | None = None
    turn_mask: torch.Tensor | None = None
    task: torch.Tensor | None = None
    env: torch.Tensor | None = None
    anchor: torch.Tensor | None = None
    values: torch.Tensor | None = None
    token_rewards: torch.Tensor | None = None


@dataclass(frozen=True)
class AdvantageParams:
    """gamma, lam: token-level discount and GAE lambda (gae, reinforce_pp; Practitioner's
    Guide best gamma = 1). eps: added to group std (grpo, verl/TRL 1e-6).
    gigpo_gamma: turn-level discount of GiGPO step returns (verl-agent scripts 0.95).
    gigpo_step_weight: omega in A = A^E + omega A^S (GiGPO, 1.0). gigpo_mode: "mean_norm"
    (verl-agent code default) or "mean_std_norm" (paper), applied to both levels as
    verl-agent does.
    gigpo_episode_stats: "trajectories" (paper: one sample per trajectory, default) or "steps"
    (verl-agent compute_mean_std_cross_steps: one sample per turn, longer episodes weigh more).
    whiten_eps: eps inside rsqrt(var + eps) for batch whitening (verl 1e-8).
    """

    gamma: float = 1.0
    lam: float = 1.0
    eps: float = 1e-6
    gigpo_gamma: float = 0.95
    gigpo_step_weight: float = 1.0
    gigpo_mode: str = "mean_norm"
    gigpo_episode_stats: str = "trajectories"
    whiten_eps: float = 1e-8


@dataclass
class AdvantageOutput:
    """advantages (N,T), 0 outside the mask; returns (N,T) for the critic / logging, or None."""

    advantages: torch.Tensor
    returns: torch.Tensor | None = None


# ------------------------------------------------------------------ policy loss (docs/algorithms.md#clipping)
@dataclass(frozen=True)
class ClipParams:
    """eps_low / eps_high: clip range [1-eps_low, 1+eps_high] (eps_high > eps_low = DAPO
    clip-higher). dual_c: dual-clip bound c > 1 for A < 0, None = off (verl uses 3).
    log_ratio_clamp: |logp - old_logp| clamped before exp (verl 20).
    tau_pos / tau_neg: SAPO gate temperatures for A > 0 / A <= 0 (Qwen, verl and TRL: 1.0 / 1.05)."""

    eps_low: float = 0.2
    eps_high: float = 0.2
    dual_c: float | None = None
    log_ratio_clamp: float = 20.0
    tau_pos: float = 1.0
    tau_neg: float = 1.05

    def __post_init__(self):
        if self.eps_low < 0 or self.eps_high < 0:
            raise ValueError(f"clip eps must be >= 0, got {self.eps_low}, {self.eps_high}")
        if self.dual_c is not None and self.dual_c <= 1.0:
            raise ValueError(f"algo.clip.dual_c (dual clip) must be > 1, got {self.dual_c}")
        if self.tau_pos <= 0 or self.tau_neg <= 0:
            raise ValueError(f"SAPO temperatures must be > 0, got {self.tau_pos}, {self.tau_neg}")


# ------------------------------------------------------------ off-policy corrections (docs/algorithms.md#off-policy)
@dataclass(frozen=True)
class CorrectionParams:
    """c: the truncation cap C of tis_token / tis_seq (None = 2, verl) and the rejection cap of
    decoupled (None = no cap, AReaL's default). lo / hi: the band of mis_token, mis_seq, icepop and
    geo_seq_mask (None = that correction's default). log_ratio_clamp: |old_logp - rollout_logp|
    (and its sequence sum) clamped before exp (verl 20)."""

    c: float | None = None
    lo: float | None = None
    hi: float | None = None
    log_ratio_clamp: float = 20.0


@dataclass
class CorrectionOutput:
    """weight (B,T) or None (= 1): a detached factor on each token's policy loss.
    reject (B,T) bool or None (= nothing rejected): tokens a rejection correction drops; whether
    they leave the loss denominators or only get weight 0 is the caller's choice
    (`algo.correction.rejected`)."""

    weight: torch.Tensor | None = None
    reject: torch.Tensor | None = None


# ------------------------------------------------------------------ aggregation (docs/algorithms.md#aggregation)
@dataclass(frozen=True)
class AggParams:
    """Global denominators for micro-batching: num_tokens = trained tokens, num_seqs = rows
    with at least one trained token, both counted over the WHOLE mini-batch (None = this
    call's own). agg_len: the fixed length T_const of seq-mean-token-sum-norm (required there)."""

    num_tokens: float | None = None
    num_seqs: float | None = None
    agg_len: int | None = None


# ------------------------------------------------------------------ filters (docs/algorithms.md#filtering)
@dataclass(frozen=True)
class FilterParams:
    """top_p: ragen_top_p cumulative-score fraction (RAGEN-2 0.9). top_k: ragen_top_k
    fraction of groups kept."""

    top_p: float = 0.9
    top_k: float = 0.5


@dataclass
class FilterResult:
    """keep (N,) bool over trajectories (whole groups kept or dropped); stats of 0-dim
    tensors: kept_group_frac, kept_traj_frac, zero_var_frac, num_groups."""

    keep: torch.Tensor
    stats: dict[str, torch.Tensor] = field(default_factory=dict)


# ------------------------------------------------------------------ axis signatures
class PolicyLossFn(Protocol):
    """`algo.clip.level`: per-token loss (B,T), 0 outside the mask, and detached 0-dim stats.
    action_id / traj_id (B,T) int: the turn-action / trajectory of each token."""

    def __call__(
        self,
        logp: torch.Tensor,
        old_logp: torch.Tensor,
        advantages: torch.Tensor,
        mask: torch.Tensor,
        action_id: torch.Tensor,
        traj_id: torch.Tensor,
        params: ClipParams,
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]: ...


class CorrectionFn(Protocol):
    """`algo.correction.name`: from the sampler's (`rollout_logp`) and the behaviour log-probs
    (`old_logp`), both (B,T), the weight and rejection of every token. mask (B,T): the sampled
    (action) tokens the correction reads; seq_id (B,T) int: the sequence each token belongs to
    (trajectory or turn-action), used by the sequence-level corrections."""

    def __call__(
        self,
        rollout_logp: torch.Tensor,
        old_logp: torch.Tensor,
        mask: torch.Tensor,
        seq_id: torch.Tensor,
        params: CorrectionParams,
    ) -> CorrectionOutput: ...


class AggregationFn(Protocol):
    """`algo.agg`: per-token loss (B,T) and mask (B,T) -> scalar."""

    def __call__(self, loss: torch.Tensor, mask: torch.Tensor, params: AggParams) -> torch.Tensor: ...


class AdvantageFn(Protocol):
    """`algo.adv.estimator`: advantages (N,T) on the trajectory token stream (+ returns)."""

    def __call__(self, inputs: AdvantageInputs, params: AdvantageParams) -> AdvantageOutput: ...


class NormFn(Protocol):
    """`algo.adv.norm`: the estimator's advantages (N,T) re-normalised over a scope."""

    def __call__(self, advantages: torch.Tensor, inputs: AdvantageInputs, params: AdvantageParams) -> torch.Tensor: ...


class FilterFn(Protocol):
    """`algo.filter.name`: rewards (N,), group ids (N,) -> which trajectories are kept."""

    def __call__(self, rewards: torch.Tensor, group: torch.Tensor, params: FilterParams) -> FilterResult: ...


class KLFn(Protocol):
    """`algo.kl.estimator`: per-token KL estimate (B,T) from current and reference log-probs."""

    def __call__(self, logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor: ...
