"""On-policy distillation (`algo.distill`, harness.rl.distill; docs/algorithms.md#distillation): where the
hint goes, that the teacher's log-probs land on the right tokens (the behaviour policy as its own
teacher reproduces the behaviour log-probs; the reference as teacher gives ref - old), that hindsight
keeps only hinted turns, and the trainer end to end. Off by default (the baseline record of
test_mismatch.py is unchanged)."""

from __future__ import annotations

from contextlib import contextmanager

import pytest
import torch

from harness.config.schema import RunConfig
from harness.rl.behaviour import behaviour_forward
from harness.rl.distill import HINT_PREFIX, distill_gap, hinted_context, teacher_stream
from harness.rl.judge import RuleJudge, judge_episodes
from harness.store import read_jsonl
from harness.transcript.chat import IM_END, IM_START
from tests.helpers import baseline as baseline_run
from tests.helpers.configs import merge
from tests.helpers.update import cfg_of, perturb


def _episodes(env, cfg):
    return [e for e in env.episodes[cfg.rollout.constrain] if e.steps and e.env_error is None]


def test_the_hint_goes_inside_the_last_user_message(env):
    cfg = cfg_of()
    chat = env.trainer(cfg).policy.chat
    ctx = chat.prompt("Reach the goal.", "P__\n_O_\n__G")
    tail = chat.encode(f"{IM_END}\n{IM_START}assistant\n")
    hinted = hinted_context(chat, ctx, "go down")
    assert hinted[: len(ctx) - len(tail)] == ctx[: -len(tail)] and hinted[-len(tail) :] == tail
    middle = hinted[len(ctx) - len(tail) : -len(tail)]
    assert chat.tokenizer.decode(middle) == HINT_PREFIX + "go down"
    assert hinted_context(chat, ctx[:-1], "go down") is None  # not a turn boundary: no hint


def _policy_teacher(t):
    @contextmanager
    def live():
        with torch.no_grad():
            yield t.policy.model

    return live


@pytest.mark.parametrize("layout", ["concatenated", "per-step"])
def test_teacher_log_probs_land_on_the_action_tokens(env, layout):
    cfg = cfg_of(layout=layout)
    cfg.algo.distill.hint = "none"
    t = env.trainer(cfg)
    eps = _episodes(env, cfg)
    batch = t.learner.training_batch(eps, cfg)
    perturb(t.policy, 4)  # the adapter away from the reference, so the two teachers differ
    fwd = behaviour_forward(t.policy, batch, cfg)
    Ts = batch.stream_mask.shape[1]
    # 1. the behaviour policy as its own teacher on the same contexts: the gap is zero everywhere
    own = teacher_stream(_policy_teacher(t), t.policy.chat, eps, cfg, Ts)
    assert torch.equal(own.mask, batch.stream_mask.float())  # every action token, no hint needed
    gap, mask = distill_gap(torch_replace(batch, own), fwd.old_logp)
    assert mask.sum() == batch.action_mask.sum()
    assert gap.abs().max() < 1e-4, gap.abs().max()
    # 2. the reference as teacher: the gap is ref - old on every action token
    ref = teacher_stream(t.policy.reference, t.policy.chat, eps, cfg, Ts)
    gap, mask = distill_gap(torch_replace(batch, ref), fwd.old_logp)
    want = (fwd.ref_logp - fwd.old_logp) * batch.action_mask
    assert torch.allclose(gap, want, atol=1e-4) and want.abs().max() > 1e-3


def torch_replace(batch, teacher):
    from dataclasses import replace

    return replace(batch, teacher_logp=teacher.logp, distill_mask=teacher.mask)


def test_hindsight_keeps_only_the_turns_the_judge_gave_a_hint(env):
    cfg = cfg_of()
    cfg.algo.distill.coef = 1.0
    t = env.trainer(cfg)
    eps = _episodes(env, cfg)
    judge_episodes(RuleJudge(cfg.reward.judge), eps, cfg)
    try:
        assert all(s.judge.get("hint") for e in eps for s in e.steps if s.judge["vote"] != 0)
        assert not any(s.judge.get("hint") for e in eps for s in e.steps if s.judge["vote"] == 0)
        for e in eps[::2]:  # as a step that changed nothing: no hint
            e.steps[0].judge.pop("hint", None)
        batch = t.learner.training_batch(eps, cfg)
        teacher = teacher_stream(t.policy.reference, t.policy.chat, eps, cfg, batch.stream_mask.shape[1])
        hinted = [s.judge.get("hint") is not None for e in eps for s in e.steps]
        assert any(hinted) and not all(hinted)
        per_turn = [
            bool(teacher.mask[i, batch.stream_turn[i] == k].all())
            for i, e in enumerate(eps)
            for k in range(len(e.steps))
        ]
        assert per_turn == hinted
        assert all(s.process_reward == 0.0 for e in eps for s in e.steps)  # hints only: no process reward
    finally:
        for e in eps:
            for s in e.steps:
                s.judge, s.process_reward = None, 0.0


QUICK = merge(
    baseline_run.CONFIG,
    {
        "train": {"updates": 2, "eval_every": 0, "mi_every": 0, "eval_episodes": 1},
        "tracking": {"samples": 2},
        "env": {"format_penalty": 0.0},
    },
)


@pytest.mark.parametrize(
    "distill",
    [
        {"coef": 1.0, "teacher": "reference", "hint": "hindsight"},
        {"coef": 1.0, "rl_coef": 0.0, "teacher": "policy", "hint": "hindsight"},
        {"coef": 1.0, "teacher": "reference", "hint": "none"},
    ],
    ids=["combined", "opd-only-self", "plain"],
)
def test_end_to_end_in_the_trainer(tmp_path, distill):
    rows = baseline_run.run(tmp_path / "on", merge(QUICK, {"algo": {"distill": distill}}))
    trained = [r for r in rows if "loss/total" in r]
    assert len(trained) == 2
    for r in trained:
        assert 0 < r["distill/token_frac"] <= 1 and r["distill/gap_mean"] == r["distill/gap_mean"]
        if distill["hint"] == "none":
            assert r["distill/token_frac"] == 1.0
    turns = [turn for s in read_jsonl(tmp_path / "on" / "samples.jsonl") for turn in s["turns"]]
    if distill["hint"] == "hindsight":
        assert any("hint" in turn["judge"] for turn in turns)
        assert all(turn["process_reward"] == 0.0 for turn in turns)


def test_refusals():
    for bad, words in (
        ({"algo": {"distill": {"coef": 1, "teacher": "policy", "hint": "none"}}}, "zero advantage"),
        ({"algo": {"distill": {"coef": 1}}, "rollout": {"constrain": True}}, "rollout.constrain"),
        ({"algo": {"distill": {"coef": 1}}, "rollout": {"concurrent": True}}, "rollout.concurrent"),
    ):
        with pytest.raises(ValueError, match=words):
            RunConfig.model_validate(bad)
