"""Invariance suite: every combination of axis values either runs an update or is rejected at load,
and the update's math does not depend on how the batch is cut or laid out.

For each combination (on real rollouts of a tiny Qwen2 + LoRA policy on FrozenLake):
- the config is rejected at load with a ConfigError, or one update completes with finite metrics;
- the first minibatch's importance ratios are exactly 1 and the KL to the reference is 0 (the fresh
  adapter is the reference, and the behaviour pass is the policy that is trained);
- off-policy (adapter perturbed after the behaviour pass), the gradient of one minibatch with
  micro-batches of 1 row equals the gradient with one micro-batch (relative 1e-5);
- for `context.policy: full` the concatenated and per-step layouts give the same advantages on every
  action token (both are computed on the trajectory stream of the same episodes).

The combinations. The literal product of all values (clip level x SAMPO mask x agg x estimator x
norm x filter x KL estimator x KL placement x critic x layout x mask x constrained decoding x
off-policy correction) has millions of members, so the slow mark runs it factorised instead:
- LOSS: every clip level x SAMPO mask x agg x KL placement x critic x layout x observation mask x
  constrained decoding (the axes the loss, its denominators and its segments depend on), with the
  estimator / norm / filter / KL estimator cycled through their values;
- ADVANTAGE: every estimator x norm x filter x KL estimator x KL placement x layout x observation
  mask (the axes the advantages depend on), with the loss-side axes cycled;
- CORRECTION: every off-policy correction (and its rejection convention and sequence unit) x agg x
  layout x observation mask (what its weights, rejections and denominators depend on), with the clip
  level and SAMPO mask cycled. The sampler's log-probs are moved away from the behaviour policy's
  (noise on the action tokens of every other trajectory), so the corrections weight and reject tokens.
Every value of every axis, and every pair of values that interact in the math, is covered. The
default suite runs a seeded sample of the lists.
"""

from __future__ import annotations

import itertools
import math
import random
from dataclasses import replace

import pytest
import torch

from algorithms import ADV_NORM, ADVANTAGE, AGGREGATION, CORRECTION, GROUP_FILTER, KL_ESTIMATOR, POLICY_LOSS
from harness.config.errors import ConfigError
from harness.config.loading import validate_run_config
from harness.rl.behaviour import advantages, behaviour_forward
from harness.rl.update import _micro_batches, _minibatch_step, make_optimizer, run_update
from tests.helpers.update import NO_CORRECTION, Env, grads, perturb, raw_config

# the tiny model and budgets of the trainer tests, with shorter episodes and one update
CLIP = [
    {"level": level, "seq_mask": mask, "eps_low": 0.2, "eps_high": 0.28, "seq_mask_delta": 1e-3}
    for level in POLICY_LOSS.names()
    for mask in (False, True)
]
# every correction with its defaults, plus the other rejection convention and sequence unit
CORRECTIONS = [{"name": name} for name in CORRECTION.names()] + [
    {"name": "mis_token", "rejected": "zero"},
    {"name": "mis_seq", "unit": "action"},
    {"name": "geo_seq_mask", "rejected": "zero", "unit": "action", "lo": 0.9, "hi": 1.1},
    {"name": "tis_seq", "unit": "action"},
    {"name": "decoupled", "c": 1.5},
]
KL = [("none", "loss")] + [(est, where) for est in ("k1", "k2", "k3") for where in ("loss", "reward")]
LAYOUTS = ("concatenated", "per-step")


def combo(clip, agg, estimator, norm, filt, kl, critic, layout, mask, constrain, correction=NO_CORRECTION) -> dict:
    return {
        "correction": correction,
        "clip": clip,
        "agg": agg,
        "estimator": estimator,
        "norm": norm,
        "filter": filt,
        "kl": kl,
        "critic": critic,
        "layout": layout,
        "mask": mask,
        "constrain": constrain,
    }


def loss_side() -> list[dict]:
    cyc = itertools.cycle(
        itertools.product(ADVANTAGE.names(), ADV_NORM.names(), GROUP_FILTER.names(), ("k1", "k2", "k3"))
    )
    out = []
    for clip, agg, where, critic, layout, mask, constrain in itertools.product(
        CLIP, AGGREGATION.names(), ("loss", "reward"), (False, True), LAYOUTS, (True, False), (False, True)
    ):
        est, norm, filt, kl_est = next(cyc)
        est = ("gae" if layout == "concatenated" else "reinforce_pp") if critic else est
        out.append(combo(clip, agg, est, norm, filt, (kl_est, where), critic, layout, mask, constrain))
    return out


