"""Builders for tests that run the real SmolLM2 tokenizer through the sampler without its weights.

The folder comes from the `smollm2` fixture of tests.helpers.real_model (fetched once per machine);
`tokenizer(folder)` loads its tokenizer once per session. `small_llama(vocab)` is a randomly initialised
Llama with the real vocabulary (GQA, two layers): the sampler's tests run the real tokenizer through a
real transformers model in milliseconds per token."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import torch


@lru_cache(maxsize=1)
def _tokenizer(path: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


def tokenizer(folder: Path):
    """The real tokenizer of the model in `folder` (loaded once per session; no weights)."""
    return _tokenizer(str(folder))


def small_llama(vocab: int, seed: int = 0, bias: torch.Tensor | None = None):
    """A random two-layer Llama over `vocab` ids (9 query / 3 key-value heads, as SmolLM2 groups them);
    `bias` (V,) is added to its output logits (the head gets a bias), to steer what it samples."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=36,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=9,
        num_key_value_heads=3,
        max_position_embeddings=2048,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config).eval()
    if bias is not None:
        model.lm_head.bias = torch.nn.Parameter(bias.float().clone(), requires_grad=False)
    return model
