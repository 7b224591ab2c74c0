"""Context policies on hand-built segments: exact layouts, window size, truncation marker."""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from harness.config.schema import ContextConfig
from harness.transcript.chat import EOS, IM_END, SPECIAL_TOKENS, TRUNCATED, ChatFormat
from harness.transcript.context import (
    APPEND_ONLY,
    CONTEXT_POLICIES,
    build_context,
    check_prompt_split,
    shown_observation,
    system_ids,
    truncate_observation,
)


@pytest.fixture(scope="module")
def chat():
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=SPECIAL_TOKENS,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(["the room is dark and the door is open", "go north", "look"] * 10, trainer)
    return ChatFormat(PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=IM_END, pad_token=EOS))


SYS, SEGS, ACTS = [1], [[10, 11], [20], [30, 31], [40], [50]], [[100], [101, 102], [103], [104]]


def test_registry_matches_config_choices():
    assert set(CONTEXT_POLICIES.names()) == set(ContextConfig.model_fields["policy"].annotation.__args__)
    assert APPEND_ONLY == {"full", "obs_truncate"}


def test_full_and_obs_truncate_append_everything():
    for policy in ("full", "obs_truncate"):
        ctx = ContextConfig(policy=policy)
        assert build_context(ctx, SYS, SEGS, ACTS) == [1, 10, 11, 100, 20, 101, 102, 30, 31, 103, 40, 104, 50]
        assert build_context(ctx, SYS, SEGS[:1], []) == [1, 10, 11]


@pytest.mark.parametrize("k", [1, 2, 3, 10])
def test_window_keeps_exactly_k_turns(k):
    ctx = ContextConfig(policy="window", window=k)
    for t in range(len(SEGS)):
        got = build_context(ctx, SYS, SEGS[: t + 1], ACTS[:t])
        j = max(0, t - k)
        want = SYS + sum((SEGS[i] + ACTS[i] for i in range(j, t)), []) + SEGS[t]
        assert got == want
        assert sum(a in got for a in (100, 101, 103, 104)) == min(t, k)  # k turns kept (first id of each action)
    assert build_context(ContextConfig(policy="window", window=2), SYS, SEGS, ACTS) == [1, 30, 31, 103, 40, 104, 50]


def test_single_is_instructions_and_current_observation():
    ctx = ContextConfig(policy="single")
    assert build_context(ctx, SYS, SEGS, ACTS) == [1, 50]
    assert build_context(ctx, SYS, SEGS[:2], ACTS[:1]) == [1, 20]


def test_action_count_must_match():
    with pytest.raises(ValueError, match="one action per earlier turn"):
        build_context(ContextConfig(), SYS, SEGS, ACTS[:2])


def test_prompt_is_system_plus_observation_segment(chat):
    check_prompt_split(chat, "You are in a room.", "the door is open")
    assert system_ids(chat, "hi") + chat.observation("look") == chat.prompt("hi", "look")


def test_obs_truncate_cuts_with_marker(chat):
    long = "the room is dark and the door is open " * 3
    ctx = ContextConfig(policy="obs_truncate", obs_tokens=5)
    cut = shown_observation(chat, long, ctx)
    assert cut.endswith(TRUNCATED) and long.startswith(cut[: -len(TRUNCATED)])
    assert len(chat.encode(cut[: -len(TRUNCATED)])) <= 5
    assert shown_observation(chat, "look", ctx) == "look"  # fits: unchanged, no marker
    assert shown_observation(chat, long, ContextConfig(policy="full")) == long
    assert truncate_observation(chat, long, 1000) == long
