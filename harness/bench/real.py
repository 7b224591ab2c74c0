"""A real model on this machine (`harness bench --only real`): the compute floor, the samplers and
one update, with every ratio measured in the same process.

- `compute_floor`: this machine's matmul rate (a square float32 and bfloat16 matmul, the best of a
  few runs) turned into a floor in tokens per second: a token costs about 2 FLOPs per weight it
  is multiplied by (`linear_flops_per_token`: every `nn.Linear` of the model, the output head
  included, the input embedding lookup not; attention scores and element-wise work are left out,
  about 2% of a 96-token context for SmolLM2). Also the rate one 1 x 256 forward of the model reaches.
- `bench_sampling`: sampled tokens per second of HF `generate`, and of our sampler on the `hf` and
  `static` engines, at each batch size, for the same random prompts and the same number of new
  tokens on every side (`generate` with `min_new_tokens` = `max_new_tokens` and no end token; ours
  with no end token); the ratio of each to `generate`, and the fraction of the floor. Two fractions:
  `fraction_of_floor` counts the generated tokens only (what the issue's figures count), and
  `fraction_of_floor_all` every token the model ran (prompt + generated - 1). The engines' tokens
  are compared: `hf` and `static` draw from the same random stream, so they sample the same tokens
  when their logits agree; a short greedy run compares all three engines.
- `bench_update_split`: seconds of real training updates (the config's environment, model,
  rollout and algorithm) split into the rollout, the behaviour and reference log-probs, and the
  rest of the update, and the process's peak resident memory.

The load average is recorded beside the figures: on a shared machine every figure depends on it,
the ratios (both sides measured back to back) much less. docs/benchmarks.md has the measurements.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from pathlib import Path

import torch

SIZES = {"batches": (32, 1), "prompt": 32, "new_tokens": 64, "repeats": 2}


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


# ----------------------------------------------------------------------------- the floor


def matmul_gflops(n: int = 2048, dtype: torch.dtype = torch.float32, repeats: int = 5) -> float:
    """GFLOP/s of an n x n by n x n matmul (2 n^3 FLOPs) at the current thread count, best of `repeats`."""
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(n, n, generator=g).to(dtype), torch.randn(n, n, generator=g).to(dtype)
    a @ b  # warm-up: thread pool, kernel choice
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t0)
    return 2 * n**3 / best / 1e9


def linear_flops_per_token(model) -> int:
    """FLOPs of one token through every `nn.Linear` of `model` (2 per weight; a tied output head
    counted once, as the head; LoRA's low-rank factors included where attached)."""
    seen, total = set(), 0
    for m in model.modules():
        if isinstance(m, torch.nn.Linear) and m.weight.data_ptr() not in seen:
            seen.add(m.weight.data_ptr())
            total += 2 * m.weight.numel()
    return total


def forward_gflops(model, length: int = 256, repeats: int = 2) -> dict:
    """Seconds and GFLOP/s (linear FLOPs only) of one 1 x `length` forward, best of `repeats`."""
    vocab = model.get_input_embeddings().weight.shape[0]
    ids = torch.randint(0, vocab, (1, length), generator=torch.Generator().manual_seed(0))
    best = float("inf")
    with torch.inference_mode():
        model(input_ids=ids, use_cache=False, logits_to_keep=1)  # warm-up
        for _ in range(repeats):
            t0 = time.perf_counter()
            model(input_ids=ids, use_cache=False, logits_to_keep=1)
            best = min(best, time.perf_counter() - t0)
    return {"tokens": length, "seconds": best, "gflop_s": linear_flops_per_token(model) * length / best / 1e9}


def compute_floor(model) -> dict:
    """The matmul rates and the floor in tokens/s they imply for `model` (see the module docstring)."""
    flops = linear_flops_per_token(model)
    fp32, bf16 = matmul_gflops(dtype=torch.float32), matmul_gflops(dtype=torch.bfloat16)
    dtype = next(model.parameters()).dtype
    rate = bf16 if dtype == torch.bfloat16 else fp32
    return {
        "matmul_2048_float32_gflop_s": fp32,
        "matmul_2048_bfloat16_gflop_s": bf16,
        "model_dtype": str(dtype).removeprefix("torch."),
        "flops_per_token": flops,
        "floor_tokens_per_s": rate * 1e9 / flops,
        "forward_1x256": forward_gflops(model),
    }


# ----------------------------------------------------------------------------- sampling


def random_prompts(vocab: int, batch: int, length: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (batch, length), generator=g).tolist()


def sample_ours(model, backend: str, prompts, new_tokens: int, seed: int, greedy: bool = False):
    """(seconds, token ids per row) of our sampler on engine `backend`: every row generates
    `new_tokens` (no end token), prefill included."""
    from harness.rl.engines import kv_batch
    from harness.rl.rollout import generate_turn

    kv = kv_batch(model, 0, backend)
    kv.reset(len(prompts))
    t0 = time.perf_counter()
    with torch.inference_mode():
        out = generate_turn(
            kv,
            prompts,
            None,
            eot_id=-1,  # never ends: every row generates all new_tokens
            max_new_tokens=new_tokens,
            temperature=1.0,
            top_p=1.0,
            greedy=greedy,
            generator=torch.Generator().manual_seed(seed),
        )
    seconds = time.perf_counter() - t0
    if any(len(ids) != new_tokens for ids in out.ids):
        raise RuntimeError(f"{backend}: a row did not generate {new_tokens} tokens")
    return seconds, out.ids


def sample_generate(model, prompts, new_tokens: int, seed: int, greedy: bool = False):
    """(seconds, token ids per row) of HF `generate` (dynamic cache, no top-k) forced to `new_tokens`."""
    ids = torch.tensor(prompts)
    torch.manual_seed(seed)
    t0 = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            do_sample=not greedy,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            pad_token_id=0,
            eos_token_id=None,
        )
    seconds = time.perf_counter() - t0
    if out.shape[1] != ids.shape[1] + new_tokens:
        raise RuntimeError(f"generate: {out.shape[1] - ids.shape[1]} new tokens instead of {new_tokens}")
    return seconds, out[:, ids.shape[1] :].tolist()


