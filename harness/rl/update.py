"""One RL update on an assembled batch, top to bottom:

behaviour log-probs (recomputed, no grad) + reference log-probs [+ values]
-> advantages (algo.adv.estimator, then algo.adv.norm) on the trajectory token stream -> rows
-> for epoch, minibatch (whole trajectories): for micro-batch: loss (`harness.rl.losses`)
   -> backward; clip grad -> optimizer step
-> diagnostics reduced once (one sync point)
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from algorithms import ADV_NORM, ADVANTAGE, KL_ESTIMATOR
from algorithms.aggregation import global_counts
from algorithms.types import AdvantageInputs, AdvantageParams
from algorithms.utils import masked_mean, turn_rewards_to_tokens
from harness.config.errors import Diverged
from harness.config.schema import RunConfig, axis_params
from harness.model.logprobs import token_logprobs
from harness.rl.batch import TrainBatch
from harness.rl.losses import loss_terms, on_device, policy_forward


@dataclass
class Forward:
    """Per-row tensors (B, T) computed once at the start of an update, without gradients."""

    old_logp: torch.Tensor
    ref_logp: torch.Tensor
    old_values: torch.Tensor | None


def _micro_slices(n: int, size: int) -> list[torch.Tensor]:
    idx = torch.arange(n)
    return [idx[i : i + size] for i in range(0, n, size)]


@torch.no_grad()
def behaviour_forward(policy, batch: TrainBatch, cfg: RunConfig) -> Forward:
    """Recompute behaviour and reference log-probs (and values) over all rows. The reference is
    always computed: KL to it is a diagnostic (diag/kl_*) even when no KL term is trained."""
    old, ref, val = [], [], []
    T = batch.input_ids.shape[1]
    for idx in _micro_slices(batch.num_rows, cfg.algo.micro_batch_size):
        mb = batch.rows(idx)
        pad = (0, T - mb.input_ids.shape[1])
        lp, _, v = policy_forward(
            policy,
            mb.input_ids,
            mb.attention_mask,
            temperature=cfg.rollout.temperature,
            with_entropy=False,
            with_values=cfg.algo.critic.enabled,
            allowed=mb.allowed,
        )
        old.append(torch.nn.functional.pad(lp, pad))
        if v is not None:
            val.append(torch.nn.functional.pad(v, pad))
        with policy.reference() as ref_model:
            dev = next(ref_model.parameters()).device
            rlp, _ = token_logprobs(
                ref_model,
                on_device(mb.input_ids, dev),
                on_device(mb.attention_mask, dev),
                temperature=cfg.rollout.temperature,
                allowed=on_device(mb.allowed, dev),
            )
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
        mask=batch.stream_mask,
        turn_index=batch.stream_turn,
        rewards=batch.rewards,
        group=batch.group,
        turn_rewards=batch.turn_rewards,
        turn_mask=batch.turn_mask,
        task=batch.task,
        env=batch.env,
        anchor=batch.anchor,
        token_rewards=token_rewards,
        values=batch.to_stream(fwd.old_values) if fwd.old_values is not None else None,
    )
    params = axis_params(AdvantageParams, a.adv)
    out = ADVANTAGE.get(a.adv.estimator)(inputs, params)
    adv = ADV_NORM.get(a.adv.norm)(out.advantages, inputs, params)
    returns = batch.to_rows(out.returns) if out.returns is not None else None
    return batch.to_rows(adv), returns


def make_optimizer(policy, cfg: RunConfig) -> torch.optim.Optimizer:
    """AdamW over the trainable policy weights; the critic head gets its own learning rate."""
    a = cfg.algo
    groups = [{"params": policy.actor_parameters(), "lr": a.lr}]
    critic = policy.critic_parameters() if a.critic.enabled else []
    if critic:
        groups.append({"params": critic, "lr": a.critic.lr})
    return torch.optim.AdamW(groups, lr=a.lr, weight_decay=a.weight_decay)


def _row_traj(batch: TrainBatch) -> torch.Tensor:
    """(B,) trajectory of each row (rows of one trajectory are contiguous in the batch)."""
    return batch.traj_id.max(1).values


def _minibatches(batch: TrainBatch, n: int, generator: torch.Generator) -> list[torch.Tensor]:
    """Row indices of `n` minibatches made of whole trajectories, in a seeded random order.

    Keeping a trajectory's rows together lets trajectory-level ratios see all its tokens.
    """
    traj = _row_traj(batch)
    order = torch.randperm(int(traj.max()) + 1, generator=generator)
    rows_of = [torch.nonzero(traj == t).flatten() for t in order.tolist()]
    return [
        torch.cat([rows_of[i] for i in part.tolist()])
        for part in torch.tensor_split(torch.arange(len(rows_of)), n)
        if len(part)
    ]


def _micro_batches(batch: TrainBatch, rows: torch.Tensor, size: int) -> list[torch.Tensor]:
    """Split `rows` into micro-batches of at most `size` rows, never splitting a trajectory
    (a trajectory longer than `size` rows gets a micro-batch of its own)."""
    traj = _row_traj(batch)[rows]
    out, cur = [], []
    for k in range(len(rows)):
        starts_traj = k == 0 or traj[k] != traj[k - 1]
        if cur and starts_traj and len(cur) + int((traj == traj[k]).sum()) > size:
            out.append(torch.stack(cur))
            cur = []
        cur.append(rows[k])
    return out + ([torch.stack(cur)] if cur else [])


def _update_diagnostics(batch: TrainBatch, fwd: Forward, adv: torch.Tensor, cfg: RunConfig) -> dict:
    """KL to the reference (k1, k3 mean; k3 max), sampler-vs-trainer mismatch, advantage stats."""
    m = batch.action_mask
    out = {
        "diag/logprob_mismatch": masked_mean((fwd.old_logp - batch.sampler_logp).abs(), m),
        "diag/logprob_mismatch_max": ((fwd.old_logp - batch.sampler_logp).abs() * m).max(),
        "diag/adv_mean": masked_mean(adv, batch.loss_mask),
        "diag/adv_abs_mean": masked_mean(adv.abs(), batch.loss_mask),
        "diag/rows": torch.tensor(float(batch.num_rows)),
        "diag/trained_tokens": batch.loss_mask.sum(),
    }
    k3 = KL_ESTIMATOR.get("k3")(fwd.old_logp, fwd.ref_logp)
    out["diag/kl_k1"] = masked_mean(fwd.old_logp - fwd.ref_logp, m)
    out["diag/kl_k3"] = masked_mean(k3, m)
    out["diag/kl_k3_max"] = (k3 * m).max()
    return out


def _pick(x: torch.Tensor | None, rows: torch.Tensor, T: int) -> torch.Tensor | None:
    """x[rows, :T] (a micro-batch's slice of a full-batch tensor), or None."""
    return None if x is None else x[rows, :T]


def run_update(policy, optimizer, batch: TrainBatch, cfg: RunConfig, generator: torch.Generator) -> dict[str, float]:
    """One update on `batch`; returns its metrics, reduced once at the end."""
    a = cfg.algo
    policy.model.train()
    fwd = behaviour_forward(policy, batch, cfg)
    adv, returns = advantages(batch, fwd, cfg)
    sums: dict[str, list[torch.Tensor]] = {}
    params = policy.actor_parameters() + (policy.critic_parameters() if a.critic.enabled else [])
    steps = 0
    for _ in range(a.epochs):
        for mb_idx in _minibatches(batch, a.minibatches, generator):
            agg_params = replace(global_counts(batch.loss_mask[mb_idx]), agg_len=a.agg_len)
            # the critic is fitted on action tokens only (observations have no returns)
            value_agg_params = replace(global_counts(batch.action_mask[mb_idx]), agg_len=a.agg_len)
            optimizer.zero_grad(set_to_none=True)
            for micro in _micro_batches(batch, mb_idx, a.micro_batch_size):
                mb = batch.rows(micro)
                T = mb.input_ids.shape[1]
                out = loss_terms(
                    policy,
                    mb,
                    adv[micro, :T],
                    fwd.old_logp[micro, :T],
                    _pick(fwd.ref_logp, micro, T),
                    _pick(fwd.old_values, micro, T),
                    _pick(returns, micro, T),
                    cfg,
                    agg_params,
                    value_agg_params,
                )
                if not torch.isfinite(out.loss):
                    raise Diverged(f"non-finite loss {out.loss.item()} in the update")
                out.loss.backward()
                for k, v in {**out.terms, **{f"diag/{k}": v for k, v in out.stats.items()}}.items():
                    sums.setdefault(k, []).append(v.detach().float())
            gn = torch.nn.utils.clip_grad_norm_(params, a.grad_clip if a.grad_clip > 0 else float("inf"))
            if not torch.isfinite(gn):
                raise Diverged(f"non-finite gradient norm {gn.item()}")
            sums.setdefault("diag/grad_norm", []).append(gn.detach().float())
            optimizer.step()
            steps += 1
    policy.model.eval()
    # loss terms are pre-scaled so micro-batch terms sum to the mini-batch loss: report the
    # mean mini-batch loss; other stats are means over micro-batches.
    reduced = {
        k: torch.stack(v).sum() / steps if k.startswith("loss/") else torch.stack(v).nanmean() for k, v in sums.items()
    }
    reduced.update(_update_diagnostics(batch, fwd, adv, cfg))
    names = list(reduced)
    values = torch.stack([reduced[k].float() for k in names]).tolist()  # one sync point
    return dict(zip(names, values))
