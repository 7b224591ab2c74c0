"""Rollout engine: exact ids, sampler log-probs vs a full forward, KV reuse, policies, budgets."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from harness.rl.rollout import collect
from harness.rl.turns import turn_budget_at
from harness.transcript.chat import TRUNCATED
from tests.helpers.rollout import (
    TASKS,
    Biased,
    CounterEnv,
    EndlessEnv,
    concatenated,
    eot_biased,
    full_forward_logprobs,
    make_cfg,
    max_logprob_error,
    run,
    tiny_model,
)

# the shape of the rollout tests' models (also used by tests/harness/rl/engines/test_static_kv.py)


# ----------------------------------------------------------------------------- helpers


# ----------------------------------------------------------------------------- tests
def test_determinism(chat):
    model = eot_biased(chat)
    a = run(model, chat, TASKS, seed=7)
    b = run(model, chat, TASKS, seed=7)
    c = run(model, chat, TASKS, seed=8)
    assert [dataclasses.asdict(e) for e in a] == [dataclasses.asdict(e) for e in b]
    assert [s.action_ids for e in a for s in e.steps] != [s.action_ids for e in c for s in e.steps]


@pytest.mark.parametrize("variant", ["sdpa", "eager", "peft", "top_p"])
def test_kv_reuse_logprobs_equal_full_forward(chat, variant):
    """Ragged batch (different observation lengths, action lengths and numbers of turns):
    every sampler log-prob equals one full forward over the concatenated sequence."""
    model = eot_biased(chat, attn="eager" if variant == "eager" else "sdpa")
    if variant == "peft":
        from peft import LoraConfig, get_peft_model

        torch.manual_seed(1)
        model.inner = get_peft_model(
            model.inner, LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
        )
    cfg = make_cfg(rollout__temperature=0.7, rollout__top_p=0.8 if variant == "top_p" else 1.0)
    eps = run(model, chat, TASKS, cfg)
    turns = [e.num_turns for e in eps]
    assert sorted(set(turns)) == [1, 2, 3, 4] and all(e.won for e in eps)
    lengths = {len(s.action_ids) for e in eps for s in e.steps}
    assert len(lengths) > 2  # ragged actions: holes in the shared cache
    for ep in eps:
        assert all(s.context_ids is None for s in ep.steps)
        seq, targets = concatenated(ep)
        assert max_logprob_error(model, seq, targets, 0.7) < 1e-4


def test_reuse_cache_off_gives_same_episodes(chat):
    model = eot_biased(chat)
    a, b = run(model, chat, TASKS), run(model, chat, TASKS, reuse_cache=False)
    assert [s.action_ids for e in a for s in e.steps] == [s.action_ids for e in b for s in e.steps]
    for ea, eb in zip(a, b):
        for sa, sb in zip(ea.steps, eb.steps):
            assert max(abs(x - y) for x, y in zip(sa.sampler_logprobs, sb.sampler_logprobs)) < 1e-4


def test_no_decode_encode_drift(chat):
    """The model is steered to emit 'a','b',EOT; 'ab' is one BPE token, so decode->encode would
    give different ids. Records keep the sampled ids, and the trainer's stream is what was fed."""
    from harness.rl.batch import episode_stream

    V = len(chat.tokenizer)
    a, b = chat.encode("a")[0], chat.encode("b")[0]
    assert chat.encode("ab") != [a, b]  # re-encoding would merge
    table = torch.zeros(V, V)
    table[chat.observation("x")[-1], a] = 50.0  # after "assistant\n": a
    table[a, b] = 50.0
    table[b, chat.eot_id] = 50.0
    model = Biased(tiny_model(V), table)
    fed: list[int] = []
    inner_forward = model.forward

    def recording_forward(input_ids, **kw):
        fed.extend(input_ids[0].tolist())  # batch of one: no padding, no holes
        return inner_forward(input_ids, **kw)

    model.forward = recording_forward
    [ep] = run(model, chat, [(3, 0)])  # 4 turns
    assert ep.num_turns == 4
    for st in ep.steps:
        assert st.action_ids == [a, b, chat.eot_id] and st.action_text == "ab"
        assert chat.action(st.action_text) != st.action_ids  # the drift the engine avoids
    stream = episode_stream(ep).ids
    assert stream == concatenated(ep)[0]
    assert fed == stream[:-1]  # everything but the last sampled token was fed, in order


