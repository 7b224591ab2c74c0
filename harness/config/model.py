"""`model:` the policy model, its LoRA adapter and the locally built tiny model."""

from __future__ import annotations

import difflib
from typing import Annotated, Literal

from pydantic import StringConstraints, model_validator

from harness.config.fields import MAX_BATCH, MAX_COUNT, MAX_TOKENS, MAX_WIDTH, F, Strict, seed_field

# The leaf modules of a Qwen2 model (the architecture of model.name: tiny) that a LoRA adapter
# can wrap: attention and MLP projections, then the embedding and the output layer.
QWEN2_LINEAR_MODULES = (
    "q_proj",
    "k_proj",
    "v_proj",
    "o_proj",
    "gate_proj",
    "up_proj",
    "down_proj",
    "embed_tokens",
    "lm_head",
)


class TinyModelConfig(Strict):
    """A small Qwen2-architecture model built from config on this machine (no model hub)."""

    hidden_size: int = F(128, "Width of the tiny Qwen2 model.", ge=8, le=MAX_WIDTH)
    num_layers: int = F(4, "Transformer layers.", ge=1, le=256)
    num_heads: int = F(4, "Attention heads (key/value heads = heads / 2 when even).", ge=1, le=256)
    intermediate_size: int = F(512, "MLP width.", ge=8, le=4 * MAX_WIDTH)
    vocab_size: int = F(
        1024, "Target size of the byte-level BPE tokenizer trained on environment text.", ge=300, le=4 * MAX_WIDTH
    )
    max_position: int = F(2048, "Longest sequence the model accepts.", ge=64, le=MAX_TOKENS)
    pretrain_demos: int = F(
        1000,
        "Expert episodes the tiny model is pre-trained on by supervised "
        "learning (cached by content hash under results/.cache, shared by all points).",
        ge=0,
        le=MAX_COUNT,
    )
    pretrain_epochs: int = F(3, "Epochs of that pre-training.", ge=0, le=10_000)
    pretrain_lr: float = F(1e-3, "Learning rate of that pre-training (AdamW).", gt=0)
    pretrain_batch_size: int = F(16, "Episodes per batch of that pre-training.", ge=1, le=MAX_BATCH)
    init_seed: int = seed_field(
        0,
        "Seed of the tiny model's initialisation and pre-training order; independent of "
        "train.seed so that every point of a sweep shares one base model.",
    )


class LoraConfig(Strict):
    r: int = F(16, "LoRA rank (Hu et al. 2021).", ge=1, le=MAX_WIDTH)
    alpha: int = F(32, "LoRA scaling numerator (scale = alpha / r).", ge=1, le=MAX_COUNT)
    dropout: float = F(0.0, "Dropout on the LoRA branch; 0 keeps CPU runs bit-reproducible.", ge=0, lt=1)
    target_modules: list[Annotated[str, StringConstraints(min_length=1)]] = F(
        list(QWEN2_LINEAR_MODULES[:7]),
        "Module names that get adapters (Qwen2 names; a name matches a module whose dotted path ends with it).",
        min_length=1,
        max_length=256,
    )


class ModelConfig(Strict):
    name: str = F(
        "tiny",
        "'tiny' (built locally, see model.tiny), a packaged model (`harness models`, e.g. "
        "smollm2-135m-instruct), a Hugging Face id, or a local path.",
        min_length=1,
    )
    dtype: Literal["float32", "bfloat16", "float16"] = F("float32", "Parameter dtype; float32 on CPU.")
    finetune: Literal["lora", "full"] = F(
        "lora", "Train a LoRA adapter (reference = adapter off) or all weights (reference = a frozen copy)."
    )
    lora: LoraConfig = F(LoraConfig(), "LoRA adapter settings.")
    tiny: TinyModelConfig = F(TinyModelConfig(), "Shape and pre-training of the locally built tiny model.")
    gradient_checkpointing: bool = F(False, "Trade compute for memory in the update.")

    @model_validator(mode="after")
    def _tiny_lora_targets(self) -> ModelConfig:
        """The tiny model is a Qwen2 model: its module names are known before it is built."""
        if self.name != "tiny" or self.finetune != "lora":
            return self
        for target in self.lora.target_modules:
            if target.rpartition(".")[2] not in QWEN2_LINEAR_MODULES:
                close = difflib.get_close_matches(target, QWEN2_LINEAR_MODULES, n=1, cutoff=0.6)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise ValueError(
                    f"model.lora.target_modules: {target!r} is not a module of the tiny Qwen2 model{hint}; "
                    f"choose from: {', '.join(QWEN2_LINEAR_MODULES)}"
                )
        return self
