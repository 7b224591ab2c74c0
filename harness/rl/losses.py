"""One RL update on an assembled batch: advantages, then epochs x minibatches of the loss.

Each axis is one registry call into `algorithms/` (policy loss, aggregation, advantage
estimator, normalization scope, KL estimator); nothing here branches on an axis value beyond
picking the function. The update reads top to bottom:

    behaviour log-probs (recomputed, no grad) [+ reference log-probs, + values]
    -> advantages (stream form) -> rows
    -> for epoch, minibatch: for micro-batch: log-probs -> policy loss -> aggregation
                                             + KL + entropy + value loss -> backward
                             clip grad -> optimizer step
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from algorithms import ADV_NORM, ADVANTAGE, AGGREGATION, KL_ESTIMATOR, POLICY_LOSS
from algorithms.policy_loss import negative_advantage_seq_mask
from algorithms.types import AdvantageInputs, AdvantageParams, AggParams, ClipParams
from algorithms.utils import turn_rewards_to_tokens
from harness.batch import TrainBatch
from harness.config import RunConfig
from harness.errors import Diverged  # noqa: F401  (non-finite loss or gradient: the point is "diverged")
from harness.logprobs import hidden_states, logprobs_from_hidden, token_logprobs
from harness.models import values_from_hidden



@dataclass
class Forward:
    """Per-row tensors (B, T) computed once at the start of an update, without gradients."""

    old_logp: torch.Tensor
    ref_logp: torch.Tensor
    old_values: torch.Tensor | None


def _on(x: torch.Tensor | None, device) -> torch.Tensor | None:
    return None if x is None else x.to(device)


def policy_forward(policy, input_ids, attention_mask, *, temperature: float, with_entropy: bool,
                   with_values: bool, allowed: torch.Tensor | None = None):
    """Log-probs (B,T), entropy (B,T) or None, and critic values (B,T) or None, from ONE backbone
    pass (the critic shares the policy's backbone). `allowed` (B,T,K): constrained decoding's
    admissible ids per token; log-probs and entropy are then those of the constrained policy.

    The batch lives on the CPU; only this pass runs on the model's device (GPU), and its (B, T)
    outputs come back to the batch's device, gradients flowing through the copies."""
    home, dev = input_ids.device, next(policy.model.parameters()).device
    ids, attn, allowed = _on(input_ids, dev), _on(attention_mask, dev), _on(allowed, dev)
    if not with_values:
        lp, ent = token_logprobs(policy.model, ids, attn, temperature=temperature,
                                 with_entropy=with_entropy, allowed=allowed)
        return _on(lp, home), _on(ent, home), None
    hidden = hidden_states(policy.model, ids, attn)  # (B, T, H)
    lp, ent = logprobs_from_hidden(policy.model, hidden, ids, attn, temperature=temperature,
                                   with_entropy=with_entropy, allowed=allowed)
    return _on(lp, home), _on(ent, home), _on(values_from_hidden(policy.value_head, hidden, attn), home)


def _micro_slices(n: int, size: int) -> list[torch.Tensor]:
    idx = torch.arange(n)
    return [idx[i: i + size] for i in range(0, n, size)]


@torch.no_grad()
def behaviour_forward(policy, batch: TrainBatch, cfg: RunConfig) -> Forward:
    """Recompute behaviour and reference log-probs (and values) over all rows. The reference is
    always computed: KL to it is a diagnostic (diag/kl_*) even when no KL term is trained."""
    old, ref, val = [], [], []
    T = batch.input_ids.shape[1]
    for idx in _micro_slices(batch.num_rows, cfg.algo.micro_batch_size):
        mb = batch.rows(idx)
        pad = (0, T - mb.input_ids.shape[1])
        lp, _, v = policy_forward(policy, mb.input_ids, mb.attention_mask, temperature=cfg.rollout.temperature,
                                  with_entropy=False, with_values=cfg.algo.critic.enabled, allowed=mb.allowed)
        old.append(torch.nn.functional.pad(lp, pad))
        if v is not None:
            val.append(torch.nn.functional.pad(v, pad))
        with policy.reference() as ref_model:
            dev = next(ref_model.parameters()).device
            rlp, _ = token_logprobs(ref_model, _on(mb.input_ids, dev), _on(mb.attention_mask, dev),
                                    temperature=cfg.rollout.temperature, allowed=_on(mb.allowed, dev))
        ref.append(torch.nn.functional.pad(rlp.to(mb.input_ids.device), pad))
    cat = lambda xs: torch.cat(xs, 0) if xs else None  # noqa: E731
    return Forward(cat(old), cat(ref), cat(val))


def advantages(batch: TrainBatch, fwd: Forward, cfg: RunConfig) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Advantages on the rows (B, T) and critic returns (B, T) or None."""
    a = cfg.algo
    token_rewards = turn_rewards_to_tokens(batch.turn_rewards, batch.stream_turn, batch.stream_mask)
    if a.kl.where == "reward" and a.kl.estimator != "none":
        kl = KL_ESTIMATOR.get(a.kl.estimator)(fwd.old_logp, fwd.ref_logp)  # (B,T)
        token_rewards = token_rewards - a.kl.coef * batch.to_stream(kl * batch.action_mask)
    inputs = AdvantageInputs(
        mask=batch.stream_mask, turn_index=batch.stream_turn, rewards=batch.rewards, group=batch.group,
        turn_rewards=batch.turn_rewards, turn_mask=batch.turn_mask, task=batch.task, env=batch.env,
        anchor=batch.anchor, token_rewards=token_rewards,
        values=batch.to_stream(fwd.old_values) if fwd.old_values is not None else None)
    params = AdvantageParams(gamma=a.adv.gamma, lam=a.adv.lam, step_gamma=a.adv.gigpo_gamma,
                             step_weight=a.adv.gigpo_step_weight, gigpo_mode=a.adv.gigpo_mode,
                             episode_stats="trajectory" if a.adv.gigpo_episode_stats == "trajectories" else "step")
    out = ADVANTAGE.get(a.adv.estimator)(inputs, params)
    adv = ADV_NORM.get(a.adv.norm)(out.advantages, inputs, params)
    returns = batch.to_rows(out.returns) if out.returns is not None else None
    return batch.to_rows(adv), returns


def _loss_terms(policy, mb: TrainBatch, adv, old_logp, ref_logp, old_values, returns,
                cfg: RunConfig, agg_params: AggParams, value_agg_params: AggParams):
    """Loss of one micro-batch (already scaled for accumulation) and its per-token stats."""
    a = cfg.algo
    agg = AGGREGATION.get(a.agg)
    # entropy is a diagnostic even when its coefficient is 0
    logp, ent, values = policy_forward(policy, mb.input_ids, mb.attention_mask, temperature=cfg.rollout.temperature,
                                       with_entropy=True, with_values=a.critic.enabled, allowed=mb.allowed)
    mask = mb.loss_mask
    if a.clip.seq_mask:
        mask = negative_advantage_seq_mask(logp, old_logp, adv, mask, mb.action_id, a.clip.seq_mask_delta)
    clip = ClipParams(eps_low=a.clip.eps_low, eps_high=a.clip.eps_high, dual_clip_c=a.clip.dual_c)
    pl, stats = POLICY_LOSS.get(a.clip.level)(logp, old_logp, adv, mask, mb.action_id, mb.traj_id, clip)
    loss = agg(pl, mask, agg_params)
    terms = {"loss/policy": loss.detach()}
    if a.kl.where == "loss" and a.kl.estimator != "none" and a.kl.coef > 0:
        kl = agg(KL_ESTIMATOR.get(a.kl.estimator)(logp, ref_logp), mask, agg_params)
        loss = loss + a.kl.coef * kl
        terms["loss/kl"] = kl.detach()
    ent_term = agg(ent, mb.loss_mask, agg_params)
    terms["loss/entropy"] = ent_term.detach()
    if a.entropy_coef > 0:
        loss = loss - a.entropy_coef * ent_term
    if a.critic.enabled:
        vloss = value_loss(values, old_values, returns, mb.action_mask, a.critic.value_clip, agg, value_agg_params)
        loss = loss + a.critic.coef * vloss
        terms["loss/value"] = vloss.detach()
    terms["loss/total"] = loss.detach()
    return loss, terms, stats, logp.detach(), ent.detach(), mask


def value_loss(values, old_values, returns, mask, clip, agg, agg_params) -> torch.Tensor:
    """Clipped value loss 0.5 * max((V - R)^2, (V_clip - R)^2) (PPO2 / verl), aggregated as the policy loss."""
    v_clip = old_values + (values - old_values).clamp(-clip, clip)
    per_tok = 0.5 * torch.maximum((values - returns) ** 2, (v_clip - returns) ** 2)
    return agg(per_tok, mask, agg_params)
