"""Generation engines and the update at real-model shapes, with random weights (`harness bench`,
parts `engines` and `update`). Ratios against baselines measured in the same process.

- `bench_engines`: sampled tokens per second of HF `generate` (dynamic cache), our sampler on the
  model's own forward (`rollout.backend: hf`) and on the static engine (`rollout.backend: static`,
  CUDA graphs on a GPU), for the same prompts, batch sizes and number of new tokens; and the
  memory-bandwidth floor: a decode step must read every weight and the KV cache once, so
  floor tokens/s = batch / ((weight bytes + KV bytes at the final context) / bandwidth), with the
  bandwidth measured here by a large device copy (bytes read + written / seconds). Targets
  (issue 18, one H200, 0.5B shape, batch 256): static >= 10x `generate`, >= 20% of the floor.
- `bench_update`: one LoRA forward + backward of the chunked log-prob loss on B x T tokens at
  the model's dtype, with and without activation checkpointing: tokens per second and peak
  memory (CUDA: the allocator's peak; CPU: the process's resident-set high-water mark, which
  includes everything the process holds). Target (0.5B shape, 8 x 2048, bf16): peak <= 16 GiB.

Shapes are Qwen2.5's published configurations (hidden size, layers, heads, vocabulary); the
models are built from config with random weights, so no hub is needed and the timings do not
depend on what the weights say (every engine is forced to generate all `new_tokens`).
"""

from __future__ import annotations

import statistics
import time

import torch

from harness.bench.timing import random_prompts, sample_generate, sample_ours, sync

