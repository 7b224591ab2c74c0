"""The rollout and the training batch with a real BPE tokenizer, its chat template and real weights:
SmolLM2-135M-Instruct (packaged, tests/helpers/real_model.py), a Llama body of 30 layers with grouped-query
attention (9 query / 3 key-value heads), on the counting environment of the rollout tests.

Budgets are small (2 episodes, 2-3 turns, at most 6 tokens an action): each rollout takes seconds on a CPU.
Log-probs are compared within 1e-4 (float32; the engines and a full forward add in different orders:
measured differences are about 1e-5)."""

from __future__ import annotations

import pytest
import torch

from harness.model.logprobs import token_logprobs
from harness.rl.batch import build_batch
from harness.rl.engines.hf import KVBatch
from harness.rl.engines.static import StaticKVBatch
from harness.transcript.chat import IM_END, ChatFormat
from tests.helpers.real_model import load, smollm2_fixture  # noqa: F401
from tests.helpers.rollout import concatenated, make_cfg, max_logprob_error, run

TOL = 1e-4  # log-probs, float32
TASKS = [(2, 0), (6, 1)]  # two counting episodes of three turns, cut at turns.max = 2


@pytest.fixture(scope="module")
def real(smollm2):
    model, tok = load(smollm2)
    return model, ChatFormat(tok)


def _cfg(**over):
    cfg = make_cfg(max_new_tokens=over.pop("max_new_tokens", 6))
    cfg.rollout.temperature, cfg.turns.max = 1.0, over.pop("turns", 2)
    for key, value in over.items():
        setattr(cfg.rollout, key, value)
    return cfg


@pytest.fixture(scope="module")
def sampled(real):
    """Two episodes sampled at temperature 1 (seed 0), KV cache reused across turns."""
    model, chat = real
    return run(model, chat, TASKS, _cfg(), seed=0)


def _stream(ep) -> list[int]:
    return [t for st in ep.steps for t in st.obs_ids + st.action_ids]


def test_the_trainer_trains_on_the_sampled_ids_not_on_a_retokenization(real, sampled):
    """Every row of the training batch is the episode's recorded ids (prompt, actions as sampled,
    observation segments), in both layouts, and the trainer's log-probs of the action tokens are the
    sampler's. Decoding an episode and encoding the text again gives the same text but other ids: in
    this rollout an action cut at max_new_tokens ends in two sampled '\\n' tokens and the observation
    segment starts with '\\n', so the text holds '\\n\\n\\n' before <|im_start|>, which the tokenizer
    encodes as one token."""
    model, chat = real
    tok = chat.tokenizer
    # the case on its own: ids as the rollout lays them out, and the ids of their text
    laid_out = chat.encode("1.\n") + chat.encode("\n") + chat.observation("state 1")
    again = chat.encode(tok.decode(laid_out))
    assert tok.decode(again) == tok.decode(laid_out) and again != laid_out
    assert (
        tok.convert_ids_to_tokens(laid_out)[:4] == ["1", ".", "Ċ", "Ċ"] and tok.convert_ids_to_tokens(again)[2] == "ĊĊĊ"
    )
    batch = build_batch(sampled, concatenated=True, mask_observations=True, pad_id=chat.pad_id)
    drift = []
    for i, ep in enumerate(sampled):
        stream = _stream(ep)
        assert batch.input_ids[i, : len(stream)].tolist() == stream
        act = batch.action_mask[i].bool()
        assert batch.input_ids[i][act].tolist() == [t for st in ep.steps for t in st.action_ids]
        assert batch.sampler_logp[i][act].tolist() == [lp for st in ep.steps for lp in st.sampler_logprobs]
        for st in ep.steps:  # an action ends with <|im_end|> or is cut at max_new_tokens (overflow)
            assert st.overflow == (st.action_ids[-1] != chat.eot_id) and len(st.action_ids) <= 6
        again = chat.encode(tok.decode(stream))
        assert tok.decode(again) == tok.decode(stream)
        if again != stream:
            k = next(j for j, (a, b) in enumerate(zip(stream, again)) if a != b)
            drift.append((tok.decode(stream[max(k - 3, 0) : k + 4]), tok.convert_ids_to_tokens(again[k : k + 2])))
            assert batch.input_ids[i, : len(again)].tolist() != again
    assert drift, "no sampled episode re-encodes to other ids (at seed 0: newlines before <|im_start|> merge)"
    # per-step layout: each row is the context the policy saw, then that turn's sampled action
    rows = build_batch(sampled, concatenated=False, mask_observations=True, pad_id=chat.pad_id)
    r = 0
    for ep in sampled:
        stream = _stream(ep)
        for t, st in enumerate(ep.steps):
            n = sum(len(s.obs_ids) + len(s.action_ids) for s in ep.steps[:t]) + len(st.obs_ids)
            want = stream[:n] + st.action_ids
            assert rows.input_ids[r, : len(want)].tolist() == want and int(rows.attention_mask[r].sum()) == len(want)
            r += 1
    # the trainer's log-probs of those ids (one forward over each row) are the sampler's
    with torch.no_grad():
        logp, _ = token_logprobs(model, batch.input_ids, batch.attention_mask, token_mask=batch.action_mask)
    act = batch.action_mask.bool()
    assert (logp[act] - batch.sampler_logp[act]).abs().max().item() < TOL


