"""Step judges and process rewards (`reward.process`, harness.rl.judge; docs/algorithms.md#process-rewards):
the vote rules and reward forms by hand, the rule judge on the real FrozenLake environment, the model
judge on the tiny model, and both end to end in the trainer (off by default: the baseline record of
tests/support/data/trainer_metrics_baseline.json, checked in test_mismatch.py, is unchanged)."""

from __future__ import annotations

import json

import pytest
import torch

from envs import make_env
from harness.config.schema import JudgeConfig, RunConfig
from harness.rl.batch import build_batch
from harness.rl.judge import (
    ModelJudge,
    RuleJudge,
    Step,
    episode_steps,
    judge_episodes,
    majority,
    parse_vote,
    process_bonus,
)
from harness.store import read_jsonl
from tests.helpers import baseline as baseline_run
from tests.helpers.configs import merge
from tests.helpers.update import cfg_of


def test_majority_parse_and_the_two_reward_forms_by_hand():
    assert majority([1]) == 1 and majority([1, 1, -1]) == 1 and majority([-1, 0, -1]) == -1
    assert majority([1, -1]) == 0 and majority([1, -1, 0]) == 0 and majority([0, 0, 1]) == 0
    assert [parse_vote(t) for t in ("+1", " -1 because", "0", "yes", "1", "x -1 +1")] == [1, -1, 0, 0, 0, -1]
    votes = [1, -1, 1, 1]
    # episode form: R = outcome + w * mean(votes) = outcome + 0.5 * 0.5, on the last turn
    assert process_bonus(votes, 0.5, "episode") == [0.0, 0.0, 0.0, 0.25]
    # step form: r_t += w * vote_t
    assert process_bonus(votes, 0.5, "step") == [0.5, -0.5, 0.5, 0.5]
    assert process_bonus([], 1.0, "episode") == []


def _play(env, actions: list[str], seed: int) -> list[Step]:
    obs, info = env.reset(seed)
    steps = []
    for a in actions:
        before = info["score"]
        res = env.step(a)
        steps.append(Step(obs, a, res.observation, res.info["format_error"], before, res.info["score"]))
        obs, info = res.observation, res.info
        if res.done:
            break
    return steps


def test_the_rule_judge_on_real_frozenlake_steps():
    env = make_env("frozenlake", {})
    seed = 12345
    env.reset(seed)
    expert = []
    while not env.over():
        a = env.expert_action()
        expert.append(a)
        env.step(a)
    assert len(expert) >= 2
    judge = RuleJudge(JudgeConfig(votes=3))
    verdicts = judge(_play(env, expert, seed))
    assert [v.vote for v in verdicts] == [1] * len(expert)  # every expert step shortens the way to the goal
    assert verdicts[0].votes == [1, 1, 1]
    assert verdicts[0].row() == {
        "vote": 1,
        "votes": [1, 1, 1],
        "hint": f"the action '{expert[0]}' brings you closer to the goal.",
    }
    # a malformed action is an error (-1); stepping back after one expert step loses progress (-1)
    back = {"up": "down", "down": "up", "left": "right", "right": "left"}[expert[0]]
    bad = judge(_play(env, ["jump", expert[0], back], seed))
    assert [v.vote for v in bad] == [-1, 1, -1]
    # an unknown score gives 0 (no evidence)
    assert judge([Step("s", "a", "t", False, None, 0.5)])[0].vote == 0


