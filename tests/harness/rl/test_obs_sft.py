"""Observation SFT (ECHO, `algo.obs_sft.coef`; docs/algorithms.md#obs-sft): which tokens it
trains, its value against a hand computation on real rollouts, its gradient's independence of
micro-batching, and that it is off by default."""

from __future__ import annotations

import json

import pytest
import torch

from harness.model.logprobs import token_logprobs
from harness.rl.batch import build_batch
from harness.rl.behaviour import advantages, behaviour_forward
from harness.rl.losses import observation_nll
from harness.rl.update import _micro_batches, _minibatch_step
from tests.helpers import baseline as baseline_run
from tests.helpers.configs import merge
from tests.helpers.episodes import PAD, episode
from tests.helpers.update import cfg_of, grads, perturb


def test_the_observation_mask_holds_the_segments_after_the_prompt_but_not_complaints():
    # prompt [1,2,3]; a0 [10,11]; obs1 [4,5]; a1 [12]; obs2 [6]; a2 [13,14,15]
    ep = episode()
    b = build_batch([ep], concatenated=True, mask_observations=True, pad_id=PAD)
    assert b.obs_mask.tolist() == [[0, 0, 0, 0, 0, 1, 1, 0, 1, 0, 0, 0]]
    assert b.loss_mask.tolist() == [[0, 0, 0, 1, 1, 0, 0, 1, 0, 1, 1, 1]]  # the policy loss keeps its mask
    ep.steps[1].format_error = True  # obs2 answers a malformed action: the env's complaint
    b = build_batch([ep], concatenated=True, mask_observations=True, pad_id=PAD)
    assert b.obs_mask.tolist() == [[0, 0, 0, 0, 0, 1, 1, 0, 0, 0, 0, 0]]
    # per-step rows: each segment once, in the row of the action it precedes
    b = build_batch([episode()], concatenated=False, mask_observations=True, pad_id=PAD)
    assert b.obs_mask.tolist() == [
        [0, 0, 0, 0, 0] + [0] * 7,
        [0, 0, 0, 0, 0, 1, 1, 0] + [0] * 4,
        [0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0],
    ]
    sub = b.rows(torch.tensor([1]))
    assert sub.obs_mask.tolist() == [[0, 0, 0, 0, 0, 1, 1, 0]]


@pytest.mark.parametrize("layout", ["concatenated", "per-step"])
def test_the_term_is_the_mean_observation_nll_and_micro_batching_changes_nothing(env, layout):
    cfg = cfg_of(layout=layout)
    cfg.algo.obs_sft.coef = 0.5
    t = env.trainer(cfg)
    batch = env.batch(t, cfg)
    assert batch.obs_mask.sum() > 0 and (batch.obs_mask * batch.action_mask).sum() == 0
    # the value: -mean logp over the observation tokens, from an independent forward
    with torch.no_grad():
        lp, _ = token_logprobs(t.policy.model, batch.input_ids, batch.attention_mask, temperature=1.0)
    expected = -(lp * batch.obs_mask).sum() / batch.obs_mask.sum()
    got = observation_nll(lp, batch.obs_mask, None)
    assert torch.allclose(got, expected) and expected > 0
    # the gradient: full-batch and one-row micro-batches agree, and the term changes it
    fwd = behaviour_forward(t.policy, batch, cfg)
    adv, returns = advantages(batch, fwd, cfg)
    perturb(t.policy, 3)
    rows = torch.arange(batch.num_rows)
    found = {}
    for coef, size in ((0.5, batch.num_rows), (0.5, 1), (0.0, batch.num_rows)):
        c = cfg.model_copy(deep=True)
        c.algo.obs_sft.coef, c.algo.micro_batch_size = coef, size
        t.policy.model.train()
        t.policy.model.zero_grad(set_to_none=True)
        sums: dict = {}
        _minibatch_step(t.policy, batch, rows, adv, returns, fwd, c, sums)
        found[(coef, size)] = grads(t.policy)
        if coef:
            assert "loss/obs_sft" in sums
    t.policy.model.eval()
    assert len(_micro_batches(batch, rows, 1)) > 1
    full, one, off = found[(0.5, batch.num_rows)], found[(0.5, 1)], found[(0.0, batch.num_rows)]
    assert (full - one).norm() <= 1e-5 * full.norm()
    assert (full - off).norm() > 1e-3 * full.norm()


QUICK = merge(baseline_run.CONFIG, {"train": {"updates": 2, "eval_every": 0, "mi_every": 0, "eval_episodes": 1}})


def test_off_by_default_and_logged_when_on(tmp_path):
    default = baseline_run.run(tmp_path / "default", QUICK)
    zero = baseline_run.run(tmp_path / "zero", merge(QUICK, {"algo": {"obs_sft": {"coef": 0.0}}}))
    assert json.dumps(default) == json.dumps(zero) and "loss/obs_sft" not in default[1]
    on = baseline_run.run(tmp_path / "on", merge(QUICK, {"algo": {"obs_sft": {"coef": 0.1}}}))
    assert on[1]["loss/obs_sft"] > 0 and on[1]["loss/total"] != default[1]["loss/total"]
    assert on[2]["diag/kl_k3"] != default[2]["diag/kl_k3"]  # the update moved the policy differently
