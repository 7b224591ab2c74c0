"""SFT on expert demonstrations: the rollout's token layout, loss on action tokens only, learning,
determinism. A slow test measures held-out greedy success of the default tiny model."""

from __future__ import annotations

import pytest
import torch

from harness.bench.memory import naive_token_logprobs
from harness.config.schema import ContextConfig, RunConfig
from harness.model.supervised import (
    action_loss,
    collate,
    demo_examples,
    encode_demo,
    length_batches,
    sft_train,
)
from harness.model.tiny import init_tiny_model
from harness.model.tokenizer import episode_text, train_tokenizer
from harness.rl.demos import collect_demos
from harness.transcript.chat import ChatFormat
from harness.transcript.context import build_context, system_ids

TINY = {
    "hidden_size": 32,
    "num_layers": 1,
    "num_heads": 2,
    "intermediate_size": 64,
    "vocab_size": 320,
    "max_position": 256,
}


@pytest.fixture(scope="module")
def setup():
    demos, _ = collect_demos("frozenlake", {}, 32)
    tok = train_tokenizer([episode_text(d.instructions, d.observations, d.actions) for d in demos], 320)
    return demos, ChatFormat(tok)


def _model(chat, seed=0):
    return init_tiny_model(RunConfig.model_validate({"model": {"tiny": TINY}}).model.tiny, chat.tokenizer, seed)


def _spans(mask):
    """(start, end) of each run of ones."""
    out, start = [], None
    for i, m in enumerate(mask + [0]):
        if m and start is None:
            start = i
        if not m and start is not None:
            out.append((start, i))
            start = None
    return out


def test_layout_is_the_rollouts(setup):
    """prompt | a_1 | obs_2 | a_2 ... built from the same segments as the rollout; loss = actions+EOT."""
    demos, chat = setup
    full = ContextConfig()
    for d in demos[:8]:
        ids, mask = encode_demo(chat, d, 10_000)
        system = system_ids(chat, d.instructions)
        segments = [chat.observation(o) for o in d.observations]
        actions = [chat.action(a) for a in d.actions]
        assert ids == build_context(full, system, segments, actions[:-1]) + actions[-1]
        assert ids == chat.encode(episode_text(d.instructions, d.observations, d.actions))  # no drift
        spans = _spans(mask)
        assert [ids[s:e] for s, e in spans] == actions
        assert all(ids[e - 1] == chat.eot_id for _, e in spans)


@pytest.mark.parametrize("policy", ["window", "single"])
def test_per_step_layouts_follow_the_context_policy(setup, policy):
    demos, chat = setup
    ctx = ContextConfig(policy=policy, window=1)
    d = demos[0]
    rows = demo_examples(chat, d, 10_000, ctx)
    assert len(rows) == len(d.actions)
    system, segments, actions = system_ids(chat, d.instructions), [], []
    for t, (ids, mask) in enumerate(rows):
        segments.append(chat.observation(d.observations[t]))
        act = chat.action(d.actions[t])
        assert ids == build_context(ctx, system, segments, actions) + act
        assert mask == [0] * (len(ids) - len(act)) + [1] * len(act)
        actions.append(act)


def test_max_len_drops_whole_turns(setup):
    demos, chat = setup
    d = max(demos, key=lambda d: len(d.actions))
    ids, mask = encode_demo(chat, d, 10_000)
    cut_ids, cut_mask = encode_demo(chat, d, len(ids) - 1)
    assert len(_spans(cut_mask)) == len(d.actions) - 1 and ids[: len(cut_ids)] == cut_ids
    assert cut_ids[-1] == chat.eot_id


def test_loss_is_on_action_tokens_only(setup):
    demos, chat = setup
    model = _model(chat)
    ids, attn, lmask = collate([encode_demo(chat, d, 10_000) for d in demos[:4]], chat.pad_id, "cpu")
    with torch.no_grad():
        loss = action_loss(model, ids, attn, lmask)
        lp, _ = naive_token_logprobs(model, ids, attn)
    torch.testing.assert_close(loss, -(lp * lmask).sum() / lmask.sum(), atol=1e-5, rtol=0)
    assert 0 < lmask.sum() < 0.5 * attn.sum()  # prompt and observations carry no loss


def test_length_batches_cover_everything_once():
    lengths = [int(x) for x in torch.randint(10, 200, (103,), generator=torch.Generator().manual_seed(0))]
    a = length_batches(lengths, 8, torch.Generator().manual_seed(1))
    b = length_batches(lengths, 8, torch.Generator().manual_seed(1))
    assert a == b and sorted(i for batch in a for i in batch) == list(range(103))
    spread = sum(max(lengths[i] for i in x) - min(lengths[i] for i in x) for x in a) / len(a)
    assert spread < 40  # similar lengths batched together (random batches: ~150)


def test_sft_learns_and_is_deterministic(setup):
    demos, chat = setup
    runs = []
    for _ in range(2):
        model = _model(chat, seed=0)
        m = sft_train(model, chat, demos, epochs=3, lr=2e-2, batch_size=8, seed=4, max_len=256)
        runs.append((m, model.state_dict()))
    (m1, s1), (m2, s2) = runs
    assert m1["sft/epoch_losses"] == m2["sft/epoch_losses"]
    assert all(torch.equal(s1[k], s2[k]) for k in s1)
    assert m1["sft/epoch_losses"][-1] < 0.7 * m1["sft/epoch_losses"][0]
    assert m1["sft/steps"] == 12 and m1["sft/examples"] == 32


# ----------------------------------------------------------------------------- slow: held-out success
def greedy_success(policy, cfg: RunConfig, n: int = 200, greedy: bool = True) -> float:
    """Held-out success of `policy` through the real rollout engine (for measurement only)."""
    from envs import ENVS, make_env
    from envs.vector import VectorEnv
    from harness.rl.rollout import collect

    seeds = ENVS.get(cfg.env.name).task_seeds("heldout", n, cfg.env.options)
    venv = VectorEnv(cfg.env.name, cfg.env.options, n=n)
    try:
        eps = collect(
            policy.model,
            policy.chat,
            venv,
            [(s, i) for i, s in enumerate(seeds)],
            cfg,
            generator=torch.Generator().manual_seed(0),
            greedy=greedy,
            instructions=make_env(cfg.env.name, cfg.env.options).instructions,
        )
    finally:
        venv.close()
    return sum(e.won for e in eps) / n


@pytest.mark.slow
def test_default_tiny_model_solves_heldout_frozenlake(tmp_path):
    from harness.rl.build import load_policy

    cfg = RunConfig()
    policy = load_policy(cfg, tmp_path, "cpu")
    assert policy.info["base_info"]["pretrain"]["sft/final_loss"] < 0.5
    assert greedy_success(policy, cfg) >= 0.25
