"""The policy: tiny-model build and cache, LoRA reference, adapters, value head, load errors."""

from __future__ import annotations

import json
import os

import pytest
import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM

import harness.model.tiny as tiny_family
from harness.config.errors import ConfigError
from harness.config.schema import RunConfig
from harness.model.base import ModelError
from harness.model.tiny import init_tiny_model
from harness.model.tokenizer import episode_text, train_tokenizer
from harness.rl.build import load_policy
from harness.rl.demos import Demonstrations, collect_demos
from tests.helpers.configs import small_cfg


def _ids(policy, n=2):
    demos = collect_demos("frozenlake", {}, n)[0]
    rows = [policy.chat.encode(episode_text(d.instructions, d.observations, d.actions)) for d in demos]
    T = min(len(r) for r in rows)
    ids = torch.tensor([r[:T] for r in rows])
    return ids, torch.ones_like(ids)


def _logits(model, ids, mask):
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=mask).logits


def _entry(root):
    """The one complete cache entry under root (lock files and temporary folders start with '.')."""
    (entry,) = [p for p in root.iterdir() if not p.name.startswith(".")]
    return entry


def test_tiny_init_is_deterministic():
    demos = collect_demos("frozenlake", {}, 8)[0]
    tok = train_tokenizer([episode_text(d.instructions, d.observations, d.actions) for d in demos], 300)
    tiny = small_cfg().model.tiny
    a, b, c = (init_tiny_model(tiny, tok, s) for s in (0, 0, 1))
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not torch.equal(sa["model.embed_tokens.weight"], c.state_dict()["model.embed_tokens.weight"])
    assert a.config.tie_word_embeddings and a.config.vocab_size == len(tok)


def test_build_cache_hit_and_determinism(tmp_path, monkeypatch):
    cfg = small_cfg()
    p1 = load_policy(cfg, tmp_path / "a", "cpu")
    assert p1.info["base_built"] and p1.info["base_info"]["pretrain"]["sft/steps"] == 3
    entry = _entry(tmp_path / "a" / "models")
    record = json.loads((entry / "DONE.json").read_text())
    assert record["info"]["parameters"] > 0 and record["info"]["demo_seed_index"] == 12

    def no_build(*_):
        raise AssertionError("rebuilt despite a complete cache entry")

    monkeypatch.setattr(tiny_family, "_build_tiny", no_build)
    p2 = load_policy(cfg, tmp_path / "a", "cpu")
    assert not p2.info["base_built"]
    s1, s2 = p1.model.state_dict(), p2.model.state_dict()
    assert all(torch.equal(s1[k], s2[k]) for k in s1)
    monkeypatch.undo()
    p3 = load_policy(cfg, tmp_path / "b", "cpu")  # a fresh build elsewhere: bit-identical
    assert p3.info["base_built"]
    s3 = p3.model.state_dict()
    assert all(torch.equal(s1[k], s3[k]) for k in s1)
    other = small_cfg(**{"model.tiny.pretrain_demos": 8})
    demos = Demonstrations.of(cfg)  # the same environment for the three configs
    assert tiny_family.tiny_cache_key(other, demos) != tiny_family.tiny_cache_key(cfg, demos)
    assert tiny_family.tiny_cache_key(small_cfg(**{"train.seed": 9}), demos) == tiny_family.tiny_cache_key(cfg, demos)


@pytest.fixture(scope="module")
def lora_policy(tmp_path_factory):
    return load_policy(small_cfg(), tmp_path_factory.mktemp("cache"), "cpu")


def test_lora_reference_is_base_and_stays(lora_policy, tmp_path):
    p = lora_policy
    ids, mask = _ids(p)
    base = AutoModelForCausalLM.from_pretrained(p.model.peft_config["default"].base_model_name_or_path).eval()
    base_logits = _logits(base, ids, mask)
    with p.reference() as ref:
        assert ref is p.model  # no second copy
        torch.testing.assert_close(_logits(ref, ids, mask), base_logits, rtol=0, atol=1e-6)
    torch.testing.assert_close(_logits(p.model, ids, mask), base_logits, rtol=0, atol=1e-6)  # B = 0 at start
    trainable = p.actor_parameters()
    assert trainable and all("lora_" in n for n, q in p.model.named_parameters() if q.requires_grad)
    opt = torch.optim.SGD(trainable, lr=1.0)
    from harness.model.logprobs import token_logprobs

    for _ in range(2):  # two steps: the first only moves B (A's gradient is 0 while B = 0)
        opt.zero_grad()
        (-token_logprobs(p.model, ids, mask)[0].sum()).backward()
        opt.step()
    assert not torch.allclose(_logits(p.model, ids, mask), base_logits, atol=1e-4)
    with p.reference() as ref:
        torch.testing.assert_close(_logits(ref, ids, mask), base_logits, rtol=0, atol=1e-6)

    p.save_adapter(tmp_path / "adapter")
    assert (tmp_path / "adapter" / "adapter_config.json").exists()
    fresh = AutoModelForCausalLM.from_pretrained(p.model.peft_config["default"].base_model_name_or_path)
    loaded = PeftModel.from_pretrained(fresh, str(tmp_path / "adapter")).eval()
    torch.testing.assert_close(_logits(loaded, ids, mask), _logits(p.model, ids, mask), rtol=0, atol=1e-6)