def _sampler(engine: str):
    if engine == "generate":
        return sample_generate
    return lambda model, prompts, n, seed, greedy=False: sample_ours(model, engine, prompts, n, seed, greedy)


def greedy_agreement(model, engines, *, rows: int = 4, prompt: int = 32, new_tokens: int = 8) -> dict:
    """Greedy tokens of every engine on the same prompts: the fraction of rows equal to `generate`'s
    (or to the first engine's)."""
    vocab = model.get_input_embeddings().weight.shape[0]
    prompts = random_prompts(vocab, rows, prompt, seed=12345)
    outs = {e: _sampler(e)(model, prompts, new_tokens, 0, greedy=True)[1] for e in engines}
    ref = outs[engines[0]]
    return {
        "reference": engines[0],
        "rows": rows,
        "new_tokens": new_tokens,
        **{f"{e}_rows_equal": sum(a == b for a, b in zip(outs[e], ref)) / rows for e in engines[1:]},
    }


def bench_sampling(
    model,
    floor_tokens_per_s: float,
    *,
    batches: tuple[int, ...] = SIZES["batches"],
    prompt: int = SIZES["prompt"],
    new_tokens: int = SIZES["new_tokens"],
    repeats: int = SIZES["repeats"],
    engines: tuple[str, ...] = ("generate", "hf", "static"),
) -> dict:
    """Tokens/s of each engine at each batch size (median of `repeats`, sides interleaved, after a
    short warm-up), the ratios to `generate` and the fractions of the floor."""
    vocab = model.get_input_embeddings().weight.shape[0]
    out: dict = {"prompt_tokens": prompt, "new_tokens": new_tokens, "repeats": repeats, "by_batch": {}}
    for batch in batches:
        prompts = random_prompts(vocab, batch, prompt, seed=batch)
        for e in engines:  # warm-up: kernels, allocator, the static engine's buffers
            _sampler(e)(model, prompts, min(new_tokens, 4), 0)
        secs: dict[str, list[float]] = {e: [] for e in engines}
        tokens: dict[str, list] = {}
        for r in range(repeats):
            for e in engines:
                s, ids = _sampler(e)(model, prompts, new_tokens, r + 1)
                secs[e].append(s)
                tokens[e] = ids
        row: dict = {"load_average": load_average()}
        ran = batch * (prompt + new_tokens - 1)  # tokens the model processed (the last one is never fed)
        for e in engines:
            sec = statistics.median(secs[e])
            row[f"{e}_tokens_per_s"] = batch * new_tokens / sec
            row[f"{e}_generated_tokens"] = sum(len(x) for x in tokens[e])
            row[f"{e}_fraction_of_floor"] = row[f"{e}_tokens_per_s"] / floor_tokens_per_s
            row[f"{e}_fraction_of_floor_all"] = ran / sec / floor_tokens_per_s
            if e != "generate" and "generate" in engines:
                row[f"{e}_vs_generate"] = row[f"{e}_tokens_per_s"] / row["generate_tokens_per_s"]
        if "hf" in tokens and "static" in tokens:  # same random stream: the same tokens
            row["hf_static_rows_equal"] = sum(a == b for a, b in zip(tokens["hf"], tokens["static"])) / batch
        out["by_batch"][str(batch)] = row
    out["greedy_agreement"] = greedy_agreement(model, list(engines), prompt=prompt)
    return out


