"""`algo.kl.estimator`: per-token KL estimators to the reference policy, and entropy
(docs/algorithms.md#kl).

Signature: `fn(logp (B,T), ref_logp (B,T)) -> kl (B,T)` with d = logp - ref_logp, samples
from the current policy. Placement (`algo.kl.where`: loss or reward) is the trainer's; for
reward placement use `kl_penalty_rewards`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from .registry import Registry
from .types import KLFn

KL_ESTIMATOR: Registry[KLFn] = Registry("algo.kl.estimator", "KL(pi || pi_ref) estimator per token")

# Like the token ratio clamp of the policy loss. verl's k3 (low_var_kl) clamps d to [-20, 20] too and also its
# *output* to [-10, 10], which zeroes the gradient there; we keep the gradient (docs/algorithms.md#kl).
KL_LOG_RATIO_CLAMP = 20.0


@KL_ESTIMATOR.register("none", doc="no KL (StarPO-S / DAPO drop it)", source="DAPO, RAGEN")
def kl_none(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Zeros (B,T)."""
    return torch.zeros_like(logp)


@KL_ESTIMATOR.register(
    "k1",
    doc="d = logp - ref_logp (unbiased, can be negative)",
    source="Schulman 2020, 'Approximating KL divergence'; verl",
)
def kl_k1(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """(B,T) -> (B,T)."""
    return logp - ref_logp


@KL_ESTIMATOR.register(
    "k2", doc="d^2 / 2 (biased, >= 0)", source="Schulman 2020, 'Approximating KL divergence'; verl 'mse'"
)
def kl_k2(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """(B,T) -> (B,T)."""
    return 0.5 * (logp - ref_logp) ** 2


@KL_ESTIMATOR.register(
    "k3",
    doc="exp(-d) + d - 1 (unbiased, low variance, >= 0)",
    source="Schulman 2020; GRPO (Shao et al. 2024); verl 'low_var_kl'",
)
def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """(B,T) -> (B,T); d clamped to [-20, 20] before exp.

    expm1 keeps small d accurate; the float32 cancellation of expm1(-d) + d can still leave
    about -1e-7 where the exact value d^2/2 is smaller, so the result is clamped at 0.
    """
    d = (logp - ref_logp).clamp(-KL_LOG_RATIO_CLAMP, KL_LOG_RATIO_CLAMP)
    return (torch.expm1(-d) + d).clamp(min=0.0)


def kl_penalty_rewards(token_rewards: torch.Tensor, kl: torch.Tensor, beta: float, mask: torch.Tensor) -> torch.Tensor:
    """PPO-style KL in the reward: r_k - beta * KL_k on trained tokens (KL detached). (N,T)."""
    pen = torch.where(mask.bool(), beta * kl.detach(), torch.zeros_like(kl))
    return token_rewards - pen


def _entropy(logits: torch.Tensor) -> torch.Tensor:
    logits = logits.float()
    logp = F.log_softmax(logits, dim=-1)
    # masked-out vocab (-inf logits): p = 0, clamp keeps 0 * log p at 0 (and its grad finite)
    return -(logp.exp() * logp.clamp(min=torch.finfo(logp.dtype).min)).sum(-1)


def entropy_from_logits(logits: torch.Tensor, chunk_size: int = 1024) -> torch.Tensor:
    """Full-vocabulary entropy H = -sum_v p_v log p_v: logits (..., V) -> (...), float32.

    Rows are processed `chunk_size` at a time; under autograd each chunk is checkpointed so
    only one chunk's softmax is alive at once (the entropy bonus needs the gradient).
    """
    flat = logits.reshape(-1, logits.shape[-1])  # (B*T, V)
    parts = []
    for chunk in flat.split(chunk_size):
        if chunk.requires_grad and torch.is_grad_enabled():
            parts.append(checkpoint(_entropy, chunk, use_reentrant=False))
        else:
            parts.append(_entropy(chunk))
    out = torch.cat(parts) if parts else flat.new_zeros(0, dtype=torch.float32)
    return out.reshape(logits.shape[:-1])