def test_value_head_shapes_and_gradients(lora_policy):
    p = lora_policy
    ids, mask = _ids(p)
    mask[1, -3:] = 0
    v = p.values(ids, mask)
    assert v.shape == ids.shape and v.dtype == torch.float32 and torch.all(v == 0)  # zero-initialised
    (v - 1.0).pow(2).mul(mask).sum().backward()
    assert p.value_head.proj.weight.grad.abs().sum() > 0
    assert {id(q) for q in p.critic_parameters()}.isdisjoint({id(q) for q in p.actor_parameters()})
    assert set(p.trainable_modules()) == {"model", "value_head"}
    p.model.zero_grad(set_to_none=True)
    p.value_head.zero_grad(set_to_none=True)


def test_value_at_t_is_the_state_before_token_t(lora_policy):
    """Values align with log-probs: V[t] sees tokens < t only (verl's critic slicing)."""
    p = lora_policy
    head = p.value_head
    with torch.no_grad():
        head.proj.weight.normal_(generator=torch.Generator().manual_seed(0))
    try:
        ids, mask = _ids(p)
        changed = ids.clone()
        changed[:, 3] = (ids[:, 3] + 1) % p.model.get_input_embeddings().weight.shape[0]
        with torch.no_grad():
            a, b = p.values(ids, mask), p.values(changed, mask)
        assert torch.all(a[:, 0] == 0)
        torch.testing.assert_close(a[:, :4], b[:, :4], rtol=0, atol=0)  # tokens < t only
        assert not torch.allclose(a[:, 4], b[:, 4])  # token 3 is seen from position 4 on
    finally:
        with torch.no_grad():
            head.proj.weight.zero_()


def test_full_finetune_reference_is_a_frozen_copy(tmp_path):
    p = load_policy(small_cfg(**{"model.finetune": "full"}), tmp_path, "cpu")
    ids, mask = _ids(p)
    with p.reference() as ref:
        before = _logits(ref, ids, mask)
        assert ref is not p.model and not any(q.requires_grad for q in ref.parameters())
    opt = torch.optim.SGD(p.actor_parameters(), lr=0.5)
    from harness.model.logprobs import token_logprobs

    (-token_logprobs(p.model, ids, mask)[0].sum()).backward()
    opt.step()
    assert not torch.allclose(_logits(p.model, ids, mask), before, atol=1e-4)
    with p.reference() as ref:
        torch.testing.assert_close(_logits(ref, ids, mask), before, rtol=0, atol=0)


def test_sft_warmup_is_cached_and_is_the_reference(tmp_path, monkeypatch):
    cfg = small_cfg(**{"sft.demos": 6, "sft.epochs": 1, "sft.lr": 1e-2, "sft.batch_size": 3})
    p = load_policy(cfg, tmp_path, "cpu")
    assert p.info["sft_built"] and p.info["sft_info"]["demo_seeds"][0] == 12  # after the pre-training demos
    ids, mask = _ids(p)
    base = AutoModelForCausalLM.from_pretrained(str(_entry(tmp_path / "models")))
    with p.reference() as ref:
        warm = _logits(ref, ids, mask)
    assert not torch.allclose(warm, _logits(base.eval(), ids, mask), atol=1e-4)  # the reference is the SFT model
    monkeypatch.setattr("harness.model.sft.sft_train", lambda *a, **k: (_ for _ in ()).throw(AssertionError("rebuilt")))
    q = load_policy(
        small_cfg(**{"sft.demos": 6, "sft.epochs": 1, "sft.lr": 1e-2, "sft.batch_size": 3, "train.seed": 5}),
        tmp_path,
        "cpu",
    )
    assert not q.info["sft_built"]
    with q.reference() as ref:
        torch.testing.assert_close(_logits(ref, ids, mask), warm, rtol=0, atol=0)


def test_a_cache_build_runs_on_the_machines_width_whatever_the_callers_threads(tmp_path):
    # the entry must not depend on which point built it: on some CPUs (an Intel Xeon with AMX) a
    # 2-thread build differs from a 1-thread one in the last bits, so the width is the machine's
    # (min(BUILD_THREADS, cores)), never the calling point's train.threads; the shipped width
    # (128 x 4 layers, 512-wide MLP) with episode-long batches, so that torch splits the work
    import harness.model.cache as cache

    cfg = RunConfig.model_validate(
        {
            "model": {"tiny": {"pretrain_demos": 48, "pretrain_epochs": 1}},
            "sft": {"demos": 16, "epochs": 1, "lr": 1e-3},
            "train": {"seed": 3},
        }
    )
    width = min(cache.BUILD_THREADS, len(os.sched_getaffinity(0)))
    callers = (1, width + 1)
    before = torch.get_num_threads()
    try:
        for n in callers:
            torch.set_num_threads(n)
            load_policy(cfg, tmp_path / str(n), "cpu")
            assert torch.get_num_threads() == n  # the caller's count, restored after the build
            for kind in ("models", "sft"):
                assert json.loads((_entry(tmp_path / str(n) / kind) / "DONE.json").read_text())["threads"] == width
    finally:
        torch.set_num_threads(before)
    for kind in ("models", "sft"):
        files = [sorted(_entry(tmp_path / str(n) / kind).glob("*.safetensors")) for n in callers]
        assert files[0] and [f.name for f in files[0]] == [f.name for f in files[1]]
        assert all(a.read_bytes() == b.read_bytes() for a, b in zip(*files))


