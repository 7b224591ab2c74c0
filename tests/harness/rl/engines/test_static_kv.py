"""The static KV engine (`rollout.backend: static`): the same episodes as the default engine.

On CPU the engine runs eagerly; `buckets=True` runs its decode step at the static (bucketed)
shapes a CUDA graph captures, so the graph body is checked here too. The capture itself needs a
GPU: the `gpu` tests at the end compare replayed graphs with the eager step.
"""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM

from harness.rl.engines import kv_batch
from harness.rl.engines import static as static_kv
from harness.rl.engines.hf import KVBatch
from harness.rl.engines.static import StaticKVBatch, static_kv_batch
from tests.helpers.rollout import (
    TASKS,
    TINY_SHAPE,
    CounterEnv,
    EndlessEnv,
    concatenated,
    make_cfg,
    max_logprob_error,
    run,
    tiny_chat,
)


@pytest.fixture(scope="module")
def chat():
    return tiny_chat()


def qwen(vocab: int, eot: int | None = None, seed: int = 0, kind: str = "qwen2"):
    """A tiny model; with `eot`, an output bias makes the end-of-turn token likely (ragged actions)."""
    torch.manual_seed(seed)
    shape = dict(TINY_SHAPE, vocab_size=vocab)
    cls = {"qwen2": (Qwen2Config, Qwen2ForCausalLM), "qwen3": (Qwen3Config, Qwen3ForCausalLM)}
    cls["llama"] = (LlamaConfig, LlamaForCausalLM)
    config_cls, model_cls = cls[kind]
    if kind == "qwen3":
        shape["head_dim"] = 16
    model = model_cls(config_cls(**shape))
    model.config._attn_implementation = "sdpa"
    if eot is not None:
        head = torch.nn.Linear(64, vocab, bias=True)
        with torch.no_grad():
            head.weight.copy_(model.lm_head.weight)
            head.bias.zero_()
            head.bias[eot] = 2.5
        model.lm_head = head
    return model.eval()


