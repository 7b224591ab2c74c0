"""Multi-task training over a weighted mixture of environments (`env.mixture`, envs/mixture_env.py):
the seed encoding and splits, delegation to the members, the config resolution and its messages,
one checkpoint for every weighting, and the trainer end to end with per-environment metrics and
per-member system prompts."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from envs import env_class, make_env
from envs.mixture_env import Mixture, _round_robin
from harness.config.errors import ConfigError
from harness.config.loading import validate_run_config

FL, SOK = {"name": "frozenlake"}, {"name": "sokoban"}


def options(*members):
    return validate_run_config({"env": {"mixture": list(members)}}, "t.yaml").env.options


def test_round_robin_keeps_every_prefix_near_the_weights():
    order = _round_robin([3.0, 1.0, 0.0], 40)
    assert 2 not in order
    for n in range(1, 41):
        share = order[:n].count(0) / n
        assert abs(share * n - 0.75 * n) <= 1  # within one task of the exact share at every prefix
    assert _round_robin([1.0, 1.0, 1.0], 6) == [0, 1, 2, 0, 1, 2]


def test_splits_follow_the_members_and_the_weights():
    o = options(
        {**FL, "weight": 3},
        {**SOK, "weight": 1},
        {"name": "frozenlake", "label": "fl6", "options": {"size": 6}, "weight": 0},
    )
    train, held = Mixture.task_seeds("train", 40, o), Mixture.task_seeds("heldout", 30, o)
    assert Counter(Mixture.decode(s, o)[0] for s in train) == {0: 30, 1: 10}  # weight 0: never trained
    assert Counter(Mixture.decode(s, o)[0] for s in held) == {0: 10, 1: 10, 2: 10}  # held out equally
    assert not set(train) & set(held)
    for s in train + held:  # every task is its member's task, in the member's own split
        m, t = Mixture.decode(s, o)
        member = o["members"][m]
        split = "train" if s in train else "heldout"
        assert env_class(member["name"]).split_of(t, member["options"]) == split == Mixture.split_of(s, o)
    members_train = env_class("frozenlake").task_seeds("train", 30, o["members"][0]["options"])
    assert [Mixture.decode(s, o)[1] for s in train if s % 3 == 0] == members_train  # the member's own order
    assert Mixture.task_seeds("train", 17, o) == train[:17]  # prefixes agree
    # demonstrations: every member equally, whatever the weights
    assert Counter(Mixture.decode(s, o)[0] for s in Mixture.demo_seeds(9, o)) == {0: 3, 1: 3, 2: 3}


def test_episodes_are_the_members_episodes():
    o = options(FL, SOK)
    mix = make_env("mixture", o, reward_density="dense", format_penalty=0.1)
    for seed in Mixture.task_seeds("heldout", 4, o):
        m, t = Mixture.decode(seed, o)
        alone = make_env(
            o["members"][m]["name"], o["members"][m]["options"], reward_density="dense", format_penalty=0.1
        )
        obs, info = mix.reset(seed)
        obs_a, info_a = alone.reset(t)
        assert obs == obs_a and info["instructions"] == alone.instructions
        assert {k: v for k, v in info.items() if k not in ("instructions", "env")} == info_a
        assert mix.task_type(seed) == mix.env_label(seed) == info["env"] == o["members"][m]["label"]
        for _ in range(3):
            action = mix.expert_action()
            assert action == alone.expert_action()
            a, b = mix.step(action), alone.step(action)
            assert (a.observation, a.reward, a.done, a.info) == (b.observation, b.reward, b.done, b.info)
            if a.done:
                break
        bad = mix.step("fly away") if not a.done else None
        if bad is not None:
            assert bad.info["format_error"] and bad.reward == -0.1
    assert set(mix.observation_markers) == set(env_class("frozenlake").observation_markers) | set(
        env_class("sokoban").observation_markers
    )
    assert mix.reset(1)[1]["instructions"] != mix.reset(0)[1]["instructions"]  # seeds 0, 1: members 0, 1


@pytest.mark.parametrize(
    "env, words",
    [
        ({"mixture": [{"name": "frozen"}]}, "env.mixture.0.name: unknown env.name 'frozen'; choose one of:"),
        ({"mixture": [{**FL, "weight": -1}]}, "env.mixture.0.weight: Input should be greater than or equal to 0"),
        (
            {"mixture": [FL, {**SOK, "options": {"boxes": 2}}]},
            "env.mixture.1: invalid env.options for env 'sokoban': boxes",
        ),
        ({"mixture": [{**FL, "weight": 0}]}, "env.mixture: at least one member needs a weight > 0"),
        ({"mixture": [FL, FL]}, "env.mixture: member labels must differ"),
        ({"mixture": [{"name": "mixture"}]}, "a mixture cannot contain a mixture"),
        ({"mixture": [FL], "options": {"size": 4}}, "env.options: leave it unset with env.mixture"),
    ],
)
def test_bad_mixtures_name_the_key(env, words):
    with pytest.raises(ConfigError) as e:
        validate_run_config({"env": env}, "t.yaml")
    assert words in str(e.value) and str(e.value).count("\n") == 0


def test_every_weighting_shares_the_checkpoint():
    from harness.model.tiny import tiny_cache_key
    from harness.rl.demos import Demonstrations

    def cfg_key(cfg):
        return tiny_cache_key(cfg, Demonstrations.of(cfg))

    def key(w):
        return cfg_key(validate_run_config({"env": {"mixture": [FL, {**SOK, "weight": w}]}}, "t.yaml"))

    assert key(0.0) == key(1.0) == key(3.0)
    assert key(1.0) != cfg_key(
        validate_run_config({"env": {"mixture": [FL, {**SOK, "options": {"size": 7}}]}}, "t.yaml")
    )


def test_every_weighting_shares_the_start_evaluation():
    from harness.rl.evaluate import start_key

    def key(w, norm="task"):
        raw = {"env": {"mixture": [FL, {**SOK, "weight": w}]}, "algo": {"adv": {"norm": norm}}}
        return start_key(validate_run_config(raw, "t.yaml"), {"base": "tiny:x", "sft": None})

    assert key(0.0) == key(2.0) == key(1.0, "batch")
    assert key(1.0) != start_key(validate_run_config({"env": {"mixture": [FL]}}, "t.yaml"), {"base": "tiny:x"})


def test_training_on_a_mixture_end_to_end(tmp_path):
    """Two updates on frozenlake + sokoban: groups stay within one environment, each episode's system
    prompt is its member's, task normalisation sees one task type per environment, and metrics and
    the held-out evaluation come per environment and overall; a weight-0 member is evaluated only."""
    import torch

    from harness.experiments.tracking import RunLogger
    from harness.rl.trainer import Trainer, train
    from tests.helpers import baseline as baseline_run
    from tests.helpers.configs import merge

    raw = merge(
        baseline_run.CONFIG,
        {
            "env": {
                "mixture": [FL, SOK, {**FL, "label": "fl5", "options": {"size": 5}, "weight": 0}],
                "heldout_tasks": 6,
            },
            "turns": {"max": 8},
            "algo": {"adv": {"norm": "task"}},
        },
    )
    raw["env"].pop("name")
    cfg = validate_run_config(raw, "t.yaml")
    t = Trainer(cfg, tmp_path / "t", RunLogger(tmp_path / "log"))
    try:
        seeds = t.worker.train_tasks(1, 0)
        assert [Mixture.decode(s, cfg.env.options)[0] for s in seeds] == [0, 1]
        eps = t.worker.episodes(seeds, 3, greedy=False, budget=3, generator=torch.Generator().manual_seed(1))
        chat = t.policy.chat
        for e in eps:
            m = Mixture.decode(e.task_seed, cfg.env.options)[0]
            member = make_env(cfg.env.options["members"][m]["name"])
            assert e.instructions == member.instructions
            assert chat.tokenizer.decode(e.steps[0].obs_ids).startswith(
                f"<|im_start|>system\n{member.instructions}<|im_end|>"
            )
        batch = t.learner.training_batch(eps)
        assert len(set(batch.task.tolist())) == 2 and len(set(batch.env.tolist())) == 2
    finally:
        t.close()
    out = tmp_path / "run"
    logger = RunLogger(out)
    train(cfg, out, logger)
    logger.close("done")
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    first, last = rows[0], rows[-1]
    for mode in ("greedy", "sampled"):
        for label in ("frozenlake", "sokoban", "fl5"):
            assert first[f"eval_{mode}/{label}/episodes"] >= 1
    assert (
        sum(first[f"eval_greedy/{lab}/episodes"] for lab in ("frozenlake", "sokoban", "fl5"))
        == first["eval_greedy/episodes"]
    )
    assert "env/frozenlake/success" in last and "env/sokoban/success" in last and "env/fl5/success" not in last
    tasks = [json.loads(line) for line in (out / "eval_tasks.jsonl").read_text().splitlines()]
    assert {r["env"] for r in tasks} == {"frozenlake", "sokoban", "fl5"}  # per-environment paired tables
    assert all(r["env"] == Mixture(cfg.env.options).env_label(r["task"]) for r in tasks)
