"""One RL update on an assembled batch, top to bottom:

the update plan (harness.rl.plan: where the behaviour log-probs come from, whether the reference runs)
-> behaviour log-probs (recomputed, no grad, or the sampler's; or, in a one-step on-policy update, each
   micro-batch's training forward's own, filled in below) + reference log-probs [+ values]
-> off-policy correction (algo.correction) from the sampler's and the behaviour log-probs
-> advantages (algo.adv.estimator, then algo.adv.norm) on the trajectory token stream -> rows
-> for epoch, minibatch (whole trajectories): for micro-batch: loss (`harness.rl.losses`)
   -> backward; clip grad -> optimizer step
-> diagnostics reduced once (one sync point)
"""

from __future__ import annotations

import time
from dataclasses import replace

import torch

from algorithms import KL_ESTIMATOR
from algorithms.aggregation import global_counts
from algorithms.policy_loss import negative_advantage_seq_mask
from algorithms.types import AggParams
from algorithms.utils import masked_mean
from harness.config.errors import Diverged
from harness.config.schema import RunConfig
from harness.model.precision import casts_kept
from harness.rl.batch import TrainBatch, groups_shared, pack_by_tokens, pack_units, prefix_units
from harness.rl.behaviour import Forward, advantages, behaviour_forward
from harness.rl.distill import distill_gap
from harness.rl.losses import Denominators, head_positions, loss_terms, policy_forward
from harness.rl.mismatch import Correction, batch_correction, mismatch_diagnostics
from harness.rl.plan import DEFAULT_PLAN, UpdatePlan


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


def _micro_batches(
    batch: TrainBatch, rows: torch.Tensor, size: int, tokens: int = 0, prefix: str | None = None
) -> list[torch.Tensor]:
    """Split `rows` into micro-batches of at most `size` rows, never splitting a trajectory
    (a trajectory longer than `size` rows gets a micro-batch of its own). With a token budget
    (`tokens` > 0, algo.micro_batch_tokens) whole trajectories are packed by length instead. With a
    shared prefix (`prefix` shares groups, the update plan's), whole groups, each costing its packed length.
    The padding-free layout keeps these micro-batches (the same work as the padded rows, minus the padding)."""
    traj = _row_traj(batch)[rows]
    trajs: dict[int, list[int]] = {}  # positions in `rows` of each trajectory, whole units below
    for k, t in enumerate(traj.tolist()):
        trajs.setdefault(t, []).append(k)
    if groups_shared(prefix):
        units, lengths = prefix_units(batch, rows.tolist(), list(trajs.values()))
        return [rows[torch.tensor(sorted(p))] for p in pack_units(units, lengths, size, tokens)]
    if tokens > 0:
        lengths = batch.attention_mask[rows].sum(1).tolist()
        groups = list(trajs.values())
        packed = pack_by_tokens(groups, [max(int(lengths[k]) for k in g) for g in groups], tokens)
        return [rows[torch.tensor(sorted(p))] for p in packed]
    out, cur = [], []
    for k in range(len(rows)):
        starts_traj = k == 0 or traj[k] != traj[k - 1]
        if cur and starts_traj and len(cur) + int((traj == traj[k]).sum()) > size:
            out.append(torch.stack(cur))
            cur = []
        cur.append(rows[k])
    return out + ([torch.stack(cur)] if cur else [])


def _update_diagnostics(batch: TrainBatch, fwd: Forward, adv: torch.Tensor) -> dict:
    """KL to the reference (k1, k3 mean; k3 max), entropy, sampler-vs-trainer mismatch, advantage stats."""
    m = batch.action_mask
    out = {
        "diag/logprob_mismatch": masked_mean((fwd.old_logp - batch.sampler_logp).abs(), m),
        "diag/logprob_mismatch_max": ((fwd.old_logp - batch.sampler_logp).abs() * m).max(),
        "diag/adv_mean": masked_mean(adv, batch.loss_mask),
        "diag/adv_abs_mean": masked_mean(adv.abs(), batch.loss_mask),
        "diag/rows": torch.tensor(float(batch.num_rows), device=m.device),
        "diag/trained_tokens": batch.loss_mask.sum(),
        # the behaviour policy's full-vocabulary entropy, a plain mean over action tokens (no algo.agg)
        "diag/entropy": masked_mean(fwd.entropy, m),
    }
    if fwd.entropy_constrained is not None:
        out["diag/entropy_constrained"] = masked_mean(fwd.entropy_constrained, m)
    if fwd.ref_logp is None:  # the plan skipped the reference in this update
        return out
    k3 = KL_ESTIMATOR.get("k3")(fwd.old_logp, fwd.ref_logp)
    out["diag/kl_k1"] = masked_mean(fwd.old_logp - fwd.ref_logp, m)
    out["diag/kl_k3"] = masked_mean(k3, m)
    out["diag/kl_k3_max"] = (k3 * m).max()
    return out


