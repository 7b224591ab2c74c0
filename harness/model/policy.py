"""The policy: a causal LM (+ LoRA adapter), its tokenizer and turn format, reference and critic.

`load_policy(cfg, cache_dir, device)` builds, in order:

1. the base model. `model.name: tiny` -> the local tiny family: a byte-level BPE tokenizer trained
   on the environment's text (`harness.tokenizer`) and a Qwen2ForCausalLM built from
   `model.tiny`, initialised from `model.tiny.init_seed`, then pre-trained by supervised learning
   on `model.tiny.pretrain_demos` expert episodes (full fine-tuning, loss on action tokens).
   Anything else -> a local path or a Hugging Face id read through AutoModelForCausalLM /
   AutoTokenizer (`local_files_only` when HF_HUB_OFFLINE is set).
2. the optional SFT warm-up (`sft.demos > 0`, `harness.sft`): LoRA SFT merged into the weights,
   or full SFT, saved as a full model. RL starts from it and the reference policy *is* it.
3. the trainable policy: a PEFT LoRA adapter seeded by `train.seed` (reference = the same model
   with the adapter disabled, no second copy), or all weights (reference = a frozen copy).

Steps 1 and 2 are content-addressed caches under `cache_dir/models/<hash>/` and
`cache_dir/sft/<hash>/` (`harness.cache`): the hash covers the env and its options, the model
and SFT settings and the source of the modules that build them, so all points of a sweep build
each once (under a file lock) and share it.

Critic (PPO): a linear value head on the shared backbone's last hidden state,
`values(ids, mask) -> (B, T)`. Its weights are the critic parameters (critic learning rate); the
value loss also flows into the backbone's trainable weights (the LoRA adapter), a shared trunk
as in CleanRL's PPO. Zero-initialised, so V = 0 before training.
"""
from __future__ import annotations

import copy
import os
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import torch
from torch import nn

from harness.cache import build_once, code_version, content_hash, read_record
from harness.chat import ChatFormat
from harness.config import RunConfig
from harness.errors import ConfigError
from harness.logprobs import hidden_states

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
MIN_CORPUS_DEMOS = 64  # expert episodes the tokenizer sees at least, even with no pre-training


class ModelError(ConfigError):
    """model.name cannot be loaded; the message says what to do (printed without a traceback)."""


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
    model: nn.Module                 # PeftModel (finetune lora) or the causal LM (full)
    tokenizer: Any
    chat: ChatFormat
    finetune: str                    # "lora" | "full"
    value_head: ValueHead
    info: dict = field(default_factory=dict)  # provenance: base / sft cache keys, build metrics
    reference_copy: nn.Module | None = None   # full fine-tuning only

    @contextmanager
    def reference(self) -> Iterator[nn.Module]:
        """The reference policy (no gradients): adapter disabled, or the frozen copy."""
        with torch.no_grad():
            if self.finetune == "lora":
                with self.model.disable_adapter():
                    yield self.model
            else:
                yield self.reference_copy

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
        self.model.save_pretrained(str(path))
        self.tokenizer.save_pretrained(str(path))
        torch.save(self.value_head.state_dict(), path / "value_head.pt")
        return path


# ----------------------------------------------------------------------------- tiny family
def _env_key(cfg: RunConfig) -> dict:
    from envs.registry import env_class, validate_options

    cls = env_class(cfg.env.name)
    return {"name": cfg.env.name, "options": validate_options(cfg.env.name, cfg.env.options).model_dump(),
            "code": code_version(cls, *[c for c in cls.__mro__ if c.__module__.startswith("envs.")])}


def _code_key() -> str:
    from envs import demos
    from harness import chat, logprobs, sft, tokenizer

    return code_version(chat, tokenizer, logprobs, sft, demos, _code_key)


def tiny_cache_key(cfg: RunConfig) -> str:
    return content_hash({"env": _env_key(cfg), "tiny": cfg.model.tiny.model_dump(), "code": _code_key()})


def tiny_config(tiny, tokenizer, eot_id: int):
    from transformers import Qwen2Config

    heads = tiny.num_heads
    return Qwen2Config(vocab_size=len(tokenizer), hidden_size=tiny.hidden_size, intermediate_size=tiny.intermediate_size,
                       num_hidden_layers=tiny.num_layers, num_attention_heads=heads,
                       num_key_value_heads=heads // 2 if heads % 2 == 0 else heads,
                       max_position_embeddings=tiny.max_position, tie_word_embeddings=True, attention_dropout=0.0,
                       bos_token_id=None, eos_token_id=eot_id, pad_token_id=tokenizer.pad_token_id)


def init_tiny_model(tiny, tokenizer, seed: int) -> nn.Module:
    """A randomly initialised Qwen2ForCausalLM; same seed -> identical weights."""
    from transformers import Qwen2ForCausalLM

    chat = ChatFormat(tokenizer)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(tiny_config(tiny, tokenizer, chat.eot_id))
    model.generation_config.eos_token_id = chat.eot_id
    model.generation_config.pad_token_id = chat.pad_id
    return model.float()