def test_the_end_of_turn_token_ends_an_action_and_is_trained(real):
    """With <|im_end|> sampled the action stops; it is the last action id, trained on (action and loss
    masks), and the observation after it is not. The episode's ids are then exactly what the model's own
    chat template gives for the same messages (its final newline aside)."""
    model, chat = real
    tok = chat.tokenizer
    assert chat.eot_id == tok.convert_tokens_to_ids(IM_END) == tok.eos_token_id == model.config.eos_token_id
    cfg = _cfg(max_new_tokens=4, turns=3, constrain=True)  # the actions go / stop: a short <|im_end|>
    eps = run(model, chat, [(1, 0), (2, 1)], cfg, seed=0, env_attrs={"admissible_actions": ["go", "stop"]})
    batch = build_batch(eps, concatenated=True, mask_observations=True, pad_id=chat.pad_id)
    for i, ep in enumerate(eps):
        assert ep.steps[-1].done and len(ep.steps) == (2, 3)[i]
        pos = 0
        messages = [{"role": "system", "content": ep.instructions}]
        for st in ep.steps:
            assert st.action_ids[-1] == chat.eot_id and chat.eot_id not in st.action_ids[:-1] and not st.overflow
            assert st.action_text in ("go", "stop") and IM_END not in st.action_text
            pos += len(st.obs_ids) + len(st.action_ids)
            end = pos - 1  # the <|im_end|> of this action
            assert batch.action_mask[i, end] == 1 and batch.loss_mask[i, end] == 1
            if st is not ep.steps[-1]:  # the observation segment after it: "\n<|im_start|>user\n..."
                assert batch.loss_mask[i, end + 1] == 0 and batch.input_ids[i, end + 2] == chat.start_id
            messages += [{"role": "user", "content": st.observation}, {"role": "assistant", "content": st.action_text}]
        assert int(batch.loss_mask[i].sum()) == sum(len(st.action_ids) for st in ep.steps)
        template = tok.apply_chat_template(messages, tokenize=True, return_dict=True)["input_ids"]
        assert template[-1] == chat.encode("\n")[0] and _stream(ep) == template[:-1]


def test_kv_reuse_across_turns_equals_a_fresh_forward(real, sampled):
    """An episode's cache is kept across turns (only the new tokens are prefilled); prefilling the whole
    context every turn, and one full forward over the finished episode, give the same tokens and log-probs."""
    model, chat = real
    fresh = run(model, chat, TASKS, _cfg(), seed=0, reuse_cache=False)
    for a, b in zip(sampled, fresh):
        assert [st.action_ids for st in a.steps] == [st.action_ids for st in b.steps]
        for sa, sb in zip(a.steps, b.steps):
            assert max(abs(x - y) for x, y in zip(sa.sampler_logprobs, sb.sampler_logprobs)) < TOL
        seq, targets = concatenated(a)
        assert max_logprob_error(model, seq, targets, 1.0) < TOL


def test_the_static_engine_equals_hf_on_the_real_llama_body(real):
    """rollout.backend static (our decoder loop: folded grouped-query heads, a preallocated cache) and
    hf (the model's own forward) on SmolLM2's 30 layers and 9 / 3 heads: the same logits after a ragged
    prefill, and the same greedy tokens with log-probs within 1e-4 over two turns."""
    model, chat = real
    c = model.config
    assert (c.model_type, c.num_hidden_layers, c.num_attention_heads, c.num_key_value_heads) == ("llama", 30, 9, 3)
    rows = [chat.prompt("Count.", "state 0 x y z"), chat.prompt("Count.", "state 1")]
    with torch.no_grad():
        hf, static = KVBatch(model, chat.pad_id), StaticKVBatch(model, chat.pad_id)
        hf.reset(2)
        static.reset(2)
        a, b = hf.prefill(rows), static.prefill(rows)  # (2, V)
    assert (a - b).abs().max().item() < 1e-3 and torch.equal(a.argmax(-1), b.argmax(-1))
    eps = {backend: run(model, chat, TASKS, _cfg(backend=backend), seed=0, greedy=True) for backend in ("hf", "static")}
    for x, y in zip(eps["hf"], eps["static"]):
        assert [st.action_ids for st in x.steps] == [st.action_ids for st in y.steps]
        for sx, sy in zip(x.steps, y.steps):
            assert max(abs(p - q) for p, q in zip(sx.sampler_logprobs, sy.sampler_logprobs)) < TOL
