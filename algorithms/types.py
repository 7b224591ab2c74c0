"""The fixed inputs, parameters, outputs and call signatures of every axis.

Inputs and outputs are plain dataclasses of tensors; each axis's signature is a Protocol that its
registry is typed with (`Registry[PolicyLossFn]`, ...). Math of every value: docs/algorithms.md.

The params dataclasses are the typed seam between the run config and the axis functions. Every
field is required and carries the name of the config key it comes from (`ClipParams.eps_low` <-
`algo.clip.eps_low`; `AggParams`' counts are the only fields that are not config keys). Their
defaults, bounds and documentation are declared once, in the config sections
(`harness.config.algo`), which build these dataclasses (`ClipConfig.params`, ...); a caller of the
functions directly (a unit test) passes every field. Numerical constants that are no config key
stay with the code that uses them (`algorithms.utils.STD_EPS`, `policy_loss.LOG_RATIO_CLAMP`, ...).

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
    """`algo.adv.*`. gamma, lam: token-level discount and GAE lambda (gae, reinforce_pp).
    gigpo_gamma: turn-level discount of GiGPO step returns. gigpo_step_weight: omega in
    A = A^E + omega A^S (GiGPO). gigpo_mode: "mean_norm" or "mean_std_norm", applied to both
    levels as verl-agent does. gigpo_episode_stats: "trajectories" (one sample per trajectory)
    or "steps" (one sample per turn, longer episodes weigh more)."""

    gamma: float
    lam: float
    gigpo_gamma: float
    gigpo_step_weight: float
    gigpo_mode: str
    gigpo_episode_stats: str


@dataclass
class AdvantageOutput:
    """advantages (N,T), 0 outside the mask; returns (N,T) for the critic / logging, or None."""

    advantages: torch.Tensor
    returns: torch.Tensor | None = None


# ------------------------------------------------------------------ policy loss (docs/algorithms.md#clipping)
@dataclass(frozen=True)
class ClipParams:
    """`algo.clip.*`. eps_low / eps_high: clip range [1-eps_low, 1+eps_high] (eps_high > eps_low
    = DAPO clip-higher). dual_c: dual-clip bound c for A < 0, None = off.
    tau_pos / tau_neg: SAPO gate temperatures for A > 0 / A <= 0."""

    eps_low: float
    eps_high: float
    dual_c: float | None
    tau_pos: float
    tau_neg: float


# ------------------------------------------------------------ off-policy corrections (docs/algorithms.md#off-policy)
@dataclass(frozen=True)
class CorrectionParams:
    """`algo.correction.*`. c: the truncation cap C of tis_token / tis_seq (None =
    `correction.TIS_CAP`) and the rejection cap of decoupled (None = no cap). lo / hi: the band of
    mis_token, mis_seq, icepop and geo_seq_mask (None = that correction's `correction.BANDS`)."""

    c: float | None
    lo: float | None
    hi: float | None


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
    call's own; `aggregation.global_counts`). agg_len: `algo.agg_len`, the fixed length T_const
    of seq-mean-token-sum-norm."""

    num_tokens: float | None
    num_seqs: float | None
    agg_len: int


# ------------------------------------------------------------------ filters (docs/algorithms.md#filtering)
@dataclass(frozen=True)
class FilterParams:
    """`algo.filter.*`. top_p: ragen_top_p cumulative-score fraction. top_k: ragen_top_k fraction of
    groups kept."""

    top_p: float
    top_k: float


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