def with_lora(model):
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(1)
    return get_peft_model(
        model, LoraConfig(r=4, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"], init_lora_weights=False)
    ).eval()


def steps(eps):
    return [(s.action_ids, s.sampler_logprobs) for e in eps for s in e.steps]


def assert_same_episodes(a, b, tol=1e-5):
    sa, sb = steps(a), steps(b)
    assert [x for x, _ in sa] == [x for x, _ in sb]
    worst = max(abs(p - q) for (_, la), (_, lb) in zip(sa, sb) for p, q in zip(la, lb))
    assert worst < tol, worst


@pytest.mark.parametrize("variant", ["plain", "lora", "top_p", "window", "constrain", "buckets"])
def test_static_engine_gives_the_default_engines_episodes(chat, variant):
    """Ragged batches over several turns (holes, rows leaving, KV reuse): the static engine
    samples the same tokens with the same log-probs as `KVBatch`, and they equal a full forward."""
    model = qwen(len(chat.tokenizer), chat.eot_id)
    if variant == "lora":
        model = with_lora(model)
    over = {"rollout__temperature": 0.7}
    if variant == "top_p":
        over["rollout__top_p"] = 0.8
    if variant == "window":
        over["context__policy"] = "window"
    if variant == "constrain":
        over["rollout__constrain"] = True
    cfg_hf, cfg_static = make_cfg(**over), make_cfg(**over)
    cfg_static.rollout.backend = "static"
    if variant == "buckets":  # the decode step at the shapes a CUDA graph captures
        static_kv._ENGINES[model] = StaticKVBatch(model, chat.pad_id, graphs=False, buckets=True)
    attrs = (
        {"env_attrs": {"admissible_actions": ["go", "stop", "go left go right ab ab abab"]}}
        if variant == "constrain"
        else {}
    )
    a = run(model, chat, TASKS, cfg_hf, seed=3, **attrs)
    b = run(model, chat, TASKS, cfg_static, seed=3, **attrs)
    assert isinstance(kv_batch(model, chat.pad_id, "static"), StaticKVBatch)
    assert sorted({e.num_turns for e in b}) == [1, 2, 3, 4]
    if variant != "constrain":  # (constrained: short admissible actions)
        assert len({len(s.action_ids) for e in b for s in e.steps}) > 2  # ragged actions: holes
    assert_same_episodes(a, b)
    if variant in ("plain", "lora", "buckets"):
        for ep in b:
            seq, targets = concatenated(ep)
            assert max_logprob_error(model, seq, targets, 0.7) < 1e-4


@pytest.mark.parametrize("buckets", [False, True])
def test_engine_is_kept_and_grows(chat, buckets):
    """One engine per model across calls; a long episode outgrows the first allocation (the
    buffer doubles) and still matches the default engine. With buckets (the graph shapes), the
    attended slots cross several 256-slot buckets and 3 rows run in a bucket of 4."""
    model = qwen(len(chat.tokenizer), chat.eot_id)
    cfg_hf, cfg_static = make_cfg(turns__max=40), make_cfg(turns__max=40)
    cfg_static.rollout.backend = "static"
    tasks = [(s, s) for s in range(3)]
    a = run(model, chat, tasks, cfg_hf, env=EndlessEnv, seed=5)
    if buckets:
        static_kv._ENGINES[model] = StaticKVBatch(model, chat.pad_id, graphs=False, buckets=True)
    engine = static_kv_batch(model, chat.pad_id)
    b = run(model, chat, tasks, cfg_static, env=EndlessEnv, seed=5)
    assert static_kv_batch(model, chat.pad_id) is engine
    assert engine.capacity[1] > static_kv.MIN_SLOTS  # grown past the first allocation
    if buckets:  # 3 rows in a bucket of 4; contexts of ~1,400 tokens: six slot buckets, 2,048 slots
        assert engine.capacity == (4, 2048)
    assert_same_episodes(a, b)
    c = run(model, chat, TASKS, cfg_static, env=CounterEnv, seed=5)  # reused for another batch
    assert_same_episodes(run(model, chat, TASKS, cfg_hf, env=CounterEnv, seed=5), c)
    static_kv.release(model)
    assert model not in static_kv._ENGINES


@pytest.mark.parametrize("kind", ["qwen2", "qwen3", "llama"])
def test_logits_equal_the_models_forward(chat, kind):
    """Prefill of a left-padded batch, then decode steps with a hole: every row's logits equal
    the model's own forward over its real tokens (Qwen3 adds per-head q/k norms)."""
    V = len(chat.tokenizer)
    model = qwen(V, kind=kind)
    rows = [[5, 9, 11, 30, 7], [12, 40], [3, 3, 8]]
    for buckets in (False, True):
        kv = StaticKVBatch(model, chat.pad_id, graphs=False, buckets=buckets)
        ref = KVBatch(model, chat.pad_id)
        kv.reset(3)
        ref.reset(3)
        with torch.no_grad():
            got, want = kv.prefill(rows), ref.prefill(rows)
            assert torch.allclose(got, want, atol=1e-5)
            seqs = [list(r) for r in rows]
            for step in range(4):
                ids = torch.tensor([[17 + step], [21], [33 + step]])
                real = torch.tensor([[True], [step < 2], [True]])  # row 1 finished: holes
                got, want = kv.feed(ids, real), ref.feed(ids, real)
                for b in range(3):
                    if real[b, 0]:
                        seqs[b].append(int(ids[b, 0]))
                        full = model(input_ids=torch.tensor([seqs[b]])).logits[0, -1]
                        assert torch.allclose(got[b], full, atol=1e-4)
                assert torch.allclose(got, want, atol=1e-5)
            kv.select([2, 0])  # holes squeezed out, rows reordered
            ref.select([2, 0])
            ids, real = torch.tensor([[50], [51]]), torch.ones(2, 1, dtype=torch.bool)
            assert torch.allclose(kv.feed(ids, real), ref.feed(ids, real), atol=1e-5)


def test_refuses_unsupported_models(chat):
    from transformers import GPT2Config, GPT2LMHeadModel

    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_embd=32, n_layer=1, n_head=2))
    with pytest.raises(ValueError, match="rollout.backend static supports model types"):
        StaticKVBatch(gpt2, 0)
    with pytest.raises(ValueError, match="CUDA graphs need the model on a CUDA device"):
        StaticKVBatch(qwen(len(chat.tokenizer)), chat.pad_id, graphs=True)


