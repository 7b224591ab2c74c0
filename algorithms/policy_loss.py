"""`algo.clip.level`: importance ratio and clipping (docs/algorithms.md#clipping).

Signature: `fn(logp, old_logp, advantages, mask, action_id, traj_id, params: ClipParams)
-> (loss (B,T), stats)`. All tensors (B,T); `action_id` / `traj_id` int ids of the
turn-action / trajectory of each token (unique across the batch; values on untrained tokens
are ignored). `loss` is the per-token loss, 0 outside the mask: no function here aggregates,
the trainer calls `algo.agg`. `stats`: detached 0-dim tensors over trained tokens.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from .registry import Registry
from .types import ClipParams, PolicyLossFn
from .utils import masked_mean, segment_mean

POLICY_LOSS: Registry[PolicyLossFn] = Registry(
    "algo.clip.level", "importance-ratio level and clipping of the policy loss"
)

LOG_RATIO_CLAMP = 20.0  # |logp - old_logp| clamped before exp (verl compute_policy_loss_vanilla)
# the sequence levels clamp the mean log-ratio above only, at 10, as verl compute_policy_loss_gspo: past it the
# ratio is a constant e^10 and the token gets no gradient (docs/algorithms.md#clipping)
SEQ_LOG_RATIO_MAX = 10.0


def _log_ratio(logp, old_logp, mask, params: ClipParams) -> torch.Tensor:
    """Clamped `logp - old_logp` (B,T), exactly 0 outside the mask (NaN-safe, zero grad)."""
    lr = torch.where(mask.bool(), logp - old_logp, torch.zeros_like(logp))
    return lr.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)


def clipped_objective(ratio, advantages, mask, params: ClipParams):
    """PPO clipped surrogate on any ratio (B,T): loss = max(-r A, -clip(r) A), dual-clip
    min(loss, -c A) for A < 0 when c is set. Returns (loss (B,T) 0 outside mask, stats)."""
    m = mask.bool()
    adv = torch.where(m, advantages, torch.zeros_like(advantages))
    clipped = ratio.clamp(1.0 - params.eps_low, 1.0 + params.eps_high)
    loss = torch.maximum(-adv * ratio, -adv * clipped)
    dual = torch.zeros_like(m)
    if params.dual_c is not None:
        bound = -params.dual_c * adv
        dual = m & (adv < 0) & (bound < loss)
        loss = torch.where(adv < 0, torch.minimum(loss, bound), loss)
    loss = torch.where(m, loss, torch.zeros_like(loss))
    r = ratio.detach()
    low = m & (adv < 0) & (r < 1.0 - params.eps_low)  # gradient zeroed by the lower clip
    high = m & (adv > 0) & (r > 1.0 + params.eps_high)  # ... by the upper clip
    return loss, _stats(r, m, low, high, dual)


def _stats(r, m, low, high, dual) -> dict[str, torch.Tensor]:
    f = r.dtype
    sel = r[m]
    if sel.numel():  # nearest-rank quantiles (torch.quantile caps the input size)
        srt = sel.sort().values
        idx = torch.tensor([0.05, 0.5, 0.95], device=r.device) * (srt.numel() - 1)
        q, mn, mx = srt[idx.round().long()], srt[0], srt[-1]
    else:
        q = torch.full((3,), float("nan"), dtype=f, device=r.device)
        mn = mx = q[0]
    return {
        "clip_frac_low": masked_mean(low.to(f), m),
        "clip_frac_high": masked_mean(high.to(f), m),
        "clip_frac": masked_mean((low | high).to(f), m),
        "dual_clip_frac": masked_mean(dual.to(f), m),
        "ratio_mean": masked_mean(r, m),
        "ratio_min": mn,
        "ratio_max": mx,
        "ratio_p05": q[0],
        "ratio_p50": q[1],
        "ratio_p95": q[2],
        "num_tokens": m.sum().to(f),
    }


@POLICY_LOSS.register(
    "token",
    doc="per-token ratio, PPO clip (clip-higher, optional dual-clip)",
    source="PPO (Schulman et al. 2017); DAPO clip-higher; verl core_algos.py",
)
def token_level(logp, old_logp, advantages, mask, action_id, traj_id, params: ClipParams):
    """w_k = exp(logp_k - old_logp_k); loss_k = -min(w_k A_k, clip(w_k) A_k). (B,T) in/out."""
    ratio = torch.exp(_log_ratio(logp, old_logp, mask, params))
    return clipped_objective(ratio, advantages, mask, params)


def _segment_ratio(logp, old_logp, mask, seg, params: ClipParams) -> torch.Tensor:
    """GSPO token form (B,T): s_k = sg[exp(min(mean_seg log w, 10))] * exp(logp_k - sg[logp_k]), the gradient
    factor dropped where the mean log-ratio exceeds 10 (verl clamps the sum, which zeroes its gradient there).
    The token log-ratios enter the mean unclamped, as in verl (an outlier token moves the mean in full)."""
    m = mask.bool()
    raw = torch.where(m, logp - old_logp, torch.zeros_like(logp)).detach()
    seq_lr = segment_mean(raw, seg, mask)
    lp = torch.where(m, logp, torch.zeros_like(logp))
    grad = lp - lp.detach()
    over = seq_lr > SEQ_LOG_RATIO_MAX
    return torch.exp(seq_lr.clamp(max=SEQ_LOG_RATIO_MAX)) * torch.exp(torch.where(over, torch.zeros_like(grad), grad))


@POLICY_LOSS.register(
    "sequence",
    doc="geometric-mean ratio per turn-action, clipped per action (GSPO)",
    source="GSPO (Zheng et al. 2025); ARLArena SAMPO",
)
def sequence_level(logp, old_logp, advantages, mask, action_id, traj_id, params: ClipParams):
    """s = exp(mean over the action's tokens of log w), one ratio per `action_id`. (B,T)."""
    ratio = _segment_ratio(logp, old_logp, mask, action_id, params)
    return clipped_objective(ratio, advantages, mask, params)


@POLICY_LOSS.register(
    "trajectory",
    doc="geometric-mean ratio over all action tokens of the trajectory",
    source="GSPO (Zheng et al. 2025) applied per trajectory",
)
def trajectory_level(logp, old_logp, advantages, mask, action_id, traj_id, params: ClipParams):
    """As `sequence` with one ratio per `traj_id`. In the per-step layout a trajectory spans
    several rows: they must be in the same call (micro-batch), else the mean is partial."""
    ratio = _segment_ratio(logp, old_logp, mask, traj_id, params)
    return clipped_objective(ratio, advantages, mask, params)


@POLICY_LOSS.register(
    "none", doc="unclipped -w_k A_k (REINFORCE gradient when on-policy)", source="REINFORCE (Williams 1992)"
)
def no_clip(logp, old_logp, advantages, mask, action_id, traj_id, params: ClipParams):
    """loss_k = -w_k A_k, w_k the (clamped) token ratio. (B,T) in/out."""
    ratio = torch.exp(_log_ratio(logp, old_logp, mask, params))
    off = replace(params, eps_low=float("inf"), eps_high=float("inf"), dual_c=None)
    return clipped_objective(ratio, advantages, mask, off)


def _band_stats(ratio, mask, params: ClipParams):
    """Stats of a loss without a PPO clip: the "clip" fractions are the shares of trained tokens whose
    ratio lies below 1 - eps_low / above 1 + eps_high, whatever the advantage's sign."""
    m, r = mask.bool(), ratio.detach()
    low, high = m & (r < 1.0 - params.eps_low), m & (r > 1.0 + params.eps_high)
    return _stats(r, m, low, high, torch.zeros_like(m))


@POLICY_LOSS.register(
    "cispo",
    doc="-sg(clip(w_k, 1-eps_low, 1+eps_high)) A_k logp_k: clipped, detached IS weight times the log-prob",
    source="CISPO, MiniMax-M1 (MiniMax 2025, arXiv 2506.13585); verl compute_policy_loss_cispo",
)
def cispo(logp, old_logp, advantages, mask, action_id, traj_id, params: ClipParams):
    """The clip bounds a detached weight instead of the surrogate, so a token whose ratio left the
    range keeps its gradient -w_hat A d logp. Bounds from algo.clip.eps_low / eps_high (verl's
    defaults 0.2 / 0.2; eps_low >= 1 removes the lower bound, as in the paper). (B,T) in/out."""
    m = mask.bool()
    ratio = torch.exp(_log_ratio(logp, old_logp, mask, params))
    weight = ratio.detach().clamp(1.0 - params.eps_low, 1.0 + params.eps_high)
    adv = torch.where(m, advantages, torch.zeros_like(advantages))
    lp = torch.where(m, logp, torch.zeros_like(logp))
    loss = torch.where(m, -weight * adv * lp, torch.zeros_like(lp))
    return loss, _band_stats(ratio, mask, params)


@POLICY_LOSS.register(
    "sapo",
    doc="-sigmoid(tau (w_k - 1)) (4 / tau) A_k, tau = tau_pos if A > 0 else tau_neg: a soft gate, no clip",
    source="SAPO (Qwen team 2025, arXiv 2511.20347); verl compute_policy_loss_sapo, TRL",
)
def sapo(logp, old_logp, advantages, mask, action_id, traj_id, params: ClipParams):
    """Soft adaptive gate f(w) = sigmoid(tau (w - 1)) 4 / tau: its gradient in logp is
    4 w sigmoid'(tau (w - 1)) A, equal to A at w = 1 and decaying smoothly away from it.
    tau from algo.clip.tau_pos / tau_neg (1.0 / 1.05). (B,T) in/out."""
    m = mask.bool()
    ratio = torch.exp(_log_ratio(logp, old_logp, mask, params))
    adv = torch.where(m, advantages, torch.zeros_like(advantages))
    tau = torch.where(adv > 0, torch.full_like(ratio, params.tau_pos), torch.full_like(ratio, params.tau_neg))
    gate = torch.sigmoid(tau * (ratio - 1.0)) * (4.0 / tau)
    loss = torch.where(m, -gate * adv, torch.zeros_like(gate))
    return loss, _band_stats(ratio, mask, params)


def negative_advantage_seq_mask(logp, old_logp, advantages, mask, action_id, delta: float) -> torch.Tensor:
    """SAMPO `use_seq_mask` (ARLArena): drop a turn-action when its A < 0 and
    mean_k log(old_p_k / p_k) > delta (its ratio fell below e^-delta; `algo.clip.seq_mask_delta`).

    All (B,T); returns the new mask (B,T), same dtype as `mask`, detached. The action's
    advantage is the mean of A over its tokens (constant per action in practice).
    """
    with torch.no_grad():
        lr = torch.where(mask.bool(), old_logp - logp, torch.zeros_like(logp))
        seq_lr = segment_mean(lr, action_id, mask)
        seq_adv = segment_mean(advantages.to(lr.dtype), action_id, mask)
        drop = (seq_adv < 0) & (seq_lr > delta)
        return torch.where(drop, torch.zeros_like(mask), mask)
