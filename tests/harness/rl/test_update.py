"""The update's math on real rollouts of a tiny policy: KL in the reward, the SAMPO mask, the
entropy diagnostic, eval-mode behaviour passes, task ids (docs/algorithms.md#clipping to #kl)."""

from __future__ import annotations

import pytest
import torch

from algorithms import AGGREGATION, KL_ESTIMATOR, POLICY_LOSS
from algorithms.aggregation import global_counts
from algorithms.utils import masked_mean
from harness.config.loading import validate_run_config
from harness.config.schema import RunConfig
from harness.model.logprobs import token_logprobs
from harness.model.pipeline import attach_adapter, base_model
from harness.rl.batch import build_batch, state_id
from harness.rl.behaviour import advantages, behaviour_forward
from harness.rl.demos import Demonstrations
from harness.rl.losses import Denominators, loss_terms
from harness.rl.update import make_optimizer, run_update
from tests.helpers.update import BASE, GRPO, cfg_of, perturb, raw_config


def off_policy(env, cfg):
    """(trainer, batch, behaviour pass) with the adapter then moved away from the behaviour policy
    and the reference (so ratios differ from 1 and KL is not 0)."""
    t = env.trainer(cfg)
    batch = env.batch(t, cfg)
    perturb(t.policy, 5)
    fwd = behaviour_forward(t.policy, batch, cfg)
    return t, batch, fwd


ESTIMATORS = [("grpo", "group"), ("dr_grpo", "group"), ("rloo", "group"), ("gigpo", "group"), ("grpo", "env_std")]


@pytest.mark.parametrize("estimator,norm", ESTIMATORS + [("reinforce_pp", "group")])
def test_kl_in_the_reward_reaches_every_estimator(env, estimator, norm):
    cfgs = [cfg_of(estimator=estimator, norm=norm, kl=("k1", "reward")) for _ in range(2)]
    cfgs[1].algo.kl.coef = 0.0
    t, batch, fwd = off_policy(env, cfgs[0])
    with_kl, without = (batch.to_stream(advantages(batch, fwd, c)[0]) for c in cfgs)
    assert (with_kl - without).abs().max() > 1e-3, "KL in the reward did not change the advantages"


def test_kl_in_the_reward_lowers_the_outcome_by_the_summed_trajectory_kl(env):
    cfg = cfg_of(estimator="dr_grpo", kl=("k1", "reward"))
    t, batch, fwd = off_policy(env, cfg)
    beta = cfg.algo.kl.coef
    kl = batch.to_stream(KL_ESTIMATOR.get("k1")(fwd.old_logp, fwd.ref_logp) * batch.action_mask).sum(1)  # (N,)
    R = batch.rewards - beta * kl
    expected = torch.stack([R[i] - R[batch.group == batch.group[i]].mean() for i in range(len(R))])
    adv = batch.to_stream(advantages(batch, fwd, cfg)[0])  # (N, Ts)
    first = adv.gather(1, batch.stream_mask.argmax(1, keepdim=True)).squeeze(1)  # each trajectory's advantage
    assert torch.allclose(first, expected, atol=1e-5)


def test_sampo_mask_renormalises_the_policy_loss_and_keeps_kl_on_every_token(env):
    cfg = cfg_of(clip={**GRPO["clip"], "level": "sequence", "seq_mask": True}, kl=("k3", "loss"))
    t, batch, fwd = off_policy(env, cfg)
    adv, _ = advantages(batch, fwd, cfg)
    mb = batch.rows(torch.arange(batch.num_rows))
    T = mb.input_ids.shape[1]
    keep = mb.loss_mask.clone()
    keep[mb.action_id == int(mb.action_id.max())] = 0  # drop one action
    counts = global_counts(mb.loss_mask, cfg.algo.agg_params)
    den = Denominators(loss=counts, policy=global_counts(keep, cfg.algo.agg_params), value=counts)
    t.policy.model.eval()
    out = loss_terms(t.policy, mb, adv[:, :T], fwd.old_logp[:, :T], fwd.ref_logp[:, :T], None, None, cfg, den, keep)
    plain = loss_terms(
        t.policy,
        mb,
        adv[:, :T],
        fwd.old_logp[:, :T],
        fwd.ref_logp[:, :T],
        None,
        None,
        cfg,
        Denominators(counts, counts, counts),
    )
    logp, _ = token_logprobs(t.policy.model, mb.input_ids, mb.attention_mask, temperature=cfg.rollout.temperature)
    pl, _ = POLICY_LOSS.get("sequence")(
        logp, fwd.old_logp[:, :T], adv[:, :T], keep, mb.action_id, mb.traj_id, cfg.algo.clip.params
    )
    assert torch.allclose(out.terms["loss/policy"], (pl * keep).sum() / keep.sum(), atol=1e-6)  # kept tokens only
    assert torch.allclose(out.terms["loss/kl"], plain.terms["loss/kl"])  # KL still over every token