def test_lora_switched_off_drops_the_graphs(chat):
    model = with_lora(qwen(len(chat.tokenizer)))
    kv = StaticKVBatch(model, chat.pad_id, graphs=False, buckets=True)
    kv.reset(2)
    kv._graphs[(1, 1)] = ("stand-in",)
    kv.reset(2)
    assert kv._graphs  # nothing changed: kept
    with model.disable_adapter():
        kv.reset(2)
        assert not kv._graphs


def test_cache_grown_under_inference_mode_is_reset_outside_it(chat):
    """A caller may sample under torch.inference_mode (the bench does): a cache that grows there must
    still be reset outside it (an H200 bench failed with "Inplace update to inference tensor")."""
    model = qwen(len(chat.tokenizer))
    kv = StaticKVBatch(model, chat.pad_id, graphs=False, buckets=True)
    kv.reset(2)
    with torch.inference_mode():
        kv.prefill([[5] * 300, [6] * 300])  # past the first allocation of 256 slots
        kv.feed(torch.tensor([[7], [8]]), torch.ones(2, 1, dtype=torch.bool))
    assert kv.capacity[1] > static_kv.MIN_SLOTS
    kv.reset(2)
    assert kv.length.tolist()[:2] == [0, 0]
    assert not any(t.is_inference() for t in (kv.k, kv.v, kv.mask, kv.length, *kv._decode_inputs.values()))


def test_dropping_the_graphs_drops_their_pool(chat):
    """PyTorch frees a graph pool with its last graph; capturing into the stale handle fails an
    allocator assert on CUDA, so the engine forgets the handle with the graphs."""
    model = with_lora(qwen(len(chat.tokenizer)))
    kv = StaticKVBatch(model, chat.pad_id, graphs=False, buckets=True)
    kv.reset(2)
    kv._graphs[(1, 1)], kv._pool = ("stand-in",), ("pool",)
    with model.disable_adapter():
        kv.reset(2)
    assert not kv._graphs and kv._pool is None
    kv._graphs[(1, 1)], kv._pool = ("stand-in",), ("pool",)
    kv._ensure(2, 5000)  # regrown buffers: new addresses
    assert not kv._graphs and kv._pool is None


# ----------------------------------------------------------------------------- GPU
gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_graphs_replay_the_eager_step(chat, dtype):
    """On a GPU: the same episodes with captured graphs as with the static shapes run eagerly
    (float32: same tokens; bfloat16: same tokens for most rows, log-probs close)."""
    model = with_lora(qwen(len(chat.tokenizer), chat.eot_id)).to("cuda", dtype)
    cfg = make_cfg(rollout__temperature=0.7)
    cfg.rollout.backend = "static"
    static_kv._ENGINES[model] = StaticKVBatch(model, chat.pad_id, graphs=False, buckets=True)
    eager = run(model, chat, TASKS, cfg, seed=3)
    static_kv._ENGINES[model] = StaticKVBatch(model, chat.pad_id)
    assert static_kv._ENGINES[model].graphs_on
    graphed = run(model, chat, TASKS, cfg, seed=3)
    assert static_kv._ENGINES[model]._graphs  # captured

    def check(a, b):
        if dtype == torch.float32:
            assert_same_episodes(a, b, tol=1e-4)
        else:
            same = sum(x == y for (x, _), (y, _) in zip(steps(a), steps(b)))
            assert same >= 0.9 * len(steps(a))

    check(eager, graphed)
    # an optimizer step changes the LoRA weights in place: the captured graphs must see it
    engine = static_kv._ENGINES[model]
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.add_(0.5 * torch.randn_like(p))
    graphed_after = run(model, chat, TASKS, cfg, seed=3)
    assert static_kv._ENGINES[model] is engine and engine._graphs
    static_kv._ENGINES[model] = StaticKVBatch(model, chat.pad_id, graphs=False, buckets=True)
    eager_after = run(model, chat, TASKS, cfg, seed=3)
    check(eager_after, graphed_after)
    assert steps(eager_after) != steps(eager)  # the update changed the policy
    # the adapters switched off (reference log-probs, the judge) and on again drop the graphs and
    # their pool twice; the captures after that must not reuse the freed pool (an allocator assert)
    static_kv._ENGINES[model] = engine
    with model.disable_adapter():
        run(model, chat, TASKS, cfg, seed=3)
    check(graphed_after, run(model, chat, TASKS, cfg, seed=3))
