"""The packaged SmolLM2-135M-Instruct for tests that need a real BPE tokenizer with a chat template, or the
real model: found where `harness models fetch smollm2-135m-instruct` put it ($HARNESS_CACHE, else the default
results/.cache of this checkout); a test that needs it is skipped, saying that command, when it is absent.

`small_llama(vocab)` is a randomly initialised Llama with the real vocabulary (GQA, two layers): the
sampler's tests run the real tokenizer through a real transformers model in milliseconds per token."""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path

import pytest
import torch

NAME = "smollm2-135m-instruct"
REPO_ROOT = Path(__file__).resolve().parents[2]


def folder() -> Path | None:
    """The converted model folder, or None when it has not been fetched."""
    from harness.model.packaged import fetched_path

    for cache in (os.environ.get("HARNESS_CACHE"), REPO_ROOT / "results" / ".cache"):
        found = fetched_path(NAME, Path(cache)) if cache else None
        if found is not None:
            return found
    return None


def require_folder() -> Path:
    found = folder()
    if found is None:
        pytest.skip(f"{NAME} is not fetched: run `harness models fetch {NAME}`")
    return found


@lru_cache(maxsize=1)
def _tokenizer(path: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


def tokenizer():
    """The real tokenizer (loaded once per session; no weights)."""
    return _tokenizer(str(require_folder()))


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
