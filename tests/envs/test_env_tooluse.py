"""Tool-use env: call syntaxes, schema errors vs tool errors, goal walks, finish, expert."""

from __future__ import annotations

import json

import pytest

import envs
from envs.demos import expert_solve_rate
from envs.tooluse_env import TOOL_SPECS, TOOLS, ToolUse, make_task, parse_call


def test_both_call_syntaxes_parse_to_the_same_call():
    a = parse_call('<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>')
    b = parse_call(" add(1, 2)\n")
    c = parse_call('<tool_call>{"name":"add","arguments":{"b":2,"a":1}}</tool_call>')
    assert a == b == c == ("add", (1, 2))
    assert parse_call("finish()") == ("finish", ())


@pytest.mark.parametrize(
    "text,why",
    [
        ("add(1)", "2 arguments"),
        ('add("1", 2)', "a must be integer"),
        ("nope(1)", "unknown tool"),
        ('<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>', "arguments"),
        ('<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2, "c": 3}}</tool_call>', "arguments"),
        ("<tool_call>not json</tool_call>", "JSON"),
        ('set_key("k", true)', "string or integer"),
        ('<tool_call>{"name": "add"}</tool_call> add(1, 2)', "write one"),
        ("add(1, 2", "write one"),
    ],
)
def test_schema_violations_are_format_errors(text, why):
    env = envs.make_env("tooluse")
    env.reset(0)
    r = env.step(text)
    assert r.info["format_error"] and why in r.observation and not r.done


def test_failing_calls_are_tool_errors_not_format_errors():
    env = envs.make_env("tooluse")
    env.reset(0)
    r = env.step('get_city("Nobody")')
    assert not r.info["format_error"]
    assert r.observation.endswith("<tool_response>error: no person 'Nobody'</tool_response>")
    assert env.step('delete_key("missing")').observation.endswith(
        "<tool_response>error: no key 'missing'</tool_response>"
    )


def test_goal_is_a_walk_whose_calls_feed_each_other():
    for seed in range(50):
        task = make_task(seed, ToolUse.Options(min_calls=2, max_calls=4))
        (goal,) = task.goals
        calls = [c for c in task.plan if c[0] != "set_key"]
        assert 2 <= len(calls) <= 4 and goal.startswith("out = ")
        assert all(name in goal for name, _ in calls)
        assert set(task.target) == set(task.state) | {"out"}


def test_finish_with_the_wrong_state_loses():
    env = envs.make_env("tooluse", reward_density="dense")
    env.reset(0)
    env.step('set_key("out", "wrong")')
    r = env.step("finish()")
    assert r.done and not r.info["won"] and r.reward == 0.0 and r.info["score"] < 1.0
    assert r.observation.endswith("<tool_response>goal not reached</tool_response>")


def test_expert_repairs_keys_the_agent_broke():
    env = envs.make_env("tooluse", {"action_format": "text", "n_goals": 2})
    obs, _ = env.reset(3)
    assert obs.startswith("Goal: out1 = ") and "; out2 = " in obs
    env.step('set_key("n", 999)')
    env.step('set_key("junk", 1)')
    for _ in range(30):
        r = env.step(env.expert_action())
        if r.done:
            break
    assert r.info["won"] and r.reward == 1.0


def test_observation_repeats_the_goal_only_when_asked():
    env = envs.make_env("tooluse", {"repeat_goal": False})
    obs, _ = env.reset(0)
    r = env.step(env.expert_action())
    assert obs.startswith("Goal:") and r.observation.startswith("<tool_response>")


def test_specs_are_json_schema_and_listed_in_instructions():
    env = envs.make_env("tooluse")
    assert [s["name"] for s in TOOL_SPECS] == list(TOOLS)
    json.dumps(TOOL_SPECS)
    for spec in TOOL_SPECS:
        assert spec["parameters"]["type"] == "object"
        assert f"{spec['name']}(" in env.instructions


def test_harder_settings_are_solved_by_the_expert():
    opts = {"min_calls": 3, "max_calls": 6, "n_goals": 2, "n_people": 8}
    seeds = ToolUse.task_seeds("train", 100, opts)
    assert expert_solve_rate("tooluse", opts, seeds, max_turns=40) == 1.0
    with pytest.raises(ValueError, match="min_calls"):
        envs.make_env("tooluse", {"min_calls": 4, "max_calls": 2})
