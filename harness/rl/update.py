"""The optimisation step: epochs x minibatches x micro-batches over one training batch."""
from __future__ import annotations

from dataclasses import replace

import torch

from algorithms import KL_ESTIMATOR
from algorithms.aggregation import global_counts
from algorithms.utils import masked_mean
from harness.batch import TrainBatch
from harness.config import RunConfig
from harness.update import Diverged, Forward, _loss_terms, advantages, behaviour_forward


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
    return [torch.cat([rows_of[i] for i in part.tolist()])
            for part in torch.tensor_split(torch.arange(len(rows_of)), n) if len(part)]


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
    out = {"diag/logprob_mismatch": masked_mean((fwd.old_logp - batch.sampler_logp).abs(), m),
           "diag/logprob_mismatch_max": ((fwd.old_logp - batch.sampler_logp).abs() * m).max(),
           "diag/adv_mean": masked_mean(adv, batch.loss_mask),
           "diag/adv_abs_mean": masked_mean(adv.abs(), batch.loss_mask),
           "diag/rows": torch.tensor(float(batch.num_rows)),
           "diag/trained_tokens": batch.loss_mask.sum()}
    k3 = KL_ESTIMATOR.get("k3")(fwd.old_logp, fwd.ref_logp)
    out["diag/kl_k1"] = masked_mean(fwd.old_logp - fwd.ref_logp, m)
    out["diag/kl_k3"] = masked_mean(k3, m)
    out["diag/kl_k3_max"] = (k3 * m).max()
    return out


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
            agg_params = replace(global_counts(batch.loss_mask[mb_idx]), t_const=a.agg_len)
            # the critic is fitted on action tokens only (observations have no returns)
            value_agg_params = replace(global_counts(batch.action_mask[mb_idx]), t_const=a.agg_len)
            optimizer.zero_grad(set_to_none=True)
            for micro in _micro_batches(batch, mb_idx, a.micro_batch_size):
                mb = batch.rows(micro)
                T = mb.input_ids.shape[1]
                pick = lambda x: None if x is None else x[micro, :T]  # noqa: E731
                loss, terms, stats, *_ = _loss_terms(policy, mb, adv[micro, :T], fwd.old_logp[micro, :T],
                                                     pick(fwd.ref_logp), pick(fwd.old_values), pick(returns),
                                                     cfg, agg_params, value_agg_params)
                if not torch.isfinite(loss):
                    raise Diverged(f"non-finite loss {loss.item()} in the update")
                loss.backward()
                for k, v in {**terms, **{f"diag/{k}": v for k, v in stats.items()}}.items():
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
    reduced = {k: torch.stack(v).sum() / steps if k.startswith("loss/") else torch.stack(v).nanmean()
               for k, v in sums.items()}
    reduced.update(_update_diagnostics(batch, fwd, adv, cfg))
    names = list(reduced)
    values = torch.stack([reduced[k].float() for k in names]).tolist()  # one sync point
    return dict(zip(names, values))
