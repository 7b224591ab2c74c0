"""Base-model primitives every step of policy construction uses (`harness.model.pipeline`).

`load_pretrained` reads a causal LM and its tokenizer from a folder or a Hugging Face id
(`local_files_only` when HF_HUB_OFFLINE is set); `wrap_lora` puts a seeded PEFT LoRA adapter
on a model; `chat_format` checks that the tokenizer speaks ChatML.
"""

from __future__ import annotations

import os

import torch
from torch import nn

from harness.config.errors import ConfigError
from harness.transcript.chat import ChatFormat

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class ModelError(ConfigError):
    """model.name cannot be loaded; the message says what to do (printed without a traceback)."""


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")


def load_pretrained(source: str, dtype: torch.dtype):
    """(model, tokenizer) from a folder or a Hugging Face id; ModelError when unavailable."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # no per-load progress bars in run logs
    offline = _offline()
    try:
        tok = AutoTokenizer.from_pretrained(source, local_files_only=offline)
        model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype, local_files_only=offline)
    except (OSError, ValueError) as e:
        where = (
            "HF_HUB_OFFLINE is set, so only the local Hugging Face cache is searched"
            if offline
            else "the Hugging Face hub could not provide it"
        )
        raise ModelError(
            f"model.name: cannot load {source!r} ({where}; {type(e).__name__}: "
            f"{str(e).splitlines()[0][:200]}). Download it on a machine with hub access "
            f"(`huggingface-cli download {source}`) and copy the cache or the folder here, set "
            f"model.name to a local folder, or use model.name: tiny."
        ) from None
    return model, tok


def chat_format(tok, source: str) -> ChatFormat:
    """The ChatML turn format of `tok`; ModelError when the tokenizer has no <|im_end|>."""
    try:
        return ChatFormat(tok)
    except ValueError:
        raise ModelError(
            f"model.name: the tokenizer of {source!r} has no <|im_end|> token; the harness uses "
            f"Qwen's ChatML turn format. Use a Qwen-family (ChatML) model or model.name: tiny."
        ) from None


def wrap_lora(model: nn.Module, lora, seed: int) -> nn.Module:
    """PEFT LoRA on `model` (config.LoraConfig `lora`); A matrices drawn from `seed`, B = 0."""
    from peft import LoraConfig, get_peft_model

    conf = LoraConfig(
        r=lora.r,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=list(lora.target_modules),
        bias="none",
        task_type="CAUSAL_LM",
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return get_peft_model(model, conf)
