"""`rollout.stop: line` through the episode loop, with the real SmolLM2 tokenizer and chat prompts on
FrozenLake: where each action stops, what the environment is given, the end-of-turn token that closes an
action cut at a newline, and the same tokens in every context policy and in the training batch."""

from __future__ import annotations

import pytest
import torch

from envs.frozenlake_env import ACTIONS
from envs.vector import VectorEnv
from harness.rl.batch import build_batch
from harness.rl.rollout import collect
from harness.transcript.chat import ChatFormat, first_line
from tests.helpers.real_model import smollm2_fixture  # noqa: F401 - the `smollm2` fixture
from tests.helpers.rollout import make_cfg
from tests.helpers.smollm2 import small_llama, tokenizer

TASKS = [(s, s // 2) for s in range(6)]


@pytest.fixture(scope="module")
def chat(smollm2):
    return ChatFormat(tokenizer(smollm2))


@pytest.fixture(scope="module")
def model(chat):
    """A random Llama over the real vocabulary, steered toward newline tokens, the moves and the
    end-of-turn token, so actions end every way: at a newline, at the end-of-turn token, at the limit."""
    tok = chat.tokenizer
    bias = torch.zeros(len(tok))
    newlines = [i for i, p in enumerate(tok.batch_decode([[i] for i in range(len(tok))])) if "\n" in p]
    bias[newlines] = 7.0
    bias[[tok.encode(a)[0] for a in ACTIONS]] = 11.0
    bias[chat.eot_id] = 11.0
    return small_llama(len(tok), bias=bias)


def _play(model, chat, policy="full", reuse_cache=True, stop="line"):
    cfg = make_cfg(max_new_tokens=5, rollout__stop=stop, context__policy=policy, context__window=8)
    cfg.turns.max = 4
    venv = VectorEnv("frozenlake", {"prompt": "chat"}, n=len(TASKS))
    streams = [torch.Generator().manual_seed(100 + i) for i in range(len(TASKS))]
    return collect(
        model, chat, venv, TASKS, cfg, generator=streams, instructions=venv.instructions, reuse_cache=reuse_cache
    )


def _first_stop(chat, ids: list[int]) -> int | None:
    """The rule in text: the end-of-turn token, or the first token after which the text holds a newline
    after some text."""
    for k in range(len(ids)):
        if ids[k] == chat.eot_id or "\n" in chat.tokenizer.decode(ids[: k + 1]).lstrip():
            return k
    return None


def test_actions_stop_at_the_first_line_and_the_env_gets_that_line(model, chat):
    episodes = _play(model, chat)
    steps = [s for ep in episodes for s in ep.steps]
    ends = {"eot": 0, "line": 0, "limit": 0}
    for s in steps:
        stop = _first_stop(chat, s.action_ids)
        assert len(s.action_ids) == (stop + 1 if stop is not None else 5)
        assert s.overflow == (stop is None)
        ends["limit" if stop is None else "eot" if s.action_ids[-1] == chat.eot_id else "line"] += 1
        assert s.action_text == chat.decode_action(s.action_ids)  # the whole text, as sampled
        assert s.format_error == (first_line(s.action_text) not in ACTIONS)  # the env parsed the first line
    assert min(ends.values()) > 0, ends  # every way an action can end happened
    assert any(not s.format_error for s in steps)


def test_an_action_cut_at_a_newline_is_closed_by_the_end_of_turn_token(model, chat):
    for ep in _play(model, chat):
        for prev, s in zip(ep.steps, ep.steps[1:]):
            closed = prev.action_ids[-1] != chat.eot_id
            assert s.obs_ids[:1] == ([chat.eot_id] if closed else chat.observation("x")[:1])
            assert s.obs_ids[int(closed) :][:2] == chat.observation("x")[:2]  # then the usual segment


def test_every_context_policy_and_the_kv_reuse_see_the_same_tokens(model, chat):
    """The incremental KV stream, a full prefill each turn, and a window wide enough to hold every turn
    sample the same actions; the window's recorded contexts are the concatenated stream."""
    full = _play(model, chat)
    for other in (_play(model, chat, reuse_cache=False), _play(model, chat, policy="window")):
        assert [s.action_ids for e in other for s in e.steps] == [s.action_ids for e in full for s in e.steps]
    for ep in _play(model, chat, policy="window"):
        stream: list[int] = []
        for s in ep.steps:
            stream += s.obs_ids
            assert s.context_ids == stream
            stream += s.action_ids


def test_the_batch_trains_the_sampled_ids_only(model, chat):
    episodes = _play(model, chat)
    batch = build_batch(episodes, concatenated=True, mask_observations=True, pad_id=chat.pad_id)
    trained = batch.input_ids[batch.loss_mask.bool()].tolist()
    assert trained == [t for ep in episodes for s in ep.steps for t in s.action_ids]


def test_stop_eot_is_the_old_behaviour(model, chat):
    """Without the line stop, a newline does not end an action and nothing closes a turn."""
    for ep in _play(model, chat, stop="eot"):
        for k, s in enumerate(ep.steps):
            assert all(t != chat.eot_id for t in s.action_ids[:-1])
            assert s.overflow == (s.action_ids[-1] != chat.eot_id)
            if k:
                assert s.obs_ids[:2] == chat.observation("x")[:2]
