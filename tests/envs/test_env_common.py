"""Properties every reference environment keeps: determinism, expert, splits, format errors,
info keys, reward densities, option validation (every environment without an external package)."""

from __future__ import annotations

import random

import pytest

import envs
from envs.base import INFO_KEYS, INVALID_PREFIX, parse_choice, unwrap_answer
from envs.demos import expert_episodes, expert_solve_rate

NAMES = ["frozenlake", "sokoban", "tooluse", "tir", "user", "search", "hack_code"]
MALFORMED = [
    "",
    "   ",
    "jump",
    "up down",
    "<answer>fly</answer>",
    "<tool_call>{",
    "{}",
    "submit now",
    "get_city(",
    "<answer>up",
    "x" * 5000,
    "\x00\x01",
]


def random_actions(env, rng: random.Random, n: int) -> list[str]:
    """A mix of expert moves, legal-but-random moves and malformed text, decided up front."""
    pool = {
        "frozenlake": ["up", "down", "left", "right"],
        "sokoban": ["up", "down", "left", "right"],
        "tooluse": ['get_city("Ann")', 'get_key("n")', 'set_key("out", 3)', 'upper("a")'],
        "search": ['search("Zorbex")', 'answer("Oslo")', 'search("nothing")'],
        "hack_code": ["run", "```tests\nassert True\n```", "```solution\ndef f():\n    pass\n```", "submit"],
        "user": ['ask("order")', 'lookup("O-1000")', "confirm()", "apply()", 'ask("weather")'],
        "tir": ["```python\nprint(2 + 2)\n```", "\\boxed{4}", "```python\nprint(1 / 0)\n```"],
    }
    return [rng.choice(["expert", "expert", "bad", *pool[env.name]]) for _ in range(n)]


def play(env, seed: int, plan: list[str]):
    obs, info = env.reset(seed)
    trace = [(obs, info["state_key"])]
    for a in plan:
        text = env.expert_action() if a == "expert" else (MALFORMED[2] if a == "bad" else a)
        r = env.step(text)
        trace.append((r.observation, r.info["state_key"], r.reward, r.done))
        if r.done:
            break
    return trace


@pytest.mark.parametrize("name", NAMES)
def test_same_seed_same_episode(name):
    for seed in range(6):
        plan = random_actions(envs.make_env(name), random.Random(seed), 20)
        a = play(envs.make_env(name, reward_density="dense"), seed, plan)
        b = play(envs.make_env(name, reward_density="dense"), seed, plan)
        assert a == b
    assert play(envs.make_env(name), 0, [])[0] != play(envs.make_env(name), 2, [])[0]


# the experts of these run a program in the code sandbox at every step (~0.3 s a task): the fast
# suite plays the first 24 of their 200 train tasks, the slow test below all of them
SANDBOXED = ("hack_code", "tir")


@pytest.mark.parametrize("name", NAMES)
def test_expert_solves_every_train_task(name):
    seeds = envs.ENVS.get(name).task_seeds("train", 24 if name in SANDBOXED else 200)
    assert expert_solve_rate(name, None, seeds, max_turns=60) == 1.0


@pytest.mark.slow
@pytest.mark.parametrize("name", SANDBOXED)
def test_expert_solves_all_200_train_tasks_of_the_sandboxed_envs(name):
    seeds = envs.ENVS.get(name).task_seeds("train", 200)
    assert expert_solve_rate(name, None, seeds, max_turns=60) == 1.0


@pytest.mark.parametrize("name", NAMES)
def test_train_and_heldout_are_disjoint(name):
    cls = envs.ENVS.get(name)
    train, held = cls.task_seeds("train", 300), cls.task_seeds("heldout", 100)
    assert len(set(train)) == 300 and len(set(held)) == 100 and not set(train) & set(held)
    assert cls.task_seeds("train", 300) == train  # stable
    assert cls.task_seeds("train", 10) == train[:10]  # a prefix: growing n keeps old seeds
    assert all(cls.split_of(s) == "heldout" for s in held)
    opts = cls.Options()
    if cls.task_fingerprint(0, opts) is not None:  # small maps: disjoint by content too
        train_tasks = {cls.task_fingerprint(s, opts) for s in train}
        assert not train_tasks & {cls.task_fingerprint(s, opts) for s in held}
    with pytest.raises(ValueError, match="split"):
        cls.task_seeds("test", 3)