def test_overflow_at_max_new_tokens(chat):
    V = len(chat.tokenizer)
    table = torch.zeros(V, V)
    table[:, chat.eot_id] = -1e4  # never ends a turn
    model = Biased(tiny_model(V), table)
    cfg = make_cfg(max_new_tokens=5, turns__overflow_penalty=0.2)
    eps = run(model, chat, TASKS[:4], cfg)
    for ep in eps:
        for st in ep.steps:
            assert st.overflow and len(st.action_ids) == 5 and chat.eot_id not in st.action_ids
            assert st.reward == pytest.approx((1.0 if st.done else 0.0) - 0.2)
        seq, targets = concatenated(ep)
        assert max_logprob_error(model, seq, targets, 1.0) < 1e-4


def test_turn_budget_truncation_and_final_note(chat):
    model = eot_biased(chat)
    cfg = make_cfg(turns__overflow_penalty=0.2, turns__curriculum=[2, 3])
    eps = run(model, chat, TASKS[:3], cfg, env=EndlessEnv, turn_budget=3)
    note = "Last turn: answer now."
    for ep in eps:
        assert ep.num_turns == 3 and ep.truncated and not ep.won and ep.turn_budget == 3
        assert not ep.steps[-1].done
        assert [note in chat.tokenizer.decode(s.obs_ids) for s in ep.steps] == [False, False, True]
        last = ep.steps[-1]
        assert last.reward == pytest.approx(-0.2)  # penalised once even if it also overflowed
    cfg.turns.final_turn_note = ""
    eps = run(model, chat, TASKS[:3], cfg, env=EndlessEnv, turn_budget=3)
    assert not any(note in chat.tokenizer.decode(s.obs_ids) for e in eps for s in e.steps)
    assert make_cfg().turns.final_turn_note is None


def test_curriculum_budgets():
    cfg = make_cfg(turns__curriculum=[2, 4, 6], turns__curriculum_every=3)
    assert [turn_budget_at(u, cfg.turns) for u in range(10)] == [2, 2, 2, 4, 4, 4, 6, 6, 6, 6]
    assert turn_budget_at(5, make_cfg(turns__max=7).turns) == 7


def _segments(ep, system_len):
    return [st.obs_ids[system_len:] if st.turn == 0 else st.obs_ids for st in ep.steps]


@pytest.mark.parametrize("policy", ["window", "single", "obs_truncate"])
def test_context_policies(chat, policy):
    from harness.transcript.context import system_ids

    model = eot_biased(chat)
    cfg = make_cfg(context__policy=policy, context__window=2, context__obs_tokens=4, rollout__temperature=0.7)
    eps = run(model, chat, TASKS[:4], cfg, env=EndlessEnv, turn_budget=5)
    system = system_ids(chat, CounterEnv().instructions)
    for ep in eps:
        segs, acts = _segments(ep, len(system)), [s.action_ids for s in ep.steps]
        for t, st in enumerate(ep.steps):
            if policy == "window":
                j = max(0, t - 2)
                want = system + sum((segs[i] + acts[i] for i in range(j, t)), []) + segs[t]
                assert st.context_ids == want  # exactly the last 2 turns and the current observation
            elif policy == "single":
                assert st.context_ids == chat.prompt(CounterEnv().instructions, st.observation)
            else:
                assert st.context_ids == system + sum((segs[i] + acts[i] for i in range(t)), []) + segs[t]
                body = chat.observation(st.observation)
                if len(chat.encode(st.observation)) > 4:
                    assert TRUNCATED in chat.tokenizer.decode(st.obs_ids) and st.obs_ids != body
                    assert len(segs[t]) <= len(chat.observation("")) + 4 + len(chat.encode(TRUNCATED))
            assert st.context_ids[-len(st.obs_ids) :] == st.obs_ids
            targets = [
                (len(st.context_ids) - 1 + k, a, lp)
                for k, (a, lp) in enumerate(zip(st.action_ids, st.sampler_logprobs))
            ]
            assert max_logprob_error(model, st.context_ids + st.action_ids, targets, 0.7) < 1e-4
    if policy == "obs_truncate":
        assert any(TRUNCATED in chat.tokenizer.decode(s.obs_ids) for e in eps for s in e.steps)


