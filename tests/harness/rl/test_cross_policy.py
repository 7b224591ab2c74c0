"""Cross-policy sampling (AgentRL, `rollout.cross_policy`; docs/algorithms.md#off-policy): each
turn's action comes from a pool member drawn per (episode, turn) with a seeded generator; the
member and its log-probs are recorded; `train_on: current` takes the stale members' turns out of
the loss; the pool's snapshots follow `refresh_every` and survive a resume."""

from __future__ import annotations

import copy
import json

import torch

from harness.rl.batch import build_batch
from harness.rl.rollout import CrossPolicy, collect
from harness.rl.sampler_copy import StalePool
from tests.helpers import baseline as baseline_run
from tests.helpers.configs import merge
from tests.helpers.episodes import PAD, episode
from tests.helpers.rollout import (
    CounterEnv,
    FakeVectorEnv,
    concatenated,
    eot_biased,
    full_forward_logprobs,
    make_cfg,
    run,
)


def test_draws_follow_the_probability_and_the_seed():
    def draw(prob, seed, n=4000, members=3):
        return CrossPolicy([None] * members, prob, torch.Generator().manual_seed(seed)).draw(n)

    assert set(draw(0.0, 0)) == {0} and 0 not in draw(1.0, 0)
    d = draw(0.3, 1)
    stale = [m for m in d if m > 0]
    assert abs(len(stale) / len(d) - 0.3) < 0.03 and set(stale) == {1, 2, 3}
    assert draw(0.3, 1) == d and draw(0.3, 2) != d  # seeded


def test_each_turn_is_generated_and_scored_by_its_member(chat):  # noqa: F811
    """Two members that differ (another random model): every recorded action's log-probs are those of
    the member that generated it, under a full forward of the exact context; both members occur."""
    current = eot_biased(chat)
    other = copy.deepcopy(current)
    torch.manual_seed(1)
    with torch.no_grad():
        for p in other.inner.parameters():
            p.add_(0.05 * torch.randn_like(p))
    cfg = make_cfg(turns__max=4)
    cross = CrossPolicy([other], 0.5, torch.Generator().manual_seed(3))
    eps = run(current, chat, [(1, 0), (2, 0), (3, 1), (4, 1)], cfg, env=CounterEnv, cross=cross)
    members = [st.member for ep in eps for st in ep.steps]
    assert 0 in members and 1 in members
    for ep in eps:
        seq, targets = concatenated(ep)
        per_pos = {pos: lp for pos, _, lp in targets}
        lp_cur = full_forward_logprobs(current, seq, cfg.rollout.temperature)
        lp_oth = full_forward_logprobs(other, seq, cfg.rollout.temperature)
        k = 0
        for st in ep.steps:
            for _ in st.action_ids:
                pos, tok, lp = targets[k]
                ref = (lp_oth if st.member == 1 else lp_cur)[pos, tok].item()
                assert abs(ref - per_pos[pos]) < 1e-4
                k += 1


def test_a_pool_of_copies_samples_as_the_current_policy(chat):  # noqa: F811
    """Members identical to the current policy: the same episodes as without a pool (per-episode
    streams, contexts prefilled from scratch in both), only the member labels differ."""
    model = eot_biased(chat)
    cfg = make_cfg(turns__max=4)
    tasks = [(1, 0), (2, 0), (3, 1)]
    streams = [torch.Generator().manual_seed(10 + i) for i in range(len(tasks))]
    plain = _collect(model, chat, tasks, cfg, streams, reuse_cache=False)
    streams = [torch.Generator().manual_seed(10 + i) for i in range(len(tasks))]
    cross = CrossPolicy([copy.deepcopy(model)], 0.5, torch.Generator().manual_seed(0))
    pooled = _collect(model, chat, tasks, cfg, streams, cross=cross)
    for a, b in zip(plain, pooled):
        assert [s.action_ids for s in a.steps] == [s.action_ids for s in b.steps]
        for sa, sb in zip(a.steps, b.steps):
            assert max((abs(x - y) for x, y in zip(sa.sampler_logprobs, sb.sampler_logprobs)), default=0) < 1e-5
    assert any(s.member == 1 for e in pooled for s in e.steps)


