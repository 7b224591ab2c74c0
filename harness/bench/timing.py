"""What the bench parts share: timed samplers (ours and HF `generate`, forced to the same number of
new tokens, the device synchronised around the clock), random prompts, and a logger that drops
everything for bench updates."""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def random_prompts(vocab: int, batch: int, prompt: int, seed: int) -> list[list[int]]:
    """`batch` prompts of `prompt` uniformly random token ids (seeded)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (batch, prompt), generator=g).tolist()


@dataclass
class Sample:
    seconds: float  # wall time
    cpu_seconds: float  # CPU time of this process (all its threads)
    ids: list[list[int]]
    logprobs: list[list[float]] | None  # the sampler's log-probs of its tokens (None: generate)


def sample_ours(model, backend: str, prompts, new_tokens: int, seed: int, greedy: bool = False):
    """Our sampler on engine `backend` (a `Sample`): every row generates `new_tokens` (no end
    token), prefill included."""
    from harness.rl.engines import kv_batch
    from harness.rl.rollout import generate_turn

    device = str(next(model.parameters()).device)
    kv = kv_batch(model, 0, backend)
    kv.reset(len(prompts))
    sync(device)
    t0, c0 = time.perf_counter(), time.process_time()
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
    sync(device)
    seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    if any(len(ids) != new_tokens for ids in out.ids):
        raise RuntimeError(f"{backend}: a row did not generate {new_tokens} tokens")
    return Sample(seconds, cpu, out.ids, out.logprobs)


def sample_generate(model, prompts, new_tokens: int, seed: int, greedy: bool = False):
    """HF `generate` (dynamic cache, no top-k) forced to `new_tokens` (a `Sample`)."""
    device = str(next(model.parameters()).device)
    ids = torch.tensor(prompts, device=device)
    torch.manual_seed(seed)
    sync(device)
    t0, c0 = time.perf_counter(), time.process_time()
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
    sync(device)
    seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    if out.shape[1] != ids.shape[1] + new_tokens:
        raise RuntimeError(f"generate: {out.shape[1] - ids.shape[1]} new tokens instead of {new_tokens}")
    return Sample(seconds, cpu, out[:, ids.shape[1] :].tolist(), None)


class NullLogger:
    def log(self, *a) -> None: ...
    def log_samples(self, *a) -> None: ...
    def log_eval_tasks(self, *a) -> None: ...
    def log_timings(self, *a) -> None: ...
    def truncate_after(self, *a) -> None: ...