@pytest.mark.parametrize("form", ["episode", "step"])
def test_process_rewards_reach_the_batch_and_leave_the_outcome_alone(env, form):
    cfg = cfg_of()
    cfg.reward.process, cfg.reward.form, cfg.reward.weight = "judge", form, 0.5
    t = env.trainer(cfg)
    eps = [e for e in env.episodes[cfg.rollout.constrain] if e.steps]
    outcomes = [e.outcome for e in eps]
    judge_episodes(RuleJudge(cfg.reward.judge), eps, cfg)
    try:
        for e, outcome in zip(eps, outcomes):
            votes = [s.judge["vote"] for s in e.steps]
            assert e.outcome == outcome  # the environment's return is untouched
            assert e.train_return == pytest.approx(
                outcome + (0.5 * sum(votes) / len(votes) if form == "episode" else 0.5 * sum(votes))
            )
            assert [s.process_reward for s in e.steps] == process_bonus(votes, 0.5, form)
        assert any(s.judge["vote"] != 0 for e in eps for s in e.steps)
        batch = build_batch(eps, concatenated=True, mask_observations=True, pad_id=t.policy.chat.pad_id)
        assert torch.allclose(batch.rewards, torch.tensor([e.train_return for e in eps]))
        turn_sums = batch.turn_rewards.sum(1)
        assert torch.allclose(turn_sums, torch.tensor([e.train_return for e in eps]), atol=1e-6)
    finally:  # the episodes are shared with other tests of this module
        for e in eps:
            for s in e.steps:
                s.judge, s.process_reward = None, 0.0


def test_the_model_judge_votes_from_the_frozen_start_reproducibly(env):
    cfg = cfg_of()
    t = env.trainer(cfg)
    eps = [e for e in env.episodes[cfg.rollout.constrain] if e.steps][:3]
    steps = [s for e in eps for s in episode_steps(e)]
    assert steps[-1].next_state is not None  # the final observation is recorded
    jc = JudgeConfig(kind="model", votes=3, max_new_tokens=4)
    judge = ModelJudge(jc, t.policy.reference, t.policy.chat, seed=0)
    before = {n: p.detach().clone() for n, p in t.policy.model.named_parameters()}
    a, b, c = judge(steps, (1, 0)), judge(steps, (1, 0)), judge(steps, (2, 0))
    assert [v.row() for v in a] == [v.row() for v in b]  # the same key, the same answers
    assert [v.answers for v in a] != [v.answers for v in c]  # another update, other streams
    for v in a:
        assert len(v.votes) == 3 and v.vote == majority(v.votes) and "Action:" in v.prompt
        assert all(parse_vote(x) == y for x, y in zip(v.answers, v.votes))
    assert all(torch.equal(p, before[n]) for n, p in t.policy.model.named_parameters())  # frozen


QUICK = merge(
    baseline_run.CONFIG,
    {"train": {"updates": 2, "eval_every": 0, "mi_every": 0, "eval_episodes": 1}, "tracking": {"samples": 2}},
)


@pytest.mark.parametrize("kind", ["rule", "model"])
def test_end_to_end_in_the_trainer(tmp_path, kind):
    on = merge(QUICK, {"reward": {"process": "judge", "judge": {"kind": kind, "votes": 1, "max_new_tokens": 3}}})
    rows = baseline_run.run(tmp_path / kind, on)
    trained = [r for r in rows if "loss/total" in r]
    assert len(trained) == 2
    assert all("reward/vote_pos_frac" in r and "reward/process_per_episode" in r for r in trained)
    samples = read_jsonl(tmp_path / kind / "samples.jsonl")
    turns = [turn for s in samples for turn in s["turns"]]
    assert turns and all("judge" in turn and "process_reward" in turn for turn in turns)
    if kind == "model":
        assert all(turn["judge"]["prompt"].startswith("State:") and turn["judge"]["answers"] for turn in turns)
    timings = read_jsonl(tmp_path / kind / "timings.jsonl")
    assert all(r["judge_s"] >= 0 for r in timings)
    off = baseline_run.run(tmp_path / "off", QUICK)
    assert not any("reward/vote_pos_frac" in r for r in off)
    assert not any("judge" in turn for s in read_jsonl(tmp_path / "off" / "samples.jsonl") for turn in s["turns"])
    assert json.dumps(off) != json.dumps(rows) or kind == "model"


def test_judge_with_concurrent_rollout_is_refused():
    with pytest.raises(ValueError, match="rollout.concurrent"):
        RunConfig.model_validate({"reward": {"process": "judge"}, "rollout": {"concurrent": True}})