def _collect(model, chat, tasks, cfg, streams, **kw):  # noqa: F811 - chat is the fixture's value
    venv = FakeVectorEnv(CounterEnv, len(tasks))
    return collect(model, chat, venv, tasks, cfg, generator=streams, instructions=venv.instructions, **kw)


def test_train_on_current_leaves_the_stale_turns_out_of_the_loss():
    eps = [episode(0), episode(1)]
    eps[0].steps[1].member = 1  # the second action of the first episode came from a stale member
    for concatenated_layout in (True, False):
        kw = {"concatenated": concatenated_layout, "mask_observations": False, "pad_id": PAD}
        full = build_batch(eps, **kw)
        cur = build_batch(eps, drop_stale=True, **kw)
        stale_tokens = full.action_id == 1  # action ids: episode 0 turn 0 -> 0, turn 1 -> 1
        assert stale_tokens.any() and (full.loss_mask[stale_tokens] > 0).all()
        assert (cur.loss_mask[stale_tokens] == 0).all()
        assert torch.equal(cur.loss_mask[~stale_tokens], full.loss_mask[~stale_tokens])


def test_the_pool_refreshes_every_r_updates():
    model = torch.nn.Sequential(torch.nn.Linear(2, 2))
    pool = StalePool(model, "same", members=2, refresh_every=2)
    seen = []
    for u in range(1, 8):
        pool.record(u)
        seen.append([m[0].weight[0, 0].item() for m in pool.members()])
        with torch.no_grad():
            model[0].weight.fill_(float(u))
    w0 = seen[0][0]
    # snapshots at the start of updates 1, 3, 5, 7 hold the weights after 0, 2, 4, 6 updates
    assert seen == [[w0, w0], [w0, w0], [2.0, w0], [2.0, w0], [4.0, 2.0], [4.0, 2.0], [6.0, 4.0]]


QUICK = merge(
    baseline_run.CONFIG,
    {"train": {"updates": 3, "eval_every": 0, "mi_every": 0, "eval_episodes": 1}},
)


def test_cross_policy_in_the_trainer_is_reproducible_and_off_by_default(tmp_path):
    """Members 0 is the synchronous trainer (no new metric); with a pool the stale turns' share is
    logged, the stale log-probs show as sampler-trainer mismatch, runs are bit-reproducible, and
    train_on: current changes the update."""
    sync = baseline_run.run(tmp_path / "sync", QUICK)
    off = baseline_run.run(tmp_path / "off", merge(QUICK, {"rollout": {"cross_policy": {"members": 0}}}))
    assert json.dumps(sync) == json.dumps(off) and "rollout/stale_turn_frac" not in sync[1]
    xp = {"rollout": {"cross_policy": {"members": 1, "prob": 0.5, "refresh_every": 2}}}
    a = baseline_run.run(tmp_path / "a", merge(QUICK, xp))
    b = baseline_run.run(tmp_path / "b", merge(QUICK, xp))
    assert json.dumps(a) == json.dumps(b)
    assert all(0.0 < a[u]["rollout/stale_turn_frac"] < 1.0 for u in (1, 2, 3))
    # update 2: the member holds the weights before RL while the trainer moved once
    assert abs(a[2]["diag/mismatch_k1"]) > 1e-4 > abs(sync[2]["diag/mismatch_k1"])
    current_only = merge(xp, {"rollout": {"cross_policy": {"train_on": "current"}}})
    cur = baseline_run.run(tmp_path / "cur", merge(QUICK, current_only))
    assert cur[1]["rollout/stale_turn_frac"] == a[1]["rollout/stale_turn_frac"]  # same rollouts at update 1
    assert cur[1]["perf/train_tokens"] == a[1]["perf/train_tokens"] and cur[1]["loss/policy"] != a[1]["loss/policy"]
