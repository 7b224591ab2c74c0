"""The tiny model family: a small Qwen2-architecture model built from config on this machine.

`tiny_base(cfg, cache_dir, demos)` builds (or finds) the folder of a tiny base model: a byte-level
BPE tokenizer trained on the environment's text (`harness.model.tokenizer`), a Qwen2ForCausalLM
shaped by `model.tiny`, initialised from `model.tiny.init_seed`, then pre-trained by supervised
learning on `model.tiny.pretrain_demos` expert episodes (full fine-tuning, loss on action
tokens, `harness.model.supervised`), taken from `demos` (a `DemoSource`) only on a cache miss.
The folder is a content-addressed cache entry (`harness.model.cache`): its key covers the env and
its options, `model.tiny` and the source of the modules that build it (the expert's player
included), so every point of a sweep builds it once and shares it.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from harness.config.schema import RunConfig
from harness.model import base, logprobs, supervised, tokenizer
from harness.model.cache import build_once, code_version, content_hash
from harness.model.supervised import DemoSource, sft_train
from harness.model.tokenizer import episode_text, train_tokenizer
from harness.transcript import chat
from harness.transcript.chat import ChatFormat, observation_text

MIN_CORPUS_DEMOS = 64  # expert episodes the tokenizer sees at least, even with no pre-training


def code_key(demos: DemoSource) -> str:
    """Hash of the source that turns demonstrations into trained weights, and of the one that plays them."""
    return code_version(chat, tokenizer, logprobs, supervised, base, code_key) + demos.code


def tiny_cache_key(cfg: RunConfig, demos: DemoSource) -> str:
    return content_hash({"env": demos.key, "tiny": cfg.model.tiny.model_dump(), "code": code_key(demos)})


def tiny_config(tiny, tok, eot_id: int):
    from transformers import Qwen2Config

    heads = tiny.num_heads
    return Qwen2Config(
        vocab_size=len(tok),
        hidden_size=tiny.hidden_size,
        intermediate_size=tiny.intermediate_size,
        num_hidden_layers=tiny.num_layers,
        num_attention_heads=heads,
        num_key_value_heads=heads // 2 if heads % 2 == 0 else heads,
        max_position_embeddings=tiny.max_position,
        tie_word_embeddings=True,
        attention_dropout=0.0,
        bos_token_id=None,
        eos_token_id=eot_id,
        pad_token_id=tok.pad_token_id,
    )


def init_tiny_model(tiny, tok, seed: int) -> nn.Module:
    """A randomly initialised Qwen2ForCausalLM; same seed -> identical weights."""
    from transformers import Qwen2ForCausalLM

    fmt = ChatFormat(tok)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(tiny_config(tiny, tok, fmt.eot_id))
    model.generation_config.eos_token_id = fmt.eot_id
    model.generation_config.pad_token_id = fmt.pad_id
    return model.float()


def _build_tiny(cfg: RunConfig, out: Path, demos: DemoSource) -> dict:
    t = cfg.model.tiny
    pretrain, used = demos.take(t.pretrain_demos)
    corpus = list(pretrain)
    if len(corpus) < MIN_CORPUS_DEMOS:  # text for the tokenizer only
        corpus += demos.take(MIN_CORPUS_DEMOS - len(corpus), start=used)[0]
    texts = [
        episode_text(d.instructions, d.observations, d.actions) + observation_text(d.final_observation) for d in corpus
    ]
    texts += demos.markers()
    tok = train_tokenizer(texts, t.vocab_size, t.max_position)
    model = init_tiny_model(t, tok, t.init_seed)
    metrics = {}
    if pretrain and t.pretrain_epochs:
        stage = "pre-training the tiny model (optimizer steps)"
        metrics = sft_train(
            model,
            ChatFormat(tok),
            pretrain,
            t.pretrain_epochs,
            t.pretrain_lr,
            t.pretrain_batch_size,
            t.init_seed,
            t.max_position,
            progress=lambda done, total: demos.report(stage, done, total),
        )
    tok.save_pretrained(str(out))
    with base.no_progress_bars():
        model.save_pretrained(str(out))
    # demo_seed_index: the SFT warm-up takes its demonstrations from the train seeds after these
    return {
        "parameters": sum(p.numel() for p in model.parameters()),
        "vocab_size": len(tok),
        "pretrain": metrics,
        "demo_seed_index": used,
    }


def tiny_base(cfg: RunConfig, cache_dir: Path, demos: DemoSource) -> tuple[Path, bool]:
    """The cached tiny model folder (built on a miss, from `demos`) and whether this call built it."""
    return build_once(
        Path(cache_dir) / "models",
        tiny_cache_key(cfg, demos),
        lambda out: _build_tiny(cfg, out, demos),
        meta={"env": cfg.env.name, "tiny": cfg.model.tiny.model_dump()},
    )