# Qwen2.5-0.5B / 1.5B (config.json on the hub: hidden_size, intermediate_size, layers, heads, kv
# heads, vocabulary, tied embeddings); "small" is a CPU-sized stand-in with the same layout.
SHAPES: dict[str, dict] = {
    "0.5b": dict(
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        vocab_size=151936,
        tie_word_embeddings=True,
    ),
    "1.5b": dict(
        hidden_size=1536,
        intermediate_size=8960,
        num_hidden_layers=28,
        num_attention_heads=12,
        num_key_value_heads=2,
        vocab_size=151936,
        tie_word_embeddings=True,
    ),
    "small": dict(
        hidden_size=256,
        intermediate_size=768,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=8192,
        tie_word_embeddings=True,
    ),
}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def random_model(shape: str, device: str, dtype: torch.dtype, *, seed: int = 0):
    """A Qwen2 causal LM of `shape` (SHAPES) with random weights, in eval mode."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    if shape not in SHAPES:
        raise ValueError(f"shape {shape!r}: choose one of {', '.join(SHAPES)}")
    torch.manual_seed(seed)
    cfg = Qwen2Config(**SHAPES[shape], max_position_embeddings=32768, rope_theta=1e6)
    cfg._attn_implementation = "sdpa"
    with torch.device(device):
        model = Qwen2ForCausalLM(cfg).to(dtype)
    return model.eval()


def copy_bandwidth(device: str, mib: int = 1024, repeats: int = 5) -> float:
    """Bytes per second of a device-to-device copy of `mib` MiB, counting bytes read and written
    (the best of `repeats`)."""
    n = mib * 2**20 // 4
    a = torch.empty(n, dtype=torch.float32, device=device).fill_(1.0)
    b = torch.empty_like(a)
    b.copy_(a)
    best = float("inf")
    for _ in range(repeats):
        sync(device)
        t0 = time.perf_counter()
        b.copy_(a)
        sync(device)
        best = min(best, time.perf_counter() - t0)
    return 2 * a.numel() * a.element_size() / best


def weight_bytes(model) -> int:
    """Bytes of the parameters a decode step reads (tied embeddings counted once)."""
    seen, total = set(), 0
    for p in model.parameters():
        if p.data_ptr() not in seen:
            seen.add(p.data_ptr())
            total += p.numel() * p.element_size()
    return total


def kv_bytes(model, batch: int, context: int) -> int:
    """Bytes of the KV cache of `batch` rows at `context` tokens."""
    c = model.config
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    elem = next(model.parameters()).element_size()
    return 2 * c.num_hidden_layers * batch * c.num_key_value_heads * head_dim * context * elem


def bench_engines(
    shape: str,
    *,
    device: str,
    dtype: str = "bfloat16",
    batches: tuple[int, ...] = (64, 256),
    prompt: int = 512,
    new_tokens: int = 256,
    repeats: int = 2,
    engines: tuple[str, ...] = ("generate", "hf", "static"),
) -> dict:
    """Tokens/s of each engine (median of `repeats` after a short warm-up that also captures the
    static engine's graph for the prompt's slot bucket), their ratios to `generate`, and the
    fraction of the bandwidth floor."""
    model = random_model(shape, device, DTYPES[dtype])
    vocab = model.config.vocab_size
    bw = copy_bandwidth(device, mib=1024 if device.startswith("cuda") else 256)
    out: dict = {
        "shape": shape,
        "dtype": dtype,
        "device": device,
        "prompt_tokens": prompt,
        "new_tokens": new_tokens,
        "copy_bandwidth_gb_s": bw / 1e9,
        "weight_bytes": weight_bytes(model),
        "by_batch": {},
    }
    for batch in batches:
        prompts = random_prompts(vocab, batch, prompt, seed=batch)
        row: dict = {}
        for engine in engines:
            run = (
                (lambda s, n, p=prompts, m=model: sample_generate(m, p, n, s).seconds)
                if engine == "generate"
                else (lambda s, n, p=prompts, e=engine, m=model: sample_ours(m, e, p, n, s).seconds)
            )
            # warm-up (kernels, allocator, the graph of the slot bucket): a few tokens suffice
            run(0, min(new_tokens, 16))
            secs = [run(r + 1, new_tokens) for r in range(repeats)]
            row[f"{engine}_tokens_per_s"] = batch * new_tokens / statistics.median(secs)
        floor = batch / ((out["weight_bytes"] + kv_bytes(model, batch, prompt + new_tokens)) / bw)
        row["floor_tokens_per_s"] = floor
        for engine in engines:
            if engine != "generate" and "generate" in engines:
                row[f"{engine}_vs_generate"] = row[f"{engine}_tokens_per_s"] / row["generate_tokens_per_s"]
            row[f"{engine}_fraction_of_floor"] = row[f"{engine}_tokens_per_s"] / floor
        out["by_batch"][str(batch)] = row
    from harness.rl.engines import static

    static.release(model)
    del model
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    return out


def _update_step(model, ids: torch.Tensor, mask: torch.Tensor, chunk_size: int) -> None:
    """The memory-relevant part of an update: log-probs of every token (chunked, fused) and a
    REINFORCE-shaped loss, backward into the LoRA weights."""
    from harness.model.logprobs import token_logprobs

    logp, _ = token_logprobs(model, ids, mask, chunk_size=chunk_size)
    (-logp.mean()).backward()


def _peak(fn, device: str) -> dict:
    """Peak memory of `fn`: on CUDA the allocator's absolute peak (weights, optimizer-free LoRA
    state, activations) and what the step added; on CPU only what it added (resident set)."""
    from harness.bench.memory import measure_peak_bytes

    if not device.startswith("cuda"):
        extra = measure_peak_bytes(fn, device)
        return {"peak_extra_bytes": extra, "peak_extra_gib": extra / 2**30}
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated()
    return {"peak_bytes": peak, "peak_gib": peak / 2**30, "peak_extra_bytes": peak - base}


def bench_update(
    shape: str,
    *,
    device: str,
    dtype: str = "bfloat16",
    batch: int = 8,
    tokens: int = 2048,
    lora_r: int = 16,
    chunk_size: int = 1024,
    repeats: int = 2,
) -> dict:
    """One LoRA forward + backward on `batch` x `tokens` random tokens, with and without activation
    checkpointing: tokens/s (median of `repeats` after a warm-up) and peak memory."""
    from peft import LoraConfig, get_peft_model

    from harness.model.base import peft_reads_deprecated_attributes

    out: dict = {"shape": shape, "dtype": dtype, "device": device, "batch": batch, "tokens": tokens, "lora_r": lora_r}
    for checkpointing in (True, False):
        model = random_model(shape, device, DTYPES[dtype])
        if checkpointing:
            model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        with peft_reads_deprecated_attributes():
            model = get_peft_model(
                model,
                LoraConfig(
                    r=lora_r,
                    lora_alpha=2 * lora_r,
                    target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
                ),
            )
        model.train()
        g = torch.Generator().manual_seed(0)
        ids = torch.randint(0, model.config.vocab_size, (batch, tokens), generator=g).to(device)
        mask = torch.ones_like(ids)
        key = "checkpointing" if checkpointing else "no_checkpointing"
        try:
            _update_step(model, ids, mask, chunk_size)  # warm-up
            model.zero_grad(set_to_none=True)
            peak = _peak(lambda m=model, i=ids, k=mask: _update_step(m, i, k, chunk_size), device)
            model.zero_grad(set_to_none=True)
            secs = []
            for _ in range(repeats):
                sync(device)
                t0 = time.perf_counter()
                _update_step(model, ids, mask, chunk_size)
                sync(device)
                secs.append(time.perf_counter() - t0)
                model.zero_grad(set_to_none=True)
            out[key] = {"tokens_per_s": batch * tokens / statistics.median(secs), **peak}
        except torch.OutOfMemoryError as e:  # the uncheckpointed side may not fit: say so
            out[key] = {"error": f"out of memory: {str(e).splitlines()[0]}"}
        del model
        if device.startswith("cuda"):
            torch.cuda.empty_cache()
    a, b = out["checkpointing"], out["no_checkpointing"]
    if "tokens_per_s" in a and "tokens_per_s" in b:
        out["checkpointing_peak_ratio"] = a["peak_extra_bytes"] / b["peak_extra_bytes"]
        out["checkpointing_speed_ratio"] = a["tokens_per_s"] / b["tokens_per_s"]
    return out
