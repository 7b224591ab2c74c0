"""Chat prompts (`env.options.prompt: chat`, docs/algorithms.md#chat-prompts): the instructions state the
task, the reply format and a worked example whose replies the environment accepts; every observation of a
running episode ends with the reply cue; the game itself, and the default terse prompt, are unchanged."""

from __future__ import annotations

import re

import pytest

from envs.registry import make_env
from envs.tooluse_env import parse_call

FAST = [
    ("frozenlake", {}),
    ("frozenlake", {"action_format": "answer", "slippery": True}),
    ("sokoban", {}),
    ("tooluse", {"action_format": "text"}),
    ("tooluse", {}),
]
TEXTWORLD = {"world_size": 2, "nb_objects": 3, "quest_length": 2}


def _example_replies(instructions: str) -> list[str]:
    return re.findall(r"^assistant: (.*)$", instructions, re.M)


def _play(name: str, options: dict, seed: int, wrong: str = "no such action"):
    """The expert's episode with one unparsable reply first: (instructions, observations, steps)."""
    env = make_env(name, options)
    obs, _ = env.reset(seed)
    observations, steps = [obs], []
    result = env.step(wrong)
    assert result.info["format_error"]
    observations.append(result.observation)
    while True:
        result = env.step(env.expert_action())
        steps.append((result.reward, result.done, result.info["won"], result.info["state_key"]))
        observations.append(result.observation)
        if result.done:
            return env, observations, steps


@pytest.mark.parametrize("name, options", FAST, ids=lambda x: str(x))
def test_chat_prompt_states_the_format_and_cues_every_turn(name, options):
    env, observations, _ = _play(name, {**options, "prompt": "chat"}, seed=3)
    text, cue = env.instructions, env.reply_cue()
    assert cue and cue in text and "Example:" in text
    replies = _example_replies(text)
    assert replies
    for reply in replies:  # the worked example's replies are well-formed for this environment
        if name == "tooluse":
            parse_call(reply)
        else:
            assert not env.parse_action(reply).format_error
    for action in env.admissible() or []:
        assert action in text  # every move is named
    *running, final = observations
    assert all(o.endswith("\n" + cue) for o in running)  # the format-error observation too
    assert not final.endswith(cue)


@pytest.mark.parametrize("name, options", FAST, ids=lambda x: str(x))
def test_chat_prompt_changes_the_text_only(name, options):
    """Same task, same dynamics: the expert's episode pays, ends and moves through the same states; the
    observations are the terse ones with the cue line."""
    terse_env, terse_obs, terse_steps = _play(name, options, seed=5)
    chat_env, chat_obs, chat_steps = _play(name, {**options, "prompt": "chat"}, seed=5)
    assert chat_steps == terse_steps
    cue = "\n" + chat_env.reply_cue()
    assert [o.removesuffix(cue) for o in chat_obs] == terse_obs
    assert chat_env.instructions != terse_env.instructions


@pytest.mark.parametrize("name, options", FAST, ids=lambda x: str(x))
def test_terse_is_the_default(name, options):
    default, terse = make_env(name, options), make_env(name, {**options, "prompt": "terse"})
    assert default.instructions == terse.instructions and default.options == terse.options
    assert default.reset(7) == terse.reset(7)


def test_bad_prompt_value_names_the_choices():
    with pytest.raises(ValueError, match="prompt") as e:
        make_env("frozenlake", {"prompt": "friendly"})
    assert "chat" in str(e.value) and "terse" in str(e.value)


@pytest.mark.slow  # generates two TextWorld games (Inform 7), ~20 s
@pytest.mark.parametrize("action_format", ["text", "choice"])
def test_textworld_chat_prompt(tmp_path, action_format):
    options = {**TEXTWORLD, "action_format": action_format, "cache_dir": str(tmp_path), "prompt": "chat"}
    env, observations, steps = _play("textworld", options, seed=1)
    assert steps[-1][2]  # the expert wins
    cue = env.reply_cue()
    assert all(o.endswith("\n" + cue) for o in observations[:-1]) and cue in env.instructions
    env = make_env("textworld", options)
    obs, _ = env.reset(1)
    for reply in _example_replies(env.instructions):
        assert reply.isdigit() if action_format == "choice" else reply in env.instructions
    assert "Available actions:" in obs and obs.index("Available actions:") < obs.index(cue)


# generates one ALFWorld household game in a temporary folder (PDDL planning, a few seconds)
def test_alfworld_chat_prompt(tmp_path):
    pytest.importorskip("alfworld")
    pytest.importorskip("fast_downward")
    options = {
        "prompt": "chat",
        "cache_dir": str(tmp_path),
        "source": "generated",
        "expert": "search",
        "task_types": ["pick_and_place_simple"],
        "max_receptacles": 6,
        "goal_every_turn": True,
    }
    env, observations, steps = _play("alfworld", options, seed=1)
    cue = env.reply_cue()
    assert all(o.endswith("\n" + cue) for o in observations[:-1]) and cue in env.instructions
    assert steps[-1][2]  # the expert wins with the chat prompt too
