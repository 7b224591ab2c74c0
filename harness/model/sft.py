"""Step 2 of building a policy: the optional SFT warm-up on expert demonstrations.

`sft_warmup(cfg, source, info, cache_dir, device, demos)` trains the base model at `source` on
`sft.demos` expert episodes (taken from `demos`, a `DemoSource`, only on a cache miss) and returns
the folder of the warmed-up full model; with `sft.demos: 0` it returns `source` unchanged. LoRA
fine-tuning trains an adapter (seed `SFT_SEED`) and merges it into the weights; full fine-tuning
trains all weights. RL starts from the result and the reference policy is it. Demonstrations are
expert episodes on train seeds the tiny model's pre-training did not use, laid out as the
configured context policy shows them.
The result is a content-addressed cache entry under `cache_dir/sft/<hash>/`, shared by every
point of a sweep whatever its `train.seed`.
"""

from __future__ import annotations

from pathlib import Path

from harness.config.schema import RunConfig
from harness.model.base import DTYPES, load_pretrained, no_progress_bars, wrap_lora
from harness.model.cache import build_once, code_version, content_hash, read_record
from harness.model.supervised import DemoSource, sft_train
from harness.model.tiny import code_key
from harness.transcript.chat import ChatFormat

SFT_SEED = 0  # the warm-up is shared by all points of a sweep, whatever their train.seed


def sft_cache_key(cfg: RunConfig, base_info: dict, demos: DemoSource) -> str:
    s = cfg.sft
    return content_hash(
        {
            "base": base_info["base"],
            "env": demos.key,
            "finetune": cfg.model.finetune,
            "lora": cfg.model.lora.model_dump() if cfg.model.finetune == "lora" else None,
            "sft": {"demos": s.demos, "epochs": s.epochs, "lr": s.lr, "batch_size": s.batch_size},
            "context": _context_key(cfg.context),
            "dtype": cfg.model.dtype,
            "seed": SFT_SEED,
            "demo_start": _demo_start(base_info),
            "code": code_key(demos) + code_version(sft_cache_key),
        }
    )


def _context_key(ctx) -> dict:
    """The context settings that change SFT examples (only those: unrelated keys share the cache)."""
    key = {"policy": ctx.policy}
    if ctx.policy == "window":
        key["window"] = ctx.window
    if ctx.policy == "obs_truncate":
        key["obs_tokens"] = ctx.obs_tokens
    return key


def _demo_start(base_info: dict) -> int:
    return int(base_info.get("base_info", {}).get("demo_seed_index", 0))


def demo_seeds_used(info: dict) -> int:
    """How many train seeds (a prefix of the env's train sequence) the model's expert demonstrations
    came from: the tiny model's pre-training, then the SFT warm-up, which starts where that ends."""
    sft = info.get("sft_info", {}).get("demo_seeds")
    return int(sft[1]) if sft else _demo_start(info)


def sft_warmup(
    cfg: RunConfig, source: str, base_info: dict, cache_dir: Path, device, demos: DemoSource
) -> tuple[str, dict]:
    """(folder of the model RL starts from, provenance): the cached warm-up, or `source` itself
    when `sft.demos` is 0 (see the module docstring)."""
    if cfg.sft.demos <= 0:
        return source, base_info
    start = _demo_start(base_info)

    def build(out: Path) -> dict:
        model, tok = load_pretrained(source, DTYPES[cfg.model.dtype])
        model.to(device)
        chat = ChatFormat(tok)
        warmup, used = demos.take(cfg.sft.demos, start=start)
        max_len = min(int(getattr(model.config, "max_position_embeddings", 4096)), 4096)
        train = wrap_lora(model, cfg.model.lora, SFT_SEED) if cfg.model.finetune == "lora" else model
        s = cfg.sft
        stage = "SFT warm-up (optimizer steps)"
        metrics = sft_train(
            train,
            chat,
            warmup,
            s.epochs,
            s.lr,
            s.batch_size,
            SFT_SEED,
            max_len,
            context=cfg.context,
            progress=lambda done, total: demos.report(stage, done, total),
        )
        if cfg.model.finetune == "lora":
            model = train.merge_and_unload()
        with no_progress_bars():
            model.save_pretrained(str(out))
        tok.save_pretrained(str(out))
        return {"sft": metrics, "demo_seeds": [start, used], "demos": len(warmup)}

    entry, built = build_once(
        Path(cache_dir) / "sft",
        sft_cache_key(cfg, base_info, demos),
        build,
        meta={"base": base_info["base"], "sft": cfg.sft.model_dump()},
    )
    info = {**base_info, "sft": f"sft:{entry.name}", "sft_built": built, "sft_info": read_record(entry)["info"]}
    return str(entry.resolve()), info
