"""`algo.correction.name`: correcting the sampler-trainer mismatch (docs/algorithms.md#off-policy).

Signature: `fn(rollout_logp, old_logp, mask, seq_id, params: CorrectionParams) -> CorrectionOutput`,
all (B,T). `rollout_logp` is the sampler's log-prob of each sampled token, `old_logp` the trainer's
recomputation of the behaviour policy; `delta = old_logp - rollout_logp` on the masked (sampled) tokens,
0 elsewhere, and `rho = exp(delta)` (log-ratios clamped to +-`LOG_RATIO_CLAMP` before exp, as
verl). A correction returns a detached weight on each token's policy loss and/or the tokens it
rejects. Sequence-level corrections give every position of a sequence (`seq_id`, -1 = none) that
sequence's weight or rejection, so trained observation tokens follow their sequence; token-level
ones leave unsampled positions at weight 1 (there is no sampler probability to correct).

A correction reads only `rollout_logp` and `old_logp`, both fixed for the whole update, so the
trainer computes it once over the batch, before any micro-batch: micro-batching cannot change it.
"""

from __future__ import annotations

import torch

from .registry import Registry
from .types import CorrectionFn, CorrectionOutput, CorrectionParams
from .utils import dense_ids

CORRECTION: Registry[CorrectionFn] = Registry(
    "algo.correction.name", "off-policy correction of the sampler-behaviour mismatch"
)

LOG_RATIO_CLAMP = 20.0  # |old_logp - rollout_logp| (and its sequence sum) clamped before exp (verl)
TIS_CAP = 2.0  # tis_token / tis_seq truncation C: verl rollout_is_threshold, TRL's first default, SkyRL
# default (lo, hi) band of each band correction: verl rollout_rs_threshold 2 with lower 1/2 (mis_*),
# OpenRLHF is_correction_threshold (icepop), SkyRL geometric mask (geo_seq_mask)
BANDS = {"mis_token": (0.5, 2.0), "mis_seq": (0.5, 2.0), "icepop": (0.5, 5.0), "geo_seq_mask": (0.99, 1.01)}
# corrections that reject tokens (algo.correction.rejected decides what a rejection does)
REJECTING = ("mis_token", "mis_seq", "geo_seq_mask", "decoupled")


def log_ratio(rollout_logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """delta = old_logp - rollout_logp (B,T) on masked tokens, exactly 0 elsewhere (unclamped)."""
    return torch.where(mask.bool(), old_logp - rollout_logp, torch.zeros_like(old_logp))


def band(name: str, params: CorrectionParams) -> tuple[float, float]:
    """The (lo, hi) band of a band correction: the configured bounds, else the correction's default."""
    lo, hi = BANDS[name]
    return (lo if params.lo is None else params.lo, hi if params.hi is None else params.hi)


def check_params(name: str, params: CorrectionParams) -> None:
    """ValueError naming the key when the params do not fit correction `name` (config load time)."""
    if name not in BANDS and (params.lo is not None or params.hi is not None):
        key = "algo.correction.lo" if params.lo is not None else "algo.correction.hi"
        raise ValueError(
            f"{key} is set, but correction {name!r} has no band; the band corrections are {', '.join(BANDS)}: "
            f"remove {key} or choose one of them"
        )
    if name in BANDS:
        lo, hi = band(name, params)
        if not lo <= 1.0 <= hi:
            raise ValueError(
                f"algo.correction band [lo, hi] = [{lo:g}, {hi:g}] of {name!r} must contain 1 (an on-policy token "
                f"has ratio 1 and is always kept): set algo.correction.lo <= 1 <= algo.correction.hi"
            )


def _rho(delta: torch.Tensor) -> torch.Tensor:
    return torch.exp(delta.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))


def _per_sequence(delta: torch.Tensor, mask: torch.Tensor, seq_id: torch.Tensor):
    """(sum of delta, count of masked tokens) over each sequence, broadcast to every position of it
    (B,T each); positions with seq_id -1 get (0, 0). Sequences may span rows."""
    valid = seq_id >= 0
    inv, n = dense_ids(seq_id[valid])
    m = mask.bool()[valid].to(delta.dtype)
    sums = torch.zeros(n, dtype=delta.dtype, device=delta.device).index_add(0, inv, delta[valid] * m)
    counts = torch.zeros(n, dtype=delta.dtype, device=delta.device).index_add(0, inv, m)
    total, count = torch.zeros_like(delta), torch.zeros_like(delta)
    total[valid], count[valid] = sums[inv], counts[inv]
    return total, count


def _token_weight(mask, value) -> torch.Tensor:
    """`value` on masked tokens, 1 elsewhere (detached)."""
    return torch.where(mask.bool(), value, torch.ones_like(value)).detach()


@CORRECTION.register(
    "none",
    doc="no correction: the sampler's log-probs are only logged (diag/mismatch_*)",
    source="baseline (verl metrics-only rollout correction)",
)
def no_correction(rollout_logp, old_logp, mask, seq_id, params: CorrectionParams) -> CorrectionOutput:
    """No weight, nothing rejected: the update ignores the sampler's log-probs."""
    return CorrectionOutput()


