"""Three log-probs per sampled token, and what the update does with the first two.

    rollout_logp  the sampler's, recorded during the rollout   (TrainBatch.sampler_logp)
    old_logp      the behaviour policy recomputed by the trainer at the start of the update (Forward.old_logp)
    logp          the current policy's, in every training pass

`algo.correction` (docs/algorithms.md#off-policy) turns rollout_logp and old_logp into a weight on each
token's policy loss and a set of rejected tokens. Both inputs are fixed for the update, so the
correction is computed once over the whole batch (`batch_correction`), before any micro-batch, and
each micro-batch takes its slice: the result cannot depend on how the minibatch is cut. The mismatch
diagnostics (`mismatch_diagnostics`, `diag/mismatch_*`) are logged every update whatever the
correction.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from algorithms import CORRECTION
from algorithms.correction import TIS_CAP, log_ratio
from algorithms.utils import dense_ids, masked_mean
from harness.config.schema import RunConfig
from harness.rl.batch import TrainBatch

DELTA_QUANTILES = {"p0_1": 0.001, "p1": 0.01, "p50": 0.5, "p99": 0.99, "p99_9": 0.999}


@dataclass
class Correction:
    """The configured correction over the whole batch (B, T).

    weight: detached factor on each token's policy loss, or None (= 1). keep: the policy-loss mask
    factor of `rejected: drop` (rejected tokens leave the policy loss and its denominator), or None.
    masked: tokens the correction rejected or weighted 0 (for the masked fractions)."""

    weight: torch.Tensor | None
    keep: torch.Tensor | None
    masked: torch.Tensor


def sampled_mask(batch: TrainBatch) -> torch.Tensor:
    """(B, T) the trained tokens the sampler drew (action tokens in the loss mask): the tokens with all
    three log-probs. Trained observation tokens have no sampler probability."""
    return batch.loss_mask * batch.action_mask


def sequence_ids(batch: TrainBatch, cfg: RunConfig) -> torch.Tensor:
    """(B, T) the sequence of each token for the sequence-level corrections (`algo.correction.unit`)."""
    return batch.traj_id if cfg.algo.correction.unit == "trajectory" else batch.action_id


@torch.no_grad()
def batch_correction(batch: TrainBatch, old_logp: torch.Tensor, cfg: RunConfig) -> Correction:
    """Weight and kept tokens of `algo.correction` over the batch's rows (B, T)."""
    c = cfg.algo.correction
    m = sampled_mask(batch)
    out = CORRECTION.get(c.name)(batch.sampler_logp, old_logp, m, sequence_ids(batch, cfg), c.params)
    weight, keep = out.weight, None
    masked = torch.zeros_like(m, dtype=torch.bool)
    if out.weight is not None:
        masked = masked | (out.weight == 0)
    if out.reject is not None:
        masked = masked | out.reject
        if c.rejected == "drop":
            keep = (~out.reject).to(batch.loss_mask.dtype)
        else:
            base = weight if weight is not None else torch.ones_like(old_logp)
            weight = torch.where(out.reject, torch.zeros_like(base), base)
    return Correction(weight, keep, masked & batch.loss_mask.bool())


def _quantiles(x: torch.Tensor, probs: dict[str, float]) -> dict[str, torch.Tensor]:
    """Nearest-rank quantiles of a 1-D tensor (NaN when empty; torch.quantile caps the input size)."""
    if x.numel() == 0:
        return {k: torch.tensor(float("nan")) for k in probs}
    srt = x.sort().values
    idx = (torch.tensor(list(probs.values()), dtype=torch.float64) * (srt.numel() - 1)).round().long()
    return dict(zip(probs, srt[idx]))


def _masked_fractions(batch: TrainBatch, corr: Correction, cfg: RunConfig) -> dict[str, torch.Tensor]:
    """Shares of trained tokens and of sequences (`algo.correction.unit`) with a rejected or zero-weight token."""
    lm = batch.loss_mask.bool()
    seq = sequence_ids(batch, cfg)[lm]
    inv, n = dense_ids(seq)
    hits = torch.zeros(n, device=inv.device).index_add_(0, inv, corr.masked[lm].float())  # (sequences,) masked tokens
    return {
        "diag/mismatch_masked_token_frac": masked_mean(corr.masked.float(), batch.loss_mask),
        "diag/mismatch_masked_seq_frac": (hits > 0).float().mean() if n else torch.tensor(0.0),
    }


def _ess(w: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """Effective sample size 1 / mean((w / mean w)^2) over the masked tokens, in (0, 1]; NaN when empty."""
    if not m.bool().any():
        return torch.tensor(float("nan"))
    return 1.0 / masked_mean((w / masked_mean(w, m)).square(), m)


@torch.no_grad()
def mismatch_diagnostics(
    batch: TrainBatch, old_logp: torch.Tensor, corr: Correction, cfg: RunConfig
) -> dict[str, torch.Tensor]:
    """diag/mismatch_*: sampler (rollout_logp) vs behaviour (old_logp) over the sampled trained tokens
    (verl compute_offpolicy_metrics). delta = old - rollout, rho = exp(delta) (clamped +-20):
    k1 = mean(rollout - old), k3 = mean(rho - delta - 1), chi2 = mean(rho^2) - 1, shares of rho above C
    and below 1/C (C = algo.correction.c, default 2), ESS = 1 / mean((w / mean w)^2) with w = rho
    clipped to [1/C, C] (verl), the mean correction weight over the tokens the policy loss trains on, the
    masked fractions and the delta quantiles."""
    m = sampled_mask(batch)
    delta = log_ratio(batch.sampler_logp.double(), old_logp.double(), m)  # float64: the mismatch can be ~1e-7
    d = delta.clamp(-20.0, 20.0)
    rho = torch.exp(d)
    cap = cfg.algo.correction.c if cfg.algo.correction.c is not None else TIS_CAP
    w = rho.clamp(1.0 / cap, cap)
    weight = corr.weight if corr.weight is not None else torch.ones_like(old_logp)
    out = {
        "diag/mismatch_k1": masked_mean(-delta, m),
        "diag/mismatch_k3": masked_mean(torch.expm1(d) - d, m),
        "diag/mismatch_chi2": masked_mean(torch.expm1(2.0 * d), m),  # mean(rho^2) - 1 without cancellation
        "diag/mismatch_frac_above": masked_mean((rho > cap).double(), m),
        "diag/mismatch_frac_below": masked_mean((rho < 1.0 / cap).double(), m),
        "diag/mismatch_ess": _ess(w, m),
        "diag/mismatch_weight_mean": masked_mean(weight, batch.loss_mask * (1.0 if corr.keep is None else corr.keep)),
        **_masked_fractions(batch, corr, cfg),
    }
    for name, q in _quantiles(delta[m.bool()], DELTA_QUANTILES).items():
        out[f"diag/mismatch_delta_{name}"] = q
    return out