def test_constrained_decoding_emits_only_admissible(chat):
    from harness.rl.sampling import ActionTrie

    admissible = ["go", "stop", "go left", "ab", "x y z"]
    model = eot_biased(chat, eot_bias=0.0)
    cfg = make_cfg(rollout__constrain=True, rollout__temperature=1.3, max_new_tokens=12)
    eps = run(model, chat, TASKS, cfg, env_attrs={"admissible_actions": admissible})
    seqs = [chat.action(a) for a in admissible]
    emitted = set()
    for ep in eps:
        seq, targets = concatenated(ep)
        lps = full_forward_logprobs(model, seq, 1.3)
        for st in ep.steps:
            assert st.action_text in admissible and st.action_ids in seqs and not st.overflow
            emitted.add(st.action_text)
        raw = [lp for st in ep.steps for lp in st.unconstrained_logprobs]
        assert max(abs(lps[p, a].item() - r) for (p, a, _), r in zip(targets, raw)) < 1e-4
        # constrained log-prob = log-prob renormalised over the trie's allowed continuations
        trie, k = ActionTrie(seqs), 0
        for st in ep.steps:
            node = trie.root
            for a, lp in zip(st.action_ids, st.sampler_logprobs):
                p = targets[k][0]
                want = lps[p, a] - torch.logsumexp(lps[p, list(node)], 0)
                assert abs(want.item() - lp) < 1e-4
                node, k = node[a], k + 1
    assert len(emitted) >= 3


@pytest.mark.parametrize("policy", ["full", "window"])
def test_trainer_logprobs_equal_constrained_sampler(chat, policy):
    """The training batch carries each constrained token's admissible set, so the trainer's
    log-probs are those of the renormalised distribution the sampler drew from (both layouts)."""
    from harness.model.logprobs import token_logprobs
    from harness.rl.batch import build_batch

    admissible = ["go", "stop", "go left", "ab", "x y z"]
    model = tiny_model(len(chat.tokenizer))
    cfg = make_cfg(rollout__constrain=True, rollout__temperature=1.3, context__policy=policy, max_new_tokens=12)
    eps = run(model, chat, TASKS, cfg, env_attrs={"admissible_actions": admissible})
    batch = build_batch(eps, concatenated=policy == "full", mask_observations=True, pad_id=chat.pad_id)
    assert batch.allowed is not None and batch.allowed.shape[:2] == batch.input_ids.shape
    act = batch.action_mask.bool()
    assert (batch.allowed[..., 0][act] >= 0).all() and (batch.allowed[..., 0][~act] == -1).all()
    with torch.no_grad():
        lp, _ = token_logprobs(model, batch.input_ids, batch.attention_mask, temperature=1.3, allowed=batch.allowed)
        free, _ = token_logprobs(model, batch.input_ids, batch.attention_mask, temperature=1.3)
    assert (lp[act] - batch.sampler_logp[act]).abs().max() < 1e-4
    assert (free[act] - batch.sampler_logp[act]).abs().max() > 1e-2  # the unconstrained ones differ
    raw = torch.tensor([x for ep in eps for st in ep.steps for x in st.unconstrained_logprobs])
    if policy == "full":
        assert (free[act] - raw).abs().max() < 1e-4
    sub = batch.rows(torch.tensor([1, 2]))
    assert sub.allowed.shape[:2] == sub.input_ids.shape
    from harness.diagnostics.episode_metrics import episode_metrics

    mass = episode_metrics(eps, "env")["env/constrained_mass"]
    zs = [
        math.exp(r - c) for ep in eps for st in ep.steps for r, c in zip(st.unconstrained_logprobs, st.sampler_logprobs)
    ]
    assert 0 < min(zs) and max(zs) <= 1 + 1e-5 and mass == pytest.approx(sum(zs) / len(zs))
    assert "env/constrained_mass" not in episode_metrics(run(model, chat, TASKS[:2]), "env")


def test_env_error_ends_episode(chat):
    model = eot_biased(chat)
    eps = run(model, chat, TASKS[:4], env_attrs={"fail_at": 1})
    for ep in eps:
        if ep.task_seed % 4 == 0:  # one-turn episodes end before the crash
            assert ep.env_error is None and ep.won
        else:
            assert ep.env_error and "crashed" in ep.env_error and ep.num_turns == 2 and ep.steps[-1].done


def test_bench_helpers_smoke(chat):
    from harness.bench.rollout import bench_batched_vs_sequential, bench_turn_cost

    model = eot_biased(chat, eot_bias=-1e4)
    cfg = make_cfg(max_new_tokens=3)
    r = bench_batched_vs_sequential(model, chat, cfg, batch=2, turns=2)
    assert r["speedup"] > 0 and r["batched_tokens_per_s"] > 0
    r = bench_turn_cost(model, chat, cfg, batch=2, turns=3, repeats=1)
    assert r["reuse_ratio"] > 0 and r["no_reuse_ratio"] > 0


