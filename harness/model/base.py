"""Base-model primitives every step of policy construction uses (`harness.model.pipeline`).

`load_pretrained` reads a causal LM and its tokenizer from a folder or a Hugging Face id
(`local_files_only` when HF_HUB_OFFLINE is set); `wrap_lora` puts a seeded PEFT LoRA adapter
on a model; `chat_format` checks that the tokenizer speaks ChatML.
"""

from __future__ import annotations

import difflib
import os
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from torch import nn

from harness.config.errors import ConfigError
from harness.model.cache import cache_dir
from harness.model.packaged import fetched_path, is_packaged, missing_message
from harness.transcript.chat import ChatFormat

# module types PEFT LoRA can wrap (and transformers' GPT-2 style Conv1D, matched by name)
LORA_MODULE_TYPES = (nn.Linear, nn.Embedding, nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.MultiheadAttention)
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class ModelError(ConfigError):
    """model.name cannot be loaded; the message says what to do (printed without a traceback)."""


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")


FIX_HINT = (
    "Give a local folder holding a Hugging Face causal LM (config.json + weights + tokenizer), a Hugging "
    "Face id already in the local cache, a packaged model (`harness models`), or 'tiny' to build a small "
    "model here."
)


def _looks_like_path(name: str) -> bool:
    return name.startswith(("/", ".", "~")) or name.count("/") > 1 or "\\" in name


def model_source_problem(name: str) -> str | None:
    """Why `model.name` cannot be loaded, when that is known without loading it (None: no problem
    found): a packaged model not fetched into the cache (`harness.model.packaged`), a path that does
    not exist or holds no config.json, a malformed hub id, or, with HF_HUB_OFFLINE set, a hub id
    missing from the local hub cache."""
    if name == "tiny":
        return None
    if is_packaged(name):
        cache = cache_dir()
        return None if fetched_path(name, cache) is not None else missing_message(name, cache)
    path = Path(name).expanduser()
    if path.exists() or _looks_like_path(name):
        shown = f"{name!r} ({path.resolve()})" if str(path.resolve()) != name else repr(name)
        if not path.exists():
            return f"{shown} is not an existing directory. {FIX_HINT}"
        if not path.is_dir() or not any((path / f).is_file() for f in ("config.json", "adapter_config.json")):
            return f"{shown} is not a folder holding a model's config.json. {FIX_HINT}"
        return None
    from huggingface_hub import try_to_load_from_cache
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(name)
    except HFValidationError:
        return f"{name!r} is neither an existing folder nor a valid Hugging Face id (org/name). {FIX_HINT}"
    if _offline() and not isinstance(try_to_load_from_cache(name, "config.json"), str):
        return (
            f"{name!r} is not in the local Hugging Face cache, and HF_HUB_OFFLINE is set, so only that cache "
            f"is searched. Download it on a machine with hub access (`huggingface-cli download {name}`) and "
            f"copy the cache here, or use model.name: tiny."
        )
    return None


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


def check_lora_targets(model: nn.Module, targets: list[str]) -> None:
    """ModelError unless every LoRA target names a linear or embedding module of `model` (PEFT
    matches a target against the end of a module's dotted name)."""
    names = [
        n for n, m in model.named_modules() if n and (isinstance(m, LORA_MODULE_TYPES) or type(m).__name__ == "Conv1D")
    ]
    leaves = sorted({n.rpartition(".")[2] for n in names})
    for target in targets:
        if not any(n == target or n.endswith("." + target) for n in names):
            close = difflib.get_close_matches(target.rpartition(".")[2], leaves, n=1, cutoff=0.6)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise ModelError(
                f"model.lora.target_modules: {target!r} matches no linear or embedding module of the model "
                f"({type(model).__name__}).{hint} Its modules: {', '.join(leaves)}."
            )


def wrap_lora(model: nn.Module, lora, seed: int) -> nn.Module:
    """PEFT LoRA on `model` (config.LoraConfig `lora`); A matrices drawn from `seed`, B = 0."""
    from peft import LoraConfig, get_peft_model

    check_lora_targets(model, list(lora.target_modules))

    conf = LoraConfig(
        r=lora.r,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=list(lora.target_modules),
        bias="none",
        task_type="CAUSAL_LM",
    )
    with torch.random.fork_rng(devices=[]), peft_reads_deprecated_attributes():
        torch.manual_seed(seed)
        return get_peft_model(model, conf)


@contextmanager
def peft_reads_deprecated_attributes() -> Iterator[None]:
    """Around `get_peft_model`: peft (0.21.2, the newest) reads `model.is_gradient_checkpointing`, which
    transformers >= 5.24 deprecates in favour of `is_activation_checkpointing` with a FutureWarning at
    every point. peft only reads it; our own code uses the activation-checkpointing API."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"`is_gradient_checkpointing` is deprecated", category=FutureWarning)
        yield


@contextmanager
def no_progress_bars() -> Iterator[None]:
    """transformers' own progress bars off (save_pretrained's "Writing model shards" bar), so a save inside
    a point, a sweep or `harness eval` writes nothing to the terminal; restored afterwards."""
    from transformers.utils import logging as hf_logging

    was_on = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_on:
            hf_logging.enable_progress_bar()