def advantage_side() -> list[dict]:
    cyc = itertools.cycle(itertools.product(CLIP, AGGREGATION.names(), (False, True)))
    out = []
    for est, norm, filt, kl, layout, mask in itertools.product(
        ADVANTAGE.names(), ADV_NORM.names(), GROUP_FILTER.names(), KL, LAYOUTS, (True, False)
    ):
        clip, agg, constrain = next(cyc)
        out.append(combo(clip, agg, est, norm, filt, kl, est == "gae", layout, mask, constrain))
    return out


def correction_side() -> list[dict]:
    cyc = itertools.cycle(
        itertools.product(CLIP, ADVANTAGE.names(), ("k1", "k2", "k3"), ("loss", "reward"), (False, True))
    )
    out = []
    for corr, agg, layout, mask in itertools.product(CORRECTIONS, AGGREGATION.names(), LAYOUTS, (True, False)):
        clip, est, kl_est, where, constrain = next(cyc)
        est = "grpo" if est == "gae" else est  # gae needs a critic and the concatenated layout
        out.append(combo(clip, agg, est, "group", "none", (kl_est, where), False, layout, mask, constrain, corr))
    return out


ALL = loss_side() + advantage_side() + correction_side()
SAMPLE = random.Random(0).sample(loss_side() + advantage_side(), 14) + random.Random(3).sample(correction_side(), 4)


def combo_id(c: dict) -> str:
    clip = c["clip"]["level"] + ("+mask" if c["clip"]["seq_mask"] else "")
    corr = [] if c["correction"] == NO_CORRECTION else ["corr:" + ",".join(map(str, c["correction"].values()))]
    return "-".join(
        corr
        + [
            clip,
            c["agg"],
            c["estimator"],
            c["norm"],
            c["filter"],
            "/".join(c["kl"]),
            "critic" * c["critic"],
            c["layout"],
            "maskon" if c["mask"] else "maskoff",
            "constr" * c["constrain"],
        ]
    )


def mismatched(batch):
    """The batch with the sampler's log-probs moved off the behaviour policy's on the action tokens of
    every other trajectory (as a sampler in another precision or a stale one would), so the corrections
    weight and reject some tokens and sequences and keep the others."""
    noise = 0.3 * torch.randn(batch.sampler_logp.shape, generator=torch.Generator().manual_seed(13))
    moved = batch.action_mask * (batch.traj_id % 2 == 1)
    return replace(batch, sampler_logp=batch.sampler_logp + noise * moved)