@CORRECTION.register(
    "tis_token",
    doc="token truncated IS: weight sg(min(rho_t, C)), C = algo.correction.c (default 2)",
    source="Yao et al. 2025 (off-policy RL blog); verl rollout_is=token; TRL; SkyRL",
)
def tis_token(rollout_logp, old_logp, mask, seq_id, params: CorrectionParams) -> CorrectionOutput:
    """weight (B,T) = min(rho_t, C) on sampled tokens, 1 elsewhere."""
    c = TIS_CAP if params.c is None else params.c
    rho = _rho(log_ratio(rollout_logp, old_logp, mask))
    return CorrectionOutput(weight=_token_weight(mask, rho.clamp(max=c)))


@CORRECTION.register(
    "tis_seq",
    doc="sequence truncated IS: weight min(exp(sum_t delta_t), C) on every token of the sequence (C default 2)",
    source="verl rollout_is=sequence",
)
def tis_seq(rollout_logp, old_logp, mask, seq_id, params: CorrectionParams) -> CorrectionOutput:
    """weight (B,T) = min(exp(sum of delta over the sequence), C) on every position of the sequence."""
    c = TIS_CAP if params.c is None else params.c
    total, _ = _per_sequence(log_ratio(rollout_logp, old_logp, mask), mask, seq_id)
    return CorrectionOutput(weight=_rho(total).clamp(max=c).detach())


@CORRECTION.register(
    "mis_token",
    doc="token rejection: drop tokens whose rho_t is outside [lo, hi] (default 0.5-2)",
    source="verl rollout_rs=token (compute_rollout_rejection_mask); TRL token_mask",
)
def mis_token(rollout_logp, old_logp, mask, seq_id, params: CorrectionParams) -> CorrectionOutput:
    """reject (B,T): sampled tokens with rho_t < lo or rho_t > hi."""
    lo, hi = band("mis_token", params)
    rho = _rho(log_ratio(rollout_logp, old_logp, mask))
    return CorrectionOutput(reject=mask.bool() & ((rho < lo) | (rho > hi)))


@CORRECTION.register(
    "mis_seq",
    doc="sequence rejection: drop sequences whose exp(sum_t delta_t) is outside [lo, hi] (default 0.5-2)",
    source="verl rollout_rs=sequence (preset seq_sum_k1 0.5-2); TRL sequence_mask",
)
def mis_seq(rollout_logp, old_logp, mask, seq_id, params: CorrectionParams) -> CorrectionOutput:
    """reject (B,T): every position of a sequence whose exp(sum of delta) is outside [lo, hi]."""
    lo, hi = band("mis_seq", params)
    total, _ = _per_sequence(log_ratio(rollout_logp, old_logp, mask), mask, seq_id)
    ratio = _rho(total)
    return CorrectionOutput(reject=(seq_id >= 0) & ((ratio < lo) | (ratio > hi)))


@CORRECTION.register(
    "icepop",
    doc="IcePop: weight sg(M(rho_t)), M(k) = k inside [lo, hi] (default 0.5-5), else 0",
    source="Ring-1T IcePop (arXiv 2510.18855); OpenRLHF PolicyLoss is_correction_threshold",
)
def icepop(rollout_logp, old_logp, mask, seq_id, params: CorrectionParams) -> CorrectionOutput:
    """weight (B,T) = rho_t inside [lo, hi], 0 outside, on sampled tokens; 1 elsewhere. Nothing rejected:
    a zero weight keeps the token in the denominators (OpenRLHF)."""
    lo, hi = band("icepop", params)
    rho = _rho(log_ratio(rollout_logp, old_logp, mask))
    inside = (rho >= lo) & (rho <= hi)
    return CorrectionOutput(weight=_token_weight(mask, torch.where(inside, rho, torch.zeros_like(rho))))


@CORRECTION.register(
    "geo_seq_mask",
    doc="drop sequences whose geometric-mean ratio exp(sum delta / n) is outside [lo, hi] (default 0.99-1.01)",
    source="SkyRL off_policy_correction_utils (geometric sequence mask); verl rollout_rs=geometric",
)
def geo_seq_mask(rollout_logp, old_logp, mask, seq_id, params: CorrectionParams) -> CorrectionOutput:
    """reject (B,T): every position of a sequence whose geometric-mean ratio is outside [lo, hi]."""
    lo, hi = band("geo_seq_mask", params)
    total, count = _per_sequence(log_ratio(rollout_logp, old_logp, mask), mask, seq_id)
    geo = _rho(total / count.clamp(min=1))  # a sequence without sampled tokens has ratio 1
    return CorrectionOutput(reject=(seq_id >= 0) & ((geo < lo) | (geo > hi)))


@CORRECTION.register(
    "decoupled",
    doc="decoupled PPO: weight sg(exp(old_logp - rollout_logp)), uncapped; tokens above cap C rejected if set",
    source="AReaL decoupled PPO (Fu et al. 2025, arXiv 2505.24298) ppo_actor_loss_fn",
)
def decoupled(rollout_logp, old_logp, mask, seq_id, params: CorrectionParams) -> CorrectionOutput:
    """The PPO ratio of the policy loss is already taken against the trainer's recomputation (the
    proximal policy); this adds the behaviour weight to the sampler. `params.c` (default None):
    AReaL's behav_imp_weight_cap, which rejects tokens whose weight exceeds it (no lower bound)."""
    rho = _rho(log_ratio(rollout_logp, old_logp, mask))
    reject = None if params.c is None else mask.bool() & (rho > params.c)
    return CorrectionOutput(weight=_token_weight(mask, rho), reject=reject)