def _pick(x: torch.Tensor | None, rows: torch.Tensor, T: int) -> torch.Tensor | None:
    """x[rows, :T] (a micro-batch's slice of a full-batch tensor), or None."""
    return None if x is None else x[rows, :T]


def _counts(masks: list[torch.Tensor], params: AggParams) -> AggParams:
    """`params` with the aggregation counts of a minibatch given as the masks (B_j, T_j) of its micro-batches."""
    return replace(
        params,
        num_tokens=float(sum(int(m.bool().sum()) for m in masks)),
        num_seqs=float(sum(int(m.bool().any(1).sum()) for m in masks)),
    )


@torch.no_grad()
def _policy_masks(
    policy, batch: TrainBatch, micros, adv, fwd: Forward, cfg: RunConfig, plan: UpdatePlan = DEFAULT_PLAN
) -> list[torch.Tensor]:
    """Each micro-batch's policy-loss mask: the loss mask, minus the actions the SAMPO sequence mask
    drops (`algo.clip.seq_mask`). The drop depends on the current policy, so it is decided in a
    gradient-free pass over the whole minibatch before any micro-batch's loss: the policy loss can
    then divide by the kept tokens of the whole minibatch (renormalised, as ARLArena does)."""
    out = []
    for micro in micros:
        mb = batch.rows(micro)
        if not cfg.algo.clip.seq_mask:
            out.append(mb.loss_mask)
            continue
        T = mb.input_ids.shape[1]
        logp, _, _ = policy_forward(
            policy,
            mb,
            temperature=cfg.rollout.temperature,
            with_entropy=False,
            with_values=False,
            prefix=plan.prefix,
            token_mask=head_positions(mb, cfg, plan.needed_positions),
        )
        out.append(
            negative_advantage_seq_mask(
                logp, fwd.old_logp[micro, :T], adv[micro, :T], mb.loss_mask, mb.action_id, cfg.algo.clip.seq_mask_delta
            )
        )
    return out


def _kept_masks(
    policy, batch, mb_idx, micros, adv, fwd, cfg, corr: Correction, sums, plan: UpdatePlan = DEFAULT_PLAN
) -> list[torch.Tensor]:
    """Each micro-batch's policy-loss mask: the SAMPO mask (`_policy_masks`, its kept share logged), times
    the tokens `algo.correction` keeps under `rejected: drop` (out of the policy loss and its denominator)."""
    masks = _policy_masks(policy, batch, micros, adv, fwd, cfg, plan)
    if cfg.algo.clip.seq_mask:
        total = max(float(batch.loss_mask[mb_idx].bool().sum()), 1.0)
        kept = _counts(masks, cfg.algo.agg_params).num_tokens / total
        sums.setdefault("diag/seq_mask_kept_frac", []).append(torch.tensor(kept))
    if corr.keep is not None:
        masks = [pm * corr.keep[micro, : pm.shape[1]] for micro, pm in zip(micros, masks)]
    return masks