def _build_tiny(cfg: RunConfig, out: Path) -> dict:
    from harness.chat import observation_text
    from harness.sft import collect_demos, sft_train
    from harness.tokenizer import episode_text, train_tokenizer
    from envs.registry import env_class

    t = cfg.model.tiny
    demos, used = collect_demos(cfg.env.name, cfg.env.options, t.pretrain_demos)
    corpus = list(demos)
    if len(corpus) < MIN_CORPUS_DEMOS:  # text for the tokenizer only
        corpus += collect_demos(cfg.env.name, cfg.env.options, MIN_CORPUS_DEMOS - len(corpus), start=used)[0]
    texts = [episode_text(d.instructions, d.observations, d.actions) + observation_text(d.final_observation)
             for d in corpus]
    texts += list(env_class(cfg.env.name).observation_markers)
    tok = train_tokenizer(texts, t.vocab_size, t.max_position)
    model = init_tiny_model(t, tok, t.init_seed)
    metrics = {}
    if demos and t.pretrain_epochs:
        metrics = sft_train(model, ChatFormat(tok), demos, t.pretrain_epochs, t.pretrain_lr, t.pretrain_batch_size,
                            t.init_seed, t.max_position)
    tok.save_pretrained(str(out))
    model.save_pretrained(str(out))
    # demo_seed_index: the SFT warm-up takes its demonstrations from the train seeds after these
    return {"parameters": sum(p.numel() for p in model.parameters()), "vocab_size": len(tok),
            "pretrain": metrics, "demo_seed_index": used}


def tiny_base(cfg: RunConfig, cache_dir: Path) -> tuple[Path, bool]:
    """The cached tiny model folder (built on a miss) and whether this call built it."""
    return build_once(Path(cache_dir) / "models", tiny_cache_key(cfg), lambda out: _build_tiny(cfg, out),
                      meta={"env": cfg.env.name, "tiny": cfg.model.tiny.model_dump()})


# ----------------------------------------------------------------------------- loading
def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")


def _resolve_source(cfg: RunConfig, cache_dir: Path) -> tuple[str, dict]:
    """(path or id to load, provenance) of the base model; builds the tiny one if needed."""
    name = cfg.model.name
    if name == "tiny":
        entry, built = tiny_base(cfg, cache_dir)
        rec = read_record(entry)
        return str(entry.resolve()), {"base": f"tiny:{entry.name}", "base_built": built, "base_info": rec["info"]}
    path = Path(name).expanduser()
    if path.exists():
        return str(path.resolve()), {"base": str(path.resolve())}
    if name.startswith(("/", ".", "~")) or name.count("/") > 1:
        raise ModelError(f"model.name: {name!r} is not an existing directory. Give a local folder holding a "
                         f"Hugging Face causal LM (config.json + weights + tokenizer), a Hugging Face id "
                         f"already in the local cache, or 'tiny' to build a small model here.")
    return name, {"base": name}


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
        where = ("HF_HUB_OFFLINE is set, so only the local Hugging Face cache is searched"
                 if offline else "the Hugging Face hub could not provide it")
        raise ModelError(f"model.name: cannot load {source!r} ({where}; {type(e).__name__}: "
                         f"{str(e).splitlines()[0][:200]}). Download it on a machine with hub access "
                         f"(`huggingface-cli download {source}`) and copy the cache or the folder here, set "
                         f"model.name to a local folder, or use model.name: tiny.") from None
    return model, tok


def _chat_for(tok, source: str) -> ChatFormat:
    try:
        return ChatFormat(tok)
    except ValueError:
        raise ModelError(f"model.name: the tokenizer of {source!r} has no <|im_end|> token; the harness uses "
                         f"Qwen's ChatML turn format. Use a Qwen-family (ChatML) model or model.name: tiny.") from None


def wrap_lora(model: nn.Module, lora, seed: int) -> nn.Module:
    """PEFT LoRA on `model` (config.LoraConfig `lora`); A matrices drawn from `seed`, B = 0."""
    from peft import LoraConfig, get_peft_model

    conf = LoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                      target_modules=list(lora.target_modules), bias="none", task_type="CAUSAL_LM")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return get_peft_model(model, conf)


def load_policy(cfg: RunConfig, cache_dir: Path, device: torch.device | str) -> Policy:
    """The starting policy of a run (see the module docstring)."""
    from harness.sft import sft_warmup

    dtype = DTYPES[cfg.model.dtype]
    source, info = _resolve_source(cfg, cache_dir)
    if cfg.sft.demos > 0:
        source, sft_info = sft_warmup(cfg, source, info, cache_dir, device)
        info.update(sft_info)
    model, tok = load_pretrained(source, dtype)
    chat = _chat_for(tok, source)
    model.to(device)
    if cfg.model.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    ref = None
    if cfg.model.finetune == "lora":
        model = wrap_lora(model, cfg.model.lora, cfg.train.seed)
    else:
        ref = copy.deepcopy(model).eval().requires_grad_(False)
    model.eval()
    hidden = model.get_base_model().config.hidden_size if cfg.model.finetune == "lora" else model.config.hidden_size
    head = ValueHead(hidden).to(device)
    info["parameters"] = sum(p.numel() for n, p in model.named_parameters() if "lora_" not in n)
    info["trainable_parameters"] = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return Policy(model, tok, chat, cfg.model.finetune, head, info, ref)