@pytest.mark.parametrize("name", ["/nonexistent/model/dir", "./no-such-model", "no-such-org/no-such-model-xyz"])
def test_unavailable_model_is_a_clear_error(tmp_path, name, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelError) as err:
        load_policy(small_cfg(**{"model.name": name}), tmp_path, "cpu")
    assert isinstance(err.value, ConfigError)
    msg = str(err.value)
    assert "model.name" in msg and name in msg and "tiny" in msg and "\n" not in msg


def _racer(root, out, barrier):
    from harness.model.cache import build_once

    def build(tmp):
        with open(out, "a") as f:
            f.write("built\n")
        import time

        time.sleep(0.3)  # a slow build: the other process must wait, not build again
        (tmp / "weights.bin").write_bytes(b"x")
        return {"ok": True}

    barrier.wait()
    build_once(root, "k", build)


def test_parallel_points_build_once(tmp_path):
    import multiprocessing as mp

    ctx = mp.get_context("fork")
    barrier = ctx.Barrier(3)
    procs = [ctx.Process(target=_racer, args=(tmp_path / "c", tmp_path / "log", barrier)) for _ in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(30)
    assert all(p.exitcode == 0 for p in procs)
    assert (tmp_path / "log").read_text() == "built\n"
    assert (tmp_path / "c" / "k" / "weights.bin").exists() and (tmp_path / "c" / "k" / "DONE.json").exists()
    assert not list((tmp_path / "c").glob(".k.tmp-*"))


def test_local_path_and_dtype(lora_policy):
    name = lora_policy.model.peft_config["default"].base_model_name_or_path
    p = load_policy(small_cfg(**{"model.name": name, "model.dtype": "bfloat16"}), "/nonexistent-cache", "cpu")
    assert p.info["base"] == name and next(p.model.parameters()).dtype == torch.bfloat16
    assert p.chat.eot_id == lora_policy.chat.eot_id


def test_skip_demo_tasks_starts_rl_after_the_demonstrations(tmp_path, monkeypatch):
    from envs.registry import ENVS
    from harness.experiments.tracking import RunLogger
    from harness.rl.trainer import Trainer

    monkeypatch.setenv("HARNESS_CACHE", str(tmp_path / "cache"))
    train = ENVS.get("frozenlake").task_seeds("train", 400)
    sft = {"sft.demos": 6, "sft.epochs": 1, "sft.lr": 1e-2, "sft.batch_size": 3}
    for over, used in (({}, 12), (sft, None)):
        on = Trainer(small_cfg(**over, **{"env.skip_demo_tasks": True}), tmp_path / "on", RunLogger(tmp_path / "lon"))
        off = Trainer(small_cfg(**over), tmp_path / "off", RunLogger(tmp_path / "loff"))
        info = on.policy.info
        if used is None:  # the warm-up's demonstrations follow the pre-training's 12
            used = info["sft_info"]["demo_seeds"][1]
            assert used > 12
        demo_seeds = set(train[:used])
        assert on.worker.task_offset == used and off.worker.task_offset == 0
        k = on.cfg.rollout.tasks_per_update
        assert on.worker.train_tasks(0, 0) == train[used : used + k] and off.worker.train_tasks(0, 0) == train[:k]
        assert not demo_seeds & {s for u in range(5) for s in on.worker.train_tasks(u, 0)}
        on.close(), off.close()
    pool = Trainer(
        small_cfg(**{"env.skip_demo_tasks": True, "env.train_tasks": 5}), tmp_path / "p", RunLogger(tmp_path / "lp")
    )
    assert pool.worker.train_pool == train[12:17]
    pool.close()


def test_import_harness_makes_waiting_openmp_threads_sleep():
    # scheduling only (a cache build beside other workers does not spin on their cores); an
    # explicit setting wins
    import subprocess
    import sys

    code = "import os, harness; print(os.environ['OMP_WAIT_POLICY'])"
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}

    def policy(e: dict) -> str:
        return subprocess.run([sys.executable, "-c", code], env=e, capture_output=True, text=True, check=True).stdout

    assert policy(env).strip() == "PASSIVE"
    assert policy({**env, "OMP_WAIT_POLICY": "ACTIVE"}).strip() == "ACTIVE"