def test_with_real_vector_env(chat):
    """The real VectorEnv contract (frozenlake, in-process), constrained and free decoding."""
    from envs.vector import VectorEnv

    model = eot_biased(chat, eot_bias=0.0)
    for constrain in (True, False):
        cfg = make_cfg(rollout__constrain=constrain, turns__overflow_penalty=0.1)
        with VectorEnv("frozenlake", n=4, max_turns=3) as venv:
            eps = collect(
                model,
                chat,
                venv,
                [(0, 0), (0, 0), (2, 1), (2, 1)],
                cfg,
                generator=torch.Generator().manual_seed(0),
                instructions=venv.instructions,
            )
        for ep in eps:
            assert 1 <= ep.num_turns <= 3 and ep.env_error is None
            if ep.truncated:
                assert not ep.steps[-1].done and ep.steps[-1].reward <= -0.1 + 1e-9
            seq, targets = concatenated(ep)
            if not constrain:
                assert max_logprob_error(model, seq, targets, 1.0) < 1e-4
            else:
                assert all(s.unconstrained_logprobs is not None for s in ep.steps)
                assert all(s.action_text in ("up", "down", "left", "right") for s in ep.steps)


# ----------------------------------------------------------------------------- rollout.share_prefix
GROUPED = [(s, g) for g, s in enumerate((0, 4, 7)) for _ in range(3)]  # 3 groups of 3 rows of one task each


@pytest.mark.parametrize("policy", ["full", "window"])
def test_a_shared_first_prefill_gives_the_same_episodes(chat, policy, monkeypatch):
    """rollout.share_prefix: a group's rows prefill their common first segment once (every turn's segment
    under a context rebuilt each turn); the episodes are those of the plain prefill: the same tokens, and
    log-probs within float rounding (on this project's CPU equal bit for bit)."""
    model = eot_biased(chat)
    plain_cfg = make_cfg(context__policy=policy, rollout__temperature=0.7)
    shared_cfg = make_cfg(context__policy=policy, rollout__temperature=0.7, rollout__share_prefix=True)
    import harness.rl.rollout as rollout

    a = run(model, chat, GROUPED, plain_cfg)
    rows, share = [], rollout.prefill_shared
    monkeypatch.setattr(rollout, "prefill_shared", lambda kv, ids: rows.append(len(ids)) or share(kv, ids))
    b = run(model, chat, GROUPED, shared_cfg)
    assert rows[0] == len(GROUPED) and (len(rows) == 1) == (policy == "full")  # the first turn, or every turn
    assert len({len(s.action_ids) for e in a for s in e.steps}) > 1 and max(e.num_turns for e in a) > 1
    assert [s.action_ids for e in a for s in e.steps] == [s.action_ids for e in b for s in e.steps]
    for ea, eb in zip(a, b):
        for sa, sb in zip(ea.steps, eb.steps):
            assert max(abs(x - y) for x, y in zip(sa.sampler_logprobs, sb.sampler_logprobs)) < 1e-5
    if policy == "full":  # and the sampler's log-probs are still those of one full forward per episode
        for ep in b:
            seq, targets = concatenated(ep)
            assert max_logprob_error(model, seq, targets, 0.7) < 1e-4


def test_prefill_shared_runs_each_distinct_segment_once_into_an_empty_cache(chat):
    from harness.rl.engines.hf import KVBatch, prefill_shared

    model = tiny_model(len(chat.tokenizer))
    rows = [[5, 6, 7], [5, 6, 7], [9, 8], [5, 6, 7], [9, 8]]
    plain, shared = KVBatch(model, chat.pad_id), KVBatch(model, chat.pad_id)
    plain.reset(len(rows))
    shared.reset(len(rows))
    fed = []
    feed = shared.feed
    shared.feed = lambda ids, real: fed.append(ids.shape[0]) or feed(ids, real)
    with torch.no_grad():
        lp, ls = plain.prefill(rows), prefill_shared(shared, rows)
        assert fed == [2]  # two distinct segments, one row each
        assert (lp - ls).abs().max().item() < 1e-5 and torch.equal(plain.mask, shared.mask)
        assert torch.equal(plain.length, shared.length)
        nxt = [[3], [4, 4], [3], [2], [7, 7, 7]]  # the rows part: each row's cache is its own copy
        assert (plain.prefill(nxt) - shared.prefill(nxt)).abs().max().item() < 1e-5
        with pytest.raises(ValueError, match="already holds tokens"):
            prefill_shared(shared, rows)
        distinct = KVBatch(model, chat.pad_id)
        distinct.reset(2)
        assert prefill_shared(distinct, [[1, 2], [2, 1]]).shape[0] == 2


def test_share_prefix_is_refused_off_our_growing_cache_engine():
    from harness.config.errors import ConfigError
    from harness.config.loading import validate_run_config

    with pytest.raises(ConfigError, match="rollout.share_prefix: true with rollout.backend = 'static'"):
        validate_run_config({"rollout": {"share_prefix": True, "backend": "static"}}, "test")