def _minibatch_step(
    policy,
    batch,
    mb_idx,
    adv,
    returns,
    fwd,
    cfg,
    sums,
    corr: Correction | None = None,
    plan: UpdatePlan = DEFAULT_PLAN,
) -> torch.Tensor:
    """Gradient of one minibatch accumulated over its micro-batches; returns the gradient norm.
    `corr`: the batch's off-policy correction (`batch_correction`), computed here when not given.
    Forward passes run in `plan.compute(policy.model)` (the learner's precision), backward passes outside it."""
    a = cfg.algo
    corr = corr if corr is not None else batch_correction(batch, fwd.old_logp, cfg)
    micros = _micro_batches(batch, mb_idx, a.micro_batch_size, a.micro_batch_tokens, plan.prefix)
    with plan.compute(policy.model):
        policy_masks = _kept_masks(policy, batch, mb_idx, micros, adv, fwd, cfg, corr, sums, plan)
    agg = a.agg_params
    denominators = Denominators(
        loss=global_counts(batch.loss_mask[mb_idx], agg),
        policy=_counts(policy_masks, agg),
        # the critic is fitted on action tokens only (observations have no returns)
        value=global_counts(batch.action_mask[mb_idx], agg),
        # observation SFT's own token count (algo.obs_sft), only when the term is on
        obs=global_counts(batch.obs_mask[mb_idx], agg) if a.obs_sft.coef > 0 and batch.obs_mask is not None else None,
    )
    own_mask = a.clip.seq_mask or corr.keep is not None
    first = plan.behaviour == "first_forward"  # the behaviour log-probs come out of these forwards
    for micro, pmask in zip(micros, policy_masks):
        mb = batch.rows(micro)
        T = mb.input_ids.shape[1]
        with plan.compute(policy.model):
            out = loss_terms(
                policy,
                mb,
                adv[micro, :T],
                None if first else fwd.old_logp[micro, :T],
                _pick(fwd.ref_logp, micro, T),
                _pick(fwd.old_values, micro, T),
                _pick(returns, micro, T),
                cfg,
                denominators,
                pmask if own_mask else None,
                _pick(corr.weight, micro, T),
                plan.prefix,
                plan.needed_positions,
            )
        if not torch.isfinite(out.loss):
            raise Diverged(f"non-finite loss {out.loss.item()} in the update")
        out.loss.backward()
        if first:
            fwd.old_logp[micro, :T] = out.old_logp * mb.action_mask  # for the diagnostics after the step
        for k, v in {**out.terms, **{f"diag/{k}": v for k, v in out.stats.items()}}.items():
            sums.setdefault(k, []).append(v.detach().float())
    params = policy.actor_parameters() + (policy.critic_parameters() if a.critic.enabled else [])
    return torch.nn.utils.clip_grad_norm_(params, a.grad_clip if a.grad_clip > 0 else float("inf"))


def run_update(
    policy,
    optimizer,
    batch: TrainBatch,
    cfg: RunConfig,
    generator: torch.Generator,
    seconds: dict[str, float] | None = None,
    plan: UpdatePlan = DEFAULT_PLAN,
) -> dict[str, float]:
    """One update on `batch` under `plan` (harness.rl.plan.make_plan); returns its metrics, reduced once
    at the end. seconds: if a dict, `logprobs_s` and `logprobs_cpu_s` (wall and process CPU time of the
    behaviour and reference log-probs) are set in it; times stay out of the metrics, which are
    bit-identical for the same config and seed. Casts of frozen weights made for the learner's precision
    are kept for the length of the update (harness.model.precision), when its weights cannot change."""
    with casts_kept(policy.model):
        return _run_update(policy, optimizer, batch, cfg, generator, seconds, plan)


def _run_update(policy, optimizer, batch, cfg, generator, seconds, plan) -> dict[str, float]:
    a = cfg.algo
    t0, c0 = time.perf_counter(), time.process_time()
    with plan.compute(policy.model):  # bfloat16 autocast under train.learner.precision, else nothing
        fwd = behaviour_forward(policy, batch, cfg, plan)  # eval mode
    if seconds is not None:
        seconds.update(logprobs_s=time.perf_counter() - t0, logprobs_cpu_s=time.process_time() - c0)
    adv, returns = advantages(batch, fwd, cfg)
    distilled = None
    if a.distill.coef > 0 and batch.teacher_logp is not None:  # algo.distill: after normalisation, unclipped
        gap, dmask = distill_gap(batch, fwd.old_logp)
        adv = a.distill.rl_coef * adv + a.distill.coef * gap
        distilled = {
            "distill/gap_mean": masked_mean(gap, dmask) if dmask.sum() > 0 else torch.tensor(0.0),
            "distill/token_frac": dmask.sum() / batch.action_mask.sum().clamp(min=1),
        }
    corr = batch_correction(batch, fwd.old_logp, cfg)  # depends on rollout and behaviour log-probs only
    sums: dict[str, list[torch.Tensor]] = {}
    steps = 0
    policy.model.train()
    for _ in range(a.epochs):
        for mb_idx in _minibatches(batch, a.minibatches, generator):
            optimizer.zero_grad(set_to_none=True)
            gn = _minibatch_step(policy, batch, mb_idx, adv, returns, fwd, cfg, sums, corr, plan)
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
    reduced.update(_update_diagnostics(batch, fwd, adv))
    if distilled is not None:
        reduced.update(distilled)
    reduced.update(mismatch_diagnostics(batch, fwd.old_logp, corr, cfg))
    reduced.update(plan.metrics())
    names = list(reduced)
    # some values are made on the CPU (the seq-mask share, NaN placeholders): on CUDA, gather them on
    # the device of the log-probs before the single transfer (a GPU check caught the mixed stack)
    dev = fwd.old_logp.device
    values = torch.stack([reduced[k].float().to(dev) for k in names]).tolist()  # one sync point
    return dict(zip(names, values))
