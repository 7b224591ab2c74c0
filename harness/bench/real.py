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

import copy
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch

SIZES = {"batches": (32, 1), "prompt": 32, "new_tokens": 64, "repeats": 2}
ENGINES = ("generate", "hf", "static", "static:bfloat16")
MISMATCH_KEYS = ("diag/logprob_mismatch", "diag/logprob_mismatch_max", "diag/mismatch_k3", "diag/mismatch_ess")


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


def compute_floor(model, n: int = 2048) -> dict:
    """The rates of an n x n matmul and the floor in tokens/s they imply for `model` (see the module
    docstring); the matmul at one thread too (more threads slower than one: they contend for cores)."""
    flops = linear_flops_per_token(model)
    fp32, bf16 = matmul_gflops(n, torch.float32), matmul_gflops(n, torch.bfloat16)
    dtype = next(model.parameters()).dtype
    rate = bf16 if dtype == torch.bfloat16 else fp32
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        one = matmul_gflops(n, torch.float32)
    finally:
        torch.set_num_threads(threads)
    return {
        "matmul_n": n,
        "matmul_float32_gflop_s": fp32,
        "matmul_bfloat16_gflop_s": bf16,
        "matmul_float32_gflop_s_1_thread": one,
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
    """(seconds, token ids per row, their log-probs) of our sampler on engine `backend`: every row
    generates `new_tokens` (no end token), prefill included."""
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
    return seconds, out.ids, out.logprobs


def sample_generate(model, prompts, new_tokens: int, seed: int, greedy: bool = False):
    """(seconds, token ids per row, None) of HF `generate` (dynamic cache, no top-k) forced to `new_tokens`."""
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
    return seconds, out[:, ids.shape[1] :].tolist(), None


class Engines:
    """The samplers compared: `generate`, `hf`, `static`, and `<engine>:bfloat16`, our engine on a
    bfloat16 copy of the model (made once), as `rollout.sampler_dtype: bfloat16` samples."""

    def __init__(self, model):
        self.model, self._copies = model, {}

    def model_for(self, engine: str):
        _, _, dtype = engine.partition(":")
        if not dtype:
            return self.model
        if dtype not in self._copies:
            self._copies[dtype] = copy.deepcopy(self.model).to(getattr(torch, dtype)).eval()
        return self._copies[dtype]

    def sample(self, engine: str, prompts, new_tokens: int, seed: int, greedy: bool = False):
        backend = engine.partition(":")[0]
        model = self.model_for(engine)
        if backend == "generate":
            return sample_generate(model, prompts, new_tokens, seed, greedy)
        return sample_ours(model, backend, prompts, new_tokens, seed, greedy)

    def release(self) -> None:
        from harness.rl.engines import static

        for m in (self.model, *self._copies.values()):
            static.release(m)
        self._copies.clear()


def logprob_gap(model, prompts, ids, logprobs) -> dict:
    """How far a sampler's log-probs of its own tokens are from `model`'s (teacher-forced, in
    `model`'s dtype): mean |delta| and the k3 estimate of KL(sampler || model) over the tokens, the
    mismatch an off-policy correction (algo.correction) has to absorb."""
    from harness.model.logprobs import token_logprobs

    full = torch.tensor([p + x for p, x in zip(prompts, ids)])
    with torch.inference_mode():
        lp, _ = token_logprobs(model, full, torch.ones_like(full))
    ref = lp[:, len(prompts[0]) :].double()  # (B, new)
    sampler = torch.tensor(logprobs, dtype=torch.float64)
    d = ref - sampler  # log (model / sampler)
    return {"mean_abs_delta": float(d.abs().mean()), "k3": float((torch.expm1(d) - d).mean())}


def greedy_agreement(engines: Engines, names, *, rows: int = 4, prompt: int = 32, new_tokens: int = 8) -> dict:
    """Greedy tokens of every engine on the same prompts: the fraction of rows equal to the first engine's."""
    vocab = engines.model.get_input_embeddings().weight.shape[0]
    prompts = random_prompts(vocab, rows, prompt, seed=12345)
    outs = {e: engines.sample(e, prompts, new_tokens, 0, greedy=True)[1] for e in names}
    ref = outs[names[0]]
    return {
        "reference": names[0],
        "rows": rows,
        "new_tokens": new_tokens,
        **{f"{e}_rows_equal": sum(a == b for a, b in zip(outs[e], ref)) / rows for e in names[1:]},
    }


def bench_sampling(
    model,
    floor_tokens_per_s: float,
    *,
    batches: tuple[int, ...] = SIZES["batches"],
    prompt: int = SIZES["prompt"],
    new_tokens: int = SIZES["new_tokens"],
    repeats: int = SIZES["repeats"],
    engines: tuple[str, ...] = ENGINES,
) -> dict:
    """Tokens/s of each engine at each batch size (median of `repeats`, sides interleaved, after a
    short warm-up), the ratios to `generate` and the fractions of the floor (of `model`'s dtype);
    for engines on a copy in another dtype, the log-prob gap to `model` (`logprob_gap`)."""
    vocab = model.get_input_embeddings().weight.shape[0]
    runner = Engines(model)
    out: dict = {"prompt_tokens": prompt, "new_tokens": new_tokens, "repeats": repeats, "by_batch": {}}
    try:
        for batch in batches:
            prompts = random_prompts(vocab, batch, prompt, seed=batch)
            for e in engines:  # warm-up: kernels, allocator, the static engine's buffers
                runner.sample(e, prompts, min(new_tokens, 4), 0)
            secs: dict[str, list[float]] = {e: [] for e in engines}
            last: dict[str, tuple] = {}
            for r in range(repeats):
                for e in engines:
                    s, ids, lps = runner.sample(e, prompts, new_tokens, r + 1)
                    secs[e].append(s)
                    last[e] = (ids, lps)
            row: dict = {"load_average": load_average()}
            ran = batch * (prompt + new_tokens - 1)  # tokens the model processed (the last one is never fed)
            for e in engines:
                sec = statistics.median(secs[e])
                row[f"{e}_tokens_per_s"] = batch * new_tokens / sec
                row[f"{e}_generated_tokens"] = sum(len(x) for x in last[e][0])
                row[f"{e}_fraction_of_floor"] = row[f"{e}_tokens_per_s"] / floor_tokens_per_s
                row[f"{e}_fraction_of_floor_all"] = ran / sec / floor_tokens_per_s
                if e != "generate" and "generate" in engines:
                    row[f"{e}_vs_generate"] = row[f"{e}_tokens_per_s"] / row["generate_tokens_per_s"]
                if ":" in e:
                    row[f"{e}_logprob_gap"] = logprob_gap(model, prompts, *last[e])
            if "hf" in last and "static" in last:  # same random stream: the same tokens
                row["hf_static_rows_equal"] = sum(a == b for a, b in zip(last["hf"][0], last["static"][0])) / batch
            out["by_batch"][str(batch)] = row
        out["greedy_agreement"] = greedy_agreement(runner, [e for e in engines if ":" not in e], prompt=prompt)
    finally:
        runner.release()
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
                        # sampler vs behaviour log-probs (rollout.sampler_dtype: the cost of sampling in bf16)
                        **{k: m[k] for k in MISMATCH_KEYS if k in m},
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


def bench_real(cfg, *, sizes: dict | None = None, updates: int = 2, sampling: bool = True) -> dict:
    """The parts `real` (floor, sampling and the update split) and `real_update` (`sampling` False:
    floor and update split, e.g. to compare configurations) of `harness bench` on `cfg`'s model."""
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
    if sampling:
        out["sampling"] = bench_sampling(model, out["floor"]["floor_tokens_per_s"], **size)
    del model
    if updates:
        out["update_split"] = bench_update_split(cfg, updates)
    out["load_average_end"] = load_average()
    return out