def test_entropy_diagnostic_does_not_depend_on_the_aggregation(env):
    values = []
    for agg in AGGREGATION.names():
        cfg = cfg_of(agg=agg)
        t = env.trainer(cfg)
        batch = env.batch(t, cfg)
        m = run_update(t.policy, make_optimizer(t.policy, cfg), batch, cfg, torch.Generator().manual_seed(0))
        values.append(m["diag/entropy"])
    assert len(set(values)) == 1, values
    # ... and it is the plain mean of the full-vocabulary entropy over action tokens
    env.trainer(cfg)  # the weights the update started from
    _, ent = token_logprobs(
        t.policy.model, batch.input_ids, batch.attention_mask, temperature=cfg.rollout.temperature, with_entropy=True
    )
    assert abs(values[0] - masked_mean(ent, batch.action_mask).item()) < 1e-5


def test_constrained_runs_log_both_entropies(env):
    cfg = cfg_of(constrain=True)
    t = env.trainer(cfg)
    batch = env.batch(t, cfg)
    m = run_update(t.policy, make_optimizer(t.policy, cfg), batch, cfg, torch.Generator().manual_seed(0))
    assert m["diag/entropy_constrained"] < m["diag/entropy"]  # the admissible set is a subset of the vocabulary


def test_behaviour_reference_and_value_passes_run_in_eval_mode(env):
    """With LoRA dropout the behaviour log-probs must still be the deterministic policy's."""
    raw = raw_config({**GRPO, "critic": True, "estimator": "gae"})
    raw["model"] = {**BASE["model"], "lora": {"r": 4, "alpha": 8, "dropout": 0.3}}
    cfg = validate_run_config(raw, "test")
    t = env.trainer(cfg_of())  # the base model is in the cache
    policy = _dropout_policy(cfg)
    perturb(policy, 3)  # B != 0, so the dropout on the LoRA branch changes outputs in train mode
    batch = env.batch(t, cfg)
    policy.model.train()
    first, second = behaviour_forward(policy, batch, cfg), behaviour_forward(policy, batch, cfg)
    assert torch.equal(first.old_logp, second.old_logp) and torch.equal(first.old_values, second.old_values)
    assert policy.model.training  # the caller's mode is restored
    policy.model.eval()
    lp, _ = token_logprobs(policy.model, batch.input_ids, batch.attention_mask, temperature=cfg.rollout.temperature)
    assert torch.equal(lp, first.old_logp)


def _dropout_policy(cfg: RunConfig):
    from harness.model.cache import cache_dir

    source, info = base_model(cfg, cache_dir(), Demonstrations.of(cfg))
    return attach_adapter(cfg, source, info, "cpu")


def test_task_and_env_ids_reach_the_batch(env, monkeypatch):
    cfg = cfg_of(norm="task", estimator="dr_grpo", kl=("k1", "reward"))
    t = env.trainer(cfg)
    perturb(t.policy, 5)  # KL in the reward makes every advantage non-zero
    eps = [e for e in env.episodes[False] if e.steps]
    batch = t.learner.training_batch(eps, cfg)
    assert set(batch.task.tolist()) == {state_id("frozenlake/frozenlake")}
    assert set(batch.env.tolist()) == {state_id("frozenlake")}
    monkeypatch.setattr(t.worker.env, "task_type", lambda seed: f"kind{seed % 2}")  # an env with two task kinds
    batch = t.learner.training_batch(eps, cfg)
    assert len(set(batch.task.tolist())) == 2
    fwd = behaviour_forward(t.policy, batch, cfg)
    by_task = advantages(batch, fwd, cfg)[0]
    by_batch = advantages(batch, fwd, cfg_of(norm="batch", estimator="dr_grpo", kl=("k1", "reward")))[0]
    assert not torch.allclose(by_task, by_batch)


def test_alfworld_reports_its_task_types():
    from envs.alfworld_env import AlfWorld

    env = AlfWorld({})
    assert len({env.task_type(s) for s in range(0, 24, 2)}) == 6


def test_build_batch_keeps_the_ids_it_is_given():
    from tests.helpers.episodes import PAD, episode

    b = build_batch(
        [episode(), episode(group=1)],
        concatenated=True,
        mask_observations=True,
        pad_id=PAD,
        task_ids=[5, 9],
        env_ids=[2, 2],
    )
    assert b.task.tolist() == [5, 9] and b.env.tolist() == [2, 2]
