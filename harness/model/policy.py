"""Step 3 of building a policy: the trainable policy on top of the model RL starts from.

`attach_adapter(cfg, source, info, device)` loads the model at `source` (the base model, or
its SFT warm-up) and makes it trainable: a PEFT LoRA adapter seeded by `train.seed`
(reference = the same model with the adapter disabled, no second copy), or all weights
(reference = a frozen copy). The whole construction is `harness.model.pipeline`.

Critic (PPO): a linear value head on the shared backbone's last hidden state,
`values(ids, mask) -> (B, T)`. Its weights are the critic parameters (critic learning rate); the
value loss also flows into the backbone's trainable weights (the LoRA adapter), a shared trunk
as in CleanRL's PPO. Zero-initialised, so V = 0 before training.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from harness.config.schema import RunConfig
from harness.model.base import DTYPES, chat_format, load_pretrained, no_progress_bars, wrap_lora
from harness.model.logprobs import hidden_states
from harness.transcript.chat import ChatFormat


class ValueHead(nn.Module):
    """V(s_t) from the last hidden state: (B, T, H) -> (B, T), float32, zero-initialised."""

    def __init__(self, hidden_size: int):
        super().__init__()
        self.proj = nn.Linear(hidden_size, 1)
        nn.init.zeros_(self.proj.weight)
        nn.init.zeros_(self.proj.bias)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.proj(hidden.float()).squeeze(-1)


def value(model: nn.Module, head: ValueHead, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Values (B, T), aligned with `token_logprobs`: position t holds V of the prefix before
    token t (the hidden state at t-1), the state in which token t was chosen, as verl's critic
    (`values[:, -L-1:-1]`). Position 0 and padding are 0."""
    return values_from_hidden(head, hidden_states(model, input_ids, attention_mask), attention_mask)


def values_from_hidden(head: ValueHead, hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """`value` from hidden states (B, T, H) already computed (one backbone pass for actor and critic)."""
    v = head(hidden) * attention_mask  # (B, T), V after token t
    shifted = torch.cat([torch.zeros_like(v[:, :1]), v[:, :-1]], dim=1)  # (B, T), V before token t
    return shifted * attention_mask


@dataclass(eq=False)
class Policy:
    model: nn.Module  # PeftModel (finetune lora) or the causal LM (full)
    tokenizer: Any
    chat: ChatFormat
    finetune: str  # "lora" | "full"
    value_head: ValueHead
    info: dict = field(default_factory=dict)  # provenance: base / sft cache keys, build metrics
    reference_copy: nn.Module | None = None  # full fine-tuning only
    _adapters: list[nn.Module] | None = field(default=None, repr=False, compare=False)  # `reference`'s LoRA layers

    @contextmanager
    def reference(self) -> Iterator[nn.Module]:
        """The reference policy (no gradients): adapter disabled, or the frozen copy.

        LoRA: the adapter layers are switched off and on again exactly as PEFT's `disable_adapter` does
        for LoRA (`enable_adapters` on every tuner layer and auxiliary wrapper), on a list of those layers
        found once, without the model-wide status survey PEFT runs on each entry: that survey walked every
        module and printed each LoRA layer's repr, 8% of a tiny-model update's CPU time (profile in
        docs/benchmarks.md#learner)."""
        with torch.no_grad():
            if self.finetune == "lora":
                layers = self._adapter_layers()
                for layer in layers:
                    layer.enable_adapters(False)
                try:
                    yield self.model
                finally:
                    for layer in layers:
                        layer.enable_adapters(True)
            else:
                yield self.reference_copy

    def _adapter_layers(self) -> list[nn.Module]:
        if self._adapters is None:
            from peft.tuners.tuners_utils import BaseTunerLayer
            from peft.utils.other import AuxiliaryTrainingWrapper

            kinds = (BaseTunerLayer, AuxiliaryTrainingWrapper)
            self._adapters = [m for m in self.model.modules() if isinstance(m, kinds)]
        return self._adapters

    def values(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Critic values (B, T) on the shared backbone."""
        return value(self.model, self.value_head, input_ids, attention_mask)

    def actor_parameters(self) -> list[nn.Parameter]:
        return [p for p in self.model.parameters() if p.requires_grad]

    def critic_parameters(self) -> list[nn.Parameter]:
        return list(self.value_head.parameters())

    def trainable_modules(self) -> dict[str, nn.Module]:
        return {"model": self.model, "value_head": self.value_head}

    def save_adapter(self, path: Path | str) -> Path:
        """LoRA: the adapter in PEFT format (`PeftModel.from_pretrained(base, path)`, base =
        `adapter_config.json`'s base_model_name_or_path). Full: the whole model, HF format.
        The tokenizer and the value head (value_head.pt) are saved beside it."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        with no_progress_bars():
            self.model.save_pretrained(str(path))
        self.tokenizer.save_pretrained(str(path))
        torch.save(self.value_head.state_dict(), path / "value_head.pt")
        return path


def attach_adapter(cfg: RunConfig, source: str, info: dict, device: torch.device | str) -> Policy:
    """The trainable policy on the model at `source` (see the module docstring)."""
    model, tok = load_pretrained(source, DTYPES[cfg.model.dtype])
    chat = chat_format(tok, source)
    model.to(device)
    if cfg.model.gradient_checkpointing:
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    ref = None
    if cfg.model.finetune == "lora":
        model = wrap_lora(model, cfg.model.lora, cfg.train.seed)
    else:
        ref = copy.deepcopy(model).eval().requires_grad_(False)
    model.eval()
    hidden = model.get_base_model().config.hidden_size if cfg.model.finetune == "lora" else model.config.hidden_size
    head = ValueHead(hidden).to(device)
    info = dict(info)
    info["parameters"] = sum(p.numel() for n, p in model.named_parameters() if "lora_" not in n)
    info["trainable_parameters"] = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return Policy(model, tok, chat, cfg.model.finetune, head, info, ref)