def check(env: Env, c: dict) -> None:
    try:
        cfg = validate_run_config(raw_config(c), "combo")
    except ConfigError as e:  # rejected at load: one paragraph naming the source
        assert str(e).startswith("combo:") and "Traceback" not in str(e)
        return
    t = env.trainer(cfg)
    batch = env.batch(t, cfg)
    if batch is None:  # the filter kept nothing: the trainer skips such an update
        return
    if c.get("correction", NO_CORRECTION) != NO_CORRECTION:
        batch = mismatched(batch)
    policy, a = t.policy, cfg.algo
    # 1. one update completes; the first (only) minibatch starts exactly on-policy at the reference
    metrics = run_update(policy, make_optimizer(policy, cfg), batch, cfg, torch.Generator().manual_seed(0))
    assert all(v == v for k, v in metrics.items() if k.startswith("loss/")), metrics
    assert all(math.isfinite(v) for k, v in metrics.items() if k.startswith("diag/mismatch_")), metrics
    everything_rejected = metrics["diag/mismatch_masked_token_frac"] == 1.0  # no token left for ratio stats
    assert everything_rejected or (metrics["diag/ratio_min"] == 1.0 and metrics["diag/ratio_max"] == 1.0), metrics
    assert metrics["diag/kl_k3"] == 0.0 and metrics["diag/kl_k3_max"] == 0.0
    # 2. off-policy, micro-batches of one row give the full-batch gradient
    env.trainer(cfg)  # reset the weights
    fwd = behaviour_forward(policy, batch, cfg)
    adv, returns = advantages(batch, fwd, cfg)
    perturb(policy, 11)
    policy.model.train()
    rows = torch.arange(batch.num_rows)
    found = []
    budget = int(batch.attention_mask.sum(1).max()) * 2  # token-budget micro-batches of about two rows
    for size, tokens in ((batch.num_rows, 0), (1, 0), (batch.num_rows, budget)):
        cfg_size = cfg.model_copy(
            update={"algo": a.model_copy(update={"micro_batch_size": size, "micro_batch_tokens": tokens})}
        )
        policy.model.zero_grad(set_to_none=True)
        policy.value_head.zero_grad(set_to_none=True)
        _minibatch_step(policy, batch, rows, adv, returns, fwd, cfg_size, {})
        found.append(grads(policy))
    policy.model.eval()
    full, one, packed = found  # (a zero gradient is legitimate: e.g. groups without reward variance and no KL term)
    assert len(_micro_batches(batch, rows, 1)) > 1  # the split really happened
    assert len(_micro_batches(batch, rows, batch.num_rows, budget)) > 1
    for other in (one, packed):
        assert (full - other).norm() <= 1e-5 * full.norm() + 1e-12, ((full - other).norm(), full.norm())
    # the behaviour pass packed by length returns every row in its place
    cfg_packed = cfg.model_copy(update={"algo": a.model_copy(update={"micro_batch_tokens": budget})})
    fwd_packed = behaviour_forward(policy, batch, cfg_packed)
    fwd_rows = behaviour_forward(policy, batch, cfg)
    for name in ("old_logp", "ref_logp", "entropy"):
        x, y = getattr(fwd_rows, name), getattr(fwd_packed, name)
        assert torch.allclose(x * batch.attention_mask, y * batch.attention_mask, atol=1e-5), name
    # 3. both layouts give the same advantages on every action token of the same episodes
    if c["estimator"] != "gae":
        other = "per-step" if c["layout"] == "concatenated" else "concatenated"
        raw = raw_config({**c, "layout": other})
        cfg2 = validate_run_config(raw, "combo")
        batch2 = env.batch(t, cfg2)
        env.trainer(cfg)
        perturb(policy, 12)  # a policy away from the reference, so KL-in-reward is not 0
        adv1 = batch.to_stream(advantages(batch, behaviour_forward(policy, batch, cfg), cfg)[0])
        adv2 = batch2.to_stream(advantages(batch2, behaviour_forward(policy, batch2, cfg2), cfg2)[0])
        assert torch.allclose(adv1, adv2, atol=1e-5), (adv1 - adv2).abs().max()


@pytest.mark.parametrize("c", SAMPLE, ids=combo_id)
def test_sampled_combination(env, c):
    check(env, c)


@pytest.mark.slow
@pytest.mark.parametrize("c", ALL, ids=combo_id)
def test_every_combination(env, c):
    check(env, c)


def test_the_lists_cover_every_value_of_every_axis():
    for key, names in (
        ("estimator", ADVANTAGE.names()),
        ("norm", ADV_NORM.names()),
        ("filter", GROUP_FILTER.names()),
        ("agg", AGGREGATION.names()),
    ):
        assert {c[key] for c in ALL} == set(names), key
    assert {c["kl"][0] for c in ALL} == set(KL_ESTIMATOR.names())
    assert {(c["clip"]["level"], c["clip"]["seq_mask"]) for c in ALL} == {(x["level"], x["seq_mask"]) for x in CLIP}
    assert {x["level"] for x in CLIP} == set(POLICY_LOSS.names())
    assert {c["correction"]["name"] for c in ALL} == set(CORRECTION.names())
    assert {(c["correction"]["name"], c["agg"], c["layout"], c["mask"]) for c in correction_side()} == {
        (x["name"], agg, lay, m)
        for x in CORRECTIONS
        for agg in AGGREGATION.names()
        for lay in LAYOUTS
        for m in (True, False)
    }
    assert {(c["layout"], c["mask"], c["constrain"], c["critic"]) for c in loss_side()} >= {
        (lay, m, con, cr) for lay in LAYOUTS for m in (True, False) for con in (True, False) for cr in (True, False)
    }
