"""A real model on this machine (`harness bench --only real`): the compute floor, the samplers and
training updates, with every ratio measured in the same process.

- `compute_floor`: this machine's matmul rate (a square float32 and bfloat16 matmul, the best of a
  few runs; float32 at one thread too: on a busy machine more threads can run slower than one)
  turned into a floor in tokens per second: a token costs about 2 FLOPs per weight it is
  multiplied by (`linear_flops_per_token`: every `nn.Linear` of the model, the output head
  included, the input embedding lookup not; attention scores and element-wise work are left out,
  about 2% of a 96-token context for SmolLM2). Also the rate one 1 x 256 forward of the model reaches.
- `bench_sampling`: sampled tokens per second of HF `generate`, of our sampler on the `hf` and
  `static` engines, and of the static engine on a bfloat16 copy (`static:bfloat16`, what
  `rollout.sampler_dtype: bfloat16` runs), at each batch size, for the same random prompts and
  the same number of new tokens on every side (`generate` with `min_new_tokens` =
  `max_new_tokens` and no end token; ours with no end token); the ratio of each to `generate`,
  and the fraction of the floor of the model's dtype. Two fractions: `fraction_of_floor` counts
  the generated tokens only (what issue 37's figures count), `fraction_of_floor_all` every token
  the model ran (prompt + generated - 1). The engines' tokens are compared: `hf` and `static`
  draw from the same random stream, so they sample the same tokens when their logits agree; a
  short greedy run compares them with `generate`; the bfloat16 sampler's log-probs are compared
  with the model's on the tokens it drew (`logprob_gap`).
- `bench_update_split`: seconds of real training updates (the config's environment, model,
  rollout and algorithm) split into the rollout, the behaviour and reference log-probs, and the
  rest of the update, the sampler/behaviour mismatch diagnostics, and the process's peak
  resident memory.

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

from harness.bench.timing import NullLogger, Sample, random_prompts, sample_generate, sample_ours

SIZES = {"batches": (32, 1), "prompt": 32, "new_tokens": 64, "repeats": 3, "matmul": 2048}
ENGINES = ("generate", "hf", "static", "static:bfloat16")
MISMATCH_KEYS = ("diag/logprob_mismatch", "diag/logprob_mismatch_max", "diag/mismatch_k3", "diag/mismatch_ess")


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


# ----------------------------------------------------------------------------- the floor


def matmul_gflops(
    n: int = 2048, dtype: torch.dtype = torch.float32, repeats: int = 5, timer=time.perf_counter
) -> float:
    """GFLOP/s of an n x n by n x n matmul (2 n^3 FLOPs) at the current thread count, best of
    `repeats`; `timer` time.process_time gives GFLOP per CPU-second of this process instead."""
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(n, n, generator=g).to(dtype), torch.randn(n, n, generator=g).to(dtype)
    a @ b  # warm-up: thread pool, kernel choice
    best = float("inf")
    for _ in range(repeats):
        t0 = timer()
        a @ b
        best = min(best, timer() - t0)
    return 2 * n**3 / max(best, 1e-9) / 1e9


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
    """The rates of an n x n matmul and the floors in tokens/s they imply for `model` (see the
    module docstring): per second of wall time, and per CPU-second of this process (what the
    machine gives a process that has its cores to itself; on a shared machine the robust one);
    float32 at one thread too (more threads slower than one: they contend for busy cores)."""
    flops = linear_flops_per_token(model)
    dtype = next(model.parameters()).dtype
    rates = {
        (name, clock): matmul_gflops(n, dt, timer=timer)
        for name, dt in (("float32", torch.float32), ("bfloat16", torch.bfloat16))
        for clock, timer in (("s", time.perf_counter), ("cpu_s", time.process_time))
    }
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        one = matmul_gflops(n, torch.float32)
    finally:
        torch.set_num_threads(threads)
    name = "bfloat16" if dtype == torch.bfloat16 else "float32"
    return {
        "matmul_n": n,
        **{f"matmul_{dt}_gflop_per_{clock}": r for (dt, clock), r in rates.items()},
        "matmul_float32_gflop_per_s_1_thread": one,
        "model_dtype": str(dtype).removeprefix("torch."),
        "flops_per_token": flops,
        "floor_tokens_per_s": rates[(name, "s")] * 1e9 / flops,
        "floor_tokens_per_cpu_s": rates[(name, "cpu_s")] * 1e9 / flops,
        "forward_1x256": forward_gflops(model),
    }


# ----------------------------------------------------------------------------- sampling


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
    outs = {e: engines.sample(e, prompts, new_tokens, 0, greedy=True).ids for e in names}
    ref = outs[names[0]]
    return {
        "reference": names[0],
        "rows": rows,
        "new_tokens": new_tokens,
        **{f"{e}_rows_equal": sum(a == b for a, b in zip(outs[e], ref)) / rows for e in names[1:]},
    }


def bench_sampling(
    model,
    floor: dict,
    *,
    batches: tuple[int, ...] = SIZES["batches"],
    prompt: int = SIZES["prompt"],
    new_tokens: int = SIZES["new_tokens"],
    repeats: int = SIZES["repeats"],
    engines: tuple[str, ...] = ENGINES,
) -> dict:
    """Tokens per second and per CPU-second of each engine at each batch size (best of `repeats`,
    sides interleaved, after a short warm-up), the ratios to `generate` and the
    fractions of the floors of `model`'s dtype (`compute_floor`: per second and per CPU-second);
    for engines on a copy in another dtype, the log-prob gap to `model` (`logprob_gap`)."""
    vocab = model.get_input_embeddings().weight.shape[0]
    runner = Engines(model)
    out: dict = {"prompt_tokens": prompt, "new_tokens": new_tokens, "repeats": repeats, "by_batch": {}}
    try:
        for batch in batches:
            prompts = random_prompts(vocab, batch, prompt, seed=batch)
            for e in engines:  # warm-up: kernels, allocator, the static engine's buffers
                runner.sample(e, prompts, min(new_tokens, 4), 0)
            runs: dict[str, list[Sample]] = {e: [] for e in engines}
            for r in range(repeats):
                for e in engines:
                    runs[e].append(runner.sample(e, prompts, new_tokens, r + 1))
            row: dict = {"load_average": load_average()}
            for e in engines:
                row.update(_engine_row(e, runs[e], batch, prompt, new_tokens, floor))
                if ":" in e:
                    row[f"{e}_logprob_gap"] = logprob_gap(model, prompts, runs[e][-1].ids, runs[e][-1].logprobs)
            for e in engines:
                if e != "generate" and "generate" in engines:
                    for unit in ("s", "cpu_s"):
                        row[f"{e}_vs_generate_per_{unit}"] = (
                            row[f"{e}_tokens_per_{unit}"] / row[f"generate_tokens_per_{unit}"]
                        )
            if "hf" in runs and "static" in runs:  # same random stream: the same tokens
                same = zip(runs["hf"][-1].ids, runs["static"][-1].ids)
                row["hf_static_rows_equal"] = sum(a == b for a, b in same) / batch
            out["by_batch"][str(batch)] = row
        out["greedy_agreement"] = greedy_agreement(runner, [e for e in engines if ":" not in e], prompt=prompt)
    finally:
        runner.release()
    return out


def _engine_row(e: str, runs: list[Sample], batch: int, prompt: int, new_tokens: int, floor: dict) -> dict:
    """One engine's figures at one batch size: tokens per second and per CPU-second (the best of
    the repeats: on a shared machine a run can only be slowed down by the others, once by 10x in
    CPU time), generated tokens, and the fractions of the floors (generated tokens only, and
    `_all`: every token the model ran, prompt + generated - 1, the last one never being fed)."""
    ran = batch * (prompt + new_tokens - 1)
    row = {f"{e}_generated_tokens": sum(len(x) for x in runs[-1].ids)}
    for unit, secs in (("s", [r.seconds for r in runs]), ("cpu_s", [r.cpu_seconds for r in runs])):
        row[f"{e}_{unit}_per_repeat"] = secs
        sec = max(min(secs), 1e-9)
        row[f"{e}_tokens_per_{unit}"] = batch * new_tokens / sec
        row[f"{e}_fraction_of_floor_per_{unit}"] = row[f"{e}_tokens_per_{unit}"] / floor[f"floor_tokens_per_{unit}"]
        row[f"{e}_fraction_of_floor_all_per_{unit}"] = ran / sec / floor[f"floor_tokens_per_{unit}"]
    return row


# ----------------------------------------------------------------------------- the update


def _timed_update(trainer, cfg, update: int) -> tuple[dict, dict]:
    """(metrics, times) of one synchronous update, as `Trainer.one_update` runs it (rollout worker,
    then learner), with wall and process CPU seconds of the rollout, of the behaviour and reference
    log-probs and of the rest of the update."""
    from harness.rl.turns import turn_budget_at

    budget = turn_budget_at(update - 1, cfg.turns)
    t0, c0 = time.perf_counter(), time.process_time()
    batch = trainer.worker.rollout(update, budget)
    t1, c1 = time.perf_counter(), time.process_time()
    metrics, seconds = trainer.learner.learn(batch, budget)
    t2, c2 = time.perf_counter(), time.process_time()
    seconds = seconds or {}
    lp, lp_cpu = seconds.get("logprobs_s", 0.0), seconds.get("logprobs_cpu_s", 0.0)
    times = {
        "wall_s": t2 - t0,
        "rollout_s": t1 - t0,
        "logprobs_s": lp,
        "update_s": t2 - t1 - lp,
        "cpu_s": c2 - c0,  # this process's CPU time: what the update costs on cores it has to itself
        "rollout_cpu_s": c1 - c0,
        "logprobs_cpu_s": lp_cpu,
        "update_cpu_s": c2 - c1 - lp_cpu,
    }
    return metrics, times


def bench_update_split(cfg, updates: int = 2) -> dict:
    """`updates` training updates of `cfg` (no evaluation): wall and CPU seconds of each, split into
    rollout, behaviour + reference log-probs and the rest of the update (advantages, the epochs of
    gradient steps, diagnostics), episodes and tokens, the sampler/behaviour mismatch, and the
    peak resident memory of the process while they ran (model, optimizer, rollout and update
    together; Linux). The medians leave the first update out when there are several."""
    from harness.bench.memory import _cpu_rss_bytes
    from harness.rl.trainer import Trainer

    d = cfg.model_dump()
    d["train"].update({"eval_every": 0, "mi_every": 0})
    d["rollout"].update({"concurrent": False})
    cfg = type(cfg).model_validate(d)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        trainer = Trainer(cfg, Path(tmp), NullLogger())
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")  # the high-water mark restarts from the current resident set
            rss_before = _cpu_rss_bytes("VmRSS")
            for u in range(1, updates + 1):
                m, times = _timed_update(trainer, cfg, u)
                rows.append(
                    {
                        **times,
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
    # the first update pays one-time costs (page faults of freshly loaded weights, allocator growth,
    # kernel choice; 5x the CPU time of the second once on a busy machine): left out of the median
    timed = rows[1:] if len(rows) > 1 else rows
    med = {k: statistics.median(r[k] for r in timed) for k in rows[0] if k.endswith("_s")}
    return {
        "updates": rows,
        "median": med,
        "median_of_updates": [len(rows) - len(timed) + 1, len(rows)],
        "updates_per_hour": 3600 / med["wall_s"],
        "updates_per_cpu_hour": 3600 / med["cpu_s"],  # an hour of CPU time of this process
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
    out["floor"] = compute_floor(model, size.pop("matmul"))
    if sampling:
        out["sampling"] = bench_sampling(model, out["floor"], **size)
    del model
    if updates:
        out["update_split"] = bench_update_split(cfg, updates)
    out["load_average_end"] = load_average()
    return out
