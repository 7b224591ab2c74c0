"""The loss of one micro-batch: one policy pass, then the terms each axis contributes.

    log-probs, entropy (+ values) from one backbone pass     [policy_forward]
    -> policy loss (algo.clip.level) x correction weight (algo.correction) -> aggregation (algo.agg)
       + KL to the reference (algo.kl, where: loss) - entropy bonus + value loss (critic)

Each axis is one registry call into `algorithms/`; nothing here branches on an axis value
beyond picking the function. The math of every value is in docs/algorithms.md.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from algorithms import AGGREGATION, KL_ESTIMATOR, POLICY_LOSS
from algorithms.types import AggParams
from harness.config.schema import RunConfig
from harness.model.logprobs import hidden_states, logprobs_from_hidden, token_logprobs
from harness.model.policy import values_from_hidden
from harness.rl.batch import TrainBatch, model_prefix


@dataclass
class MicroLoss:
    """loss: the scalar to backpropagate (pre-scaled so micro-batch losses sum to the
    mini-batch loss); terms: its detached parts (loss/...); stats: the policy loss's
    per-micro-batch diagnostics (clip fractions, ratio quantiles)."""

    loss: torch.Tensor
    terms: dict[str, torch.Tensor]
    stats: dict[str, torch.Tensor]
    old_logp: torch.Tensor | None = None  # the behaviour log-probs taken from this forward (old_logp=None)


def on_device(x: torch.Tensor | None, device) -> torch.Tensor | None:
    return None if x is None else x.to(device)


def head_positions(mb: TrainBatch, cfg: RunConfig, needed: bool) -> torch.Tensor | None:
    """With `needed` (the update plan's needed_positions, from train.learner.logprob_positions: needed),
    (B, T) bool: the tokens whose log-probs an update
    reads: the loss mask (policy loss, KL, entropy), the action tokens (the behaviour's diagnostics, the
    correction, KL in the reward) and, with observation SFT, the observation tokens; the lm_head and its
    log-softmax then run on these alone (on a SmolLM2 FrozenLake batch 160 of 4,264 positions, the others'
    log-probs being computed over the 49,152-token vocabulary only for every consumer to mask them away).
    None (every position) otherwise, as under `all`, the default: fewer rows change the lm_head's matrix
    shapes and so the float rounding of the rows kept (a tiny FrozenLake run departs in the last bits at
    update 26), so published runs keep their path."""
    if not needed:
        return None
    need = mb.loss_mask.bool() | mb.action_mask.bool()
    if cfg.algo.obs_sft.coef > 0 and mb.obs_mask is not None:
        need = need | mb.obs_mask.bool()
    return need


def policy_forward(
    policy,
    mb: TrainBatch,
    *,
    temperature: float,
    with_entropy: bool,
    with_values: bool,
    prefix: str | None = None,
    token_mask: torch.Tensor | None = None,
):
    """Log-probs (B,T), entropy (B,T) or None, and critic values (B,T) or None of the rows of `mb`, from
    ONE backbone pass (the critic shares the policy's backbone). Under constrained decoding (`mb.allowed`,
    (B,T,K) admissible ids per token) log-probs and entropy are those of the constrained policy.

    The batch lives on the CPU; only this pass runs on the model's device (GPU), and its (B, T)
    outputs come back to the batch's device, gradients flowing through the copies. `prefix`: the update
    plan's shared prefix (harness.rl.plan): each group's common prefix runs once, computed as it names
    (train.learner.prefix_impl); None: no sharing. `token_mask` (B, T):
    the positions whose log-probs and entropies are computed (`head_positions`); 0 elsewhere."""
    home, dev = mb.input_ids.device, next(policy.model.parameters()).device
    ids, attn, allowed = on_device(mb.input_ids, dev), on_device(mb.attention_mask, dev), on_device(mb.allowed, dev)
    token_mask = on_device(token_mask, dev)
    shared = model_prefix(mb, prefix)
    if not with_values:
        lp, ent = token_logprobs(
            policy.model,
            ids,
            attn,
            temperature=temperature,
            with_entropy=with_entropy,
            allowed=allowed,
            prefix=shared,
            token_mask=token_mask,
        )
        return on_device(lp, home), on_device(ent, home), None
    hidden = hidden_states(policy.model, ids, attn, shared)  # (B, T, H)
    lp, ent = logprobs_from_hidden(
        policy.model,
        hidden,
        ids,
        attn,
        temperature=temperature,
        with_entropy=with_entropy,
        allowed=allowed,
        token_mask=token_mask,
    )
    return (
        on_device(lp, home),
        on_device(ent, home),
        on_device(values_from_hidden(policy.value_head, hidden, attn), home),
    )


@dataclass
class Denominators:
    """Whole-minibatch counts each aggregated term divides by, so that splitting the minibatch
    into micro-batches changes nothing (docs/algorithms.md#aggregation).

    loss: the loss mask (KL and entropy terms); policy: the policy loss's mask, i.e. the loss mask
    without the actions the SAMPO sequence mask drops; value: action tokens (the critic's loss)."""

    loss: AggParams
    policy: AggParams
    value: AggParams
    obs: AggParams | None = None  # observation SFT's tokens (algo.obs_sft)


def loss_terms(
    policy,
    mb: TrainBatch,
    adv,
    old_logp,
    ref_logp,
    old_values,
    returns,
    cfg: RunConfig,
    denominators: Denominators,
    policy_mask: torch.Tensor | None = None,
    is_weight: torch.Tensor | None = None,
    prefix: str | None = None,
    needed_positions: bool = False,
) -> MicroLoss:
    """Loss of one micro-batch (already scaled for accumulation) and its per-token stats.

    `policy_mask` (B, T): the tokens the policy loss trains on when it differs from the loss mask
    (the SAMPO sequence mask, docs/algorithms.md#sampo; rejections of `algo.correction`, docs/algorithms.md#off-policy).
    As in ARLArena and verl, the dropped tokens leave the policy loss and its denominator, while the KL
    and entropy terms keep every token. `is_weight` (B, T): the correction's detached weight on each
    token's policy loss, applied before aggregation (None = 1). `prefix`, `needed_positions`: the
    update plan's (harness.rl.plan). `old_logp` None: the micro-batch is on-policy
    (train.learner.behaviour: first_forward) and its behaviour log-probs are this forward's own, detached;
    they are returned in `MicroLoss.old_logp`."""
    a = cfg.algo
    agg = AGGREGATION.get(a.agg)
    logp, ent, values = policy_forward(
        policy,
        mb,
        temperature=cfg.rollout.temperature,
        with_entropy=a.entropy_coef > 0,
        with_values=a.critic.enabled,
        prefix=prefix,
        token_mask=head_positions(mb, cfg, needed_positions),
    )
    taken = old_logp is None
    if taken:  # verl's on-policy shortcut: the ratio is 1, its gradient that of the log-prob
        old_logp = logp.detach()
    pmask = mb.loss_mask if policy_mask is None else policy_mask
    clip = a.clip.params
    pl, stats = POLICY_LOSS.get(a.clip.level)(logp, old_logp, adv, pmask, mb.action_id, mb.traj_id, clip)
    if is_weight is not None:
        pl = pl * is_weight
    loss = agg(pl, pmask, denominators.policy)
    terms = {"loss/policy": loss.detach()}
    if a.kl.where == "loss" and a.kl.estimator != "none" and a.kl.coef > 0:
        kl = agg(KL_ESTIMATOR.get(a.kl.estimator)(logp, ref_logp), mb.loss_mask, denominators.loss)
        loss = loss + a.kl.coef * kl
        terms["loss/kl"] = kl.detach()
    if a.entropy_coef > 0:
        ent_term = agg(ent, mb.loss_mask, denominators.loss)
        loss = loss - a.entropy_coef * ent_term
        terms["loss/entropy"] = ent_term.detach()
    if a.critic.enabled:
        vloss = value_loss(values, old_values, returns, mb.action_mask, a.critic.value_clip, agg, denominators.value)
        loss = loss + a.critic.coef * vloss
        terms["loss/value"] = vloss.detach()
    if a.obs_sft.coef > 0 and mb.obs_mask is not None:
        obs = observation_nll(logp, mb.obs_mask, denominators.obs)
        loss = loss + a.obs_sft.coef * obs
        terms["loss/obs_sft"] = obs.detach()
    terms["loss/total"] = loss.detach()
    return MicroLoss(loss, terms, stats, old_logp if taken else None)


def observation_nll(logp: torch.Tensor, obs_mask: torch.Tensor, counts: AggParams | None) -> torch.Tensor:
    """ECHO's observation term (docs/algorithms.md#obs-sft): -sum(m_o * logp) / N_o, N_o the
    observation tokens of the whole minibatch (`counts.num_tokens`; this call's own when None)."""
    n = counts.num_tokens if counts is not None and counts.num_tokens is not None else float(obs_mask.sum())
    return -(logp * obs_mask).sum() / max(n, 1.0)


def value_loss(values, old_values, returns, mask, clip, agg, agg_params) -> torch.Tensor:
    """Clipped value loss 0.5 * max((V - R)^2, (V_clip - R)^2) (PPO2 / verl), aggregated as the policy loss."""
    v_clip = old_values + (values - old_values).clamp(-clip, clip)
    per_tok = 0.5 * torch.maximum((values - returns) ** 2, (v_clip - returns) ** 2)
    return agg(per_tok, mask, agg_params)