@pytest.mark.parametrize("name", NAMES)
def test_malformed_actions_are_format_errors(name):
    env = envs.make_env(name, format_penalty=0.1)
    obs0, info0 = env.reset(4)
    for text in MALFORMED + [None, 42]:
        r = env.step(text)
        assert r.info["format_error"] and not r.done and r.reward == -0.1
        assert r.observation.startswith(INVALID_PREFIX)
        assert r.info["state_key"] == info0["state_key"]  # nothing changed
    r = env.step(env.expert_action())
    assert not r.info["format_error"]


@pytest.mark.parametrize("name", NAMES)
def test_info_keys_and_reward_densities(name):
    for density in ("sparse", "dense"):
        for ep in expert_episodes(name, None, [0, 2, 4, 6], 60, reward_density=density):
            assert ep.won and not ep.truncated and ep.env_error is None
            for turn in ep.turns:
                assert set(INFO_KEYS) <= set(turn.info)
                assert isinstance(turn.info["state_key"], str) and turn.info["state_key"]
            rewards = [t.reward for t in ep.turns]
            if density == "sparse":
                assert rewards == [0.0] * (len(rewards) - 1) + [1.0]
            else:  # score increments telescope to final - initial score
                env = envs.make_env(name)
                start = env.reset(ep.seed)[1]["score"]
                assert sum(rewards) == pytest.approx(ep.turns[-1].info["score"] - start)
                assert ep.turns[-1].info["score"] == 1.0


@pytest.mark.parametrize("name", NAMES)
def test_options_are_validated_with_clear_errors(name):
    with pytest.raises(ValueError, match="invalid env.options for env") as e:
        envs.make_env(name, {"no_such_option": 1})
    assert "no_such_option" in str(e.value)
    assert all(field in str(e.value) for field in envs.ENVS.get(name).Options.model_fields)  # the valid ones
    with pytest.raises(ValueError, match="reward_density"):
        envs.make_env(name, reward_density="medium")


@pytest.mark.parametrize("name", NAMES)
def test_instructions_and_observations_are_short(name):
    env = envs.make_env(name)
    obs, _ = env.reset(0)
    assert len(env.instructions) < 600 and len(obs) < (400 if name == "hack_code" else 200)  # it shows tests.py
    assert not any(m in env.expert_action() for m in env.observation_markers)
    if name == "tooluse":
        assert env.parse_action("finish") == env.parse_action("finish()")


def test_parse_choice_accepts_bare_or_answer_wrapped_words():
    choices = ("up", "down")
    for text in ["up", " UP\n", "<answer>up</answer>", "<answer> up </answer>\n"]:
        assert parse_choice(text, choices).action == "up"
    for text in ["go up", "<answer>up</answer> extra", "<answer>up", "upp"]:
        p = parse_choice(text, choices)
        assert p.format_error and p.action is None and "up, down" in p.message
    assert unwrap_answer("<answer>a</answer>") == "a"


def test_registry_lists_every_env_with_options():
    rows = {row["name"]: row for row in envs.describe()}
    for name in NAMES:
        assert rows[name]["doc"] and rows[name]["source"]
        assert all(o["description"] for o in rows[name]["options"])
        assert {o["name"] for o in rows[name]["options"]} == set(envs.ENVS.get(name).Options.model_fields)
    assert set(envs.load_all()) >= {"frozenlake_env", "sokoban_env", "tooluse_env"}
    with pytest.raises(KeyError, match="frozenlake"):
        envs.make_env("frozen_lake")


def test_demos_record_what_the_agent_saw():
    (ep,) = expert_episodes("sokoban", {"action_format": "answer"}, [8], max_turns=40)
    env = envs.make_env("sokoban")
    assert ep.instructions.endswith("Answer as <answer>up</answer>.")
    obs, _ = env.reset(8)
    for turn in ep.turns:
        assert turn.observation == obs and turn.action.startswith("<answer>")
        obs = env.step(turn.action).observation
    assert obs == ep.final_observation and ep.total_reward == 1.0
    short = expert_episodes("sokoban", None, [8], max_turns=1, only_won=True)
    assert short == [] or len(short[0].turns) == 1


@pytest.mark.parametrize("name", NAMES)
def test_instances_share_no_state(name):
    """Two instances on the same task, stepped interleaved, match one played alone."""
    plan = random_actions(envs.make_env(name), random.Random(1), 15)
    alone = play(envs.make_env(name), 10, plan)
    a, b = envs.make_env(name), envs.make_env(name)
    a.reset(10), b.reset(10)
    for text in plan[:3]:
        if a.step(text if text not in ("expert", "bad") else "bad").done:
            break
    assert play(b, 10, plan) == alone