# ----------------------------------------------------------------------------- the update


class _TimingsLogger:
    """A run logger that keeps the update timings (timings.jsonl rows) and drops the rest."""

    def __init__(self):
        self.timings: list[dict] = []

    def log(self, *a) -> None: ...
    def log_samples(self, *a) -> None: ...
    def log_eval_tasks(self, *a) -> None: ...
    def truncate_after(self, *a) -> None: ...

    def log_timings(self, update: int, seconds: dict) -> None:
        self.timings.append({"update": update, **seconds})


def bench_update_split(cfg, updates: int = 2) -> dict:
    """`updates` training updates of `cfg` (no evaluation): seconds of each split into rollout,
    behaviour + reference log-probs and the rest of the update (advantages, the epochs of gradient
    steps, diagnostics), episodes and tokens, and the peak resident memory of the process while
    they ran (model, optimizer, rollout and update together; Linux)."""
    from harness.bench.memory import _cpu_rss_bytes
    from harness.rl.trainer import Trainer

    d = cfg.model_dump()
    d["train"].update({"eval_every": 0, "mi_every": 0})
    cfg = type(cfg).model_validate(d)
    logger = _TimingsLogger()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        trainer = Trainer(cfg, Path(tmp), logger)
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")  # the high-water mark restarts from the current resident set
            rss_before = _cpu_rss_bytes("VmRSS")
            for u in range(1, updates + 1):
                t0 = time.perf_counter()
                m = trainer.one_update(u)
                wall = time.perf_counter() - t0
                t = logger.timings[-1] if logger.timings and logger.timings[-1]["update"] == u else {}
                rollout, logprobs = t.get("rollout_s", float("nan")), t.get("logprobs_s", float("nan"))
                rows.append(
                    {
                        "wall_s": wall,
                        "rollout_s": rollout,
                        "logprobs_s": logprobs,
                        "update_s": wall - rollout - logprobs,
                        "episodes": int(m["perf/episodes"]),
                        "generated_tokens": int(m["perf/rollout_tokens"]),
                        "train_tokens": int(m.get("perf/train_tokens", 0)),
                        "load_average": load_average(),
                    }
                )
            peak = _cpu_rss_bytes("VmHWM")
        finally:
            trainer.close()
    med = {k: statistics.median(r[k] for r in rows) for k in ("wall_s", "rollout_s", "logprobs_s", "update_s")}
    return {
        "updates": rows,
        "median": med,
        "updates_per_hour": 3600 / med["wall_s"],
        "rss_before_gib": rss_before / 2**30,
        "peak_rss_gib": peak / 2**30,
        "threads": torch.get_num_threads(),
    }


# ----------------------------------------------------------------------------- the part


def bench_real(cfg, *, sizes: dict | None = None, updates: int = 2) -> dict:
    """The part `real` of `harness bench`: floor, sampling and the update split on `cfg`'s model."""
    from harness.model.base import load_pretrained
    from harness.model.cache import cache_dir
    from harness.model.pipeline import base_model
    from harness.rl.demos import Demonstrations

    size = {**SIZES, **(sizes or {})}
    source, _ = base_model(cfg, cache_dir(), Demonstrations.of(cfg))
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[cfg.model.dtype]
    model, _tok = load_pretrained(source, dtype)
    model.eval()
    out: dict = {"model": cfg.model.name, "threads": torch.get_num_threads(), "load_average_start": load_average()}
    out["parameters"] = sum(p.numel() for p in model.parameters())
    out["floor"] = compute_floor(model)
    out["sampling"] = bench_sampling(model, out["floor"]["floor_tokens_per_s"], **size)
    from harness.rl.engines import static

    static.release(model)
    del model
    if updates:
        out["update_split"] = bench_update_split(cfg, updates)
    out["load_average_end"] = load_average()
    return out
