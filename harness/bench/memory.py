"""Peak memory of the chunked log-prob computation (`harness.model.logprobs`) against the naive
full-vocabulary float32 log-softmax, and the plain reference computation both are checked
against in tests.
"""

from __future__ import annotations

import ctypes
import gc
from collections.abc import Callable

import torch
from torch import nn

from harness.model.logprobs import (
    DEFAULT_CHUNK,
    NEG,
    backbone_and_head,
    hidden_states,
    logprobs_from_hidden,
    position_ids,
    token_logprobs,
)


def naive_token_logprobs(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    *,
    temperature: float = 1.0,
    with_entropy: bool = False,
    allowed: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The reference computation (full (B, T, V) float32 log-softmax); for tests and the benchmark."""
    logits = (
        model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids(attention_mask),
            use_cache=False,
        ).logits.float()
        / temperature
    )
    logits = logits[:, :-1]
    if allowed is not None:  # disallowed ids -> -inf, by a plain (B, T-1, V) mask
        al = allowed[:, 1:]
        keep = torch.zeros(logits.shape, dtype=torch.bool)
        for b, t, k in (al >= 0).nonzero().tolist():
            keep[b, t, al[b, t, k]] = True
        keep |= ~(al[..., 0] >= 0)[..., None]
        logits = logits.masked_fill(~keep, float("-inf"))
    logsm = logits.log_softmax(-1)  # (B, T-1, V)
    valid = (attention_mask[:, 1:] * attention_mask[:, :-1]).float()
    lp = logsm.gather(-1, input_ids[:, 1:, None]).squeeze(-1) * valid
    pad = lp.new_zeros(lp.shape[0], 1)
    ent = None
    if with_entropy:
        ent = torch.cat([pad, -(logsm.exp() * logsm.clamp(min=NEG)).sum(-1) * valid], dim=1)
    return torch.cat([pad, lp], dim=1), ent


def _cpu_rss_bytes(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"{field} not in /proc/self/status")


def _configure_malloc() -> None:
    """glibc: serve blocks >= 64 KiB by mmap (which also stops the threshold's dynamic growth) and
    hand free heap pages back, so memory freed earlier cannot hide a later peak."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-3, 64 * 1024)  # M_MMAP_THRESHOLD
        libc.malloc_trim(0)
    except (OSError, AttributeError):
        pass


def measure_peak_bytes(fn: Callable[[], object], device: torch.device | str = "cpu") -> int:
    """Peak memory `fn()` adds above what was allocated before it ran.

    CUDA: `torch.cuda.max_memory_allocated`. CPU (Linux): the process's resident-set high-water
    mark, reset through /proc/self/clear_refs. glibc is told to serve allocations >= 64 KiB by mmap
    and to return free heap pages first, so memory freed earlier cannot hide a later peak.
    """
    device = torch.device(device)
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        base = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        fn()
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_allocated(device) - base
    _configure_malloc()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset VmHWM to the current resident set
    base = _cpu_rss_bytes("VmRSS")
    fn()
    return _cpu_rss_bytes("VmHWM") - base


def _sides(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    *,
    chunk_size: int,
    backward: bool,
    head_only: bool,
) -> tuple[Callable[[], None], Callable[[], None], Callable[[], None]]:
    """(chunked, naive, clear): the two computations being compared, and a reset between runs."""
    hidden = None
    if head_only:
        with torch.no_grad():
            hidden = hidden_states(model, input_ids, attention_mask)
        hidden.requires_grad_(backward)
        _, head = backbone_and_head(model)

        def naive() -> None:
            logits = head(hidden).float()  # (B, T, V)
            lp = logits[:, :-1].log_softmax(-1).gather(-1, input_ids[:, 1:, None])
            if backward:
                lp.sum().backward()

        def chunked() -> None:
            lp, _ = logprobs_from_hidden(model, hidden, input_ids, attention_mask, chunk_size=chunk_size)
            if backward:
                lp.sum().backward()
    else:

        def naive() -> None:
            lp, _ = naive_token_logprobs(model, input_ids, attention_mask)
            if backward:
                lp.sum().backward()

        def chunked() -> None:
            lp, _ = token_logprobs(model, input_ids, attention_mask, chunk_size=chunk_size)
            if backward:
                lp.sum().backward()

    def clear() -> None:  # each measured run starts with no gradient buffers allocated
        model.zero_grad(set_to_none=True)
        if hidden is not None:
            hidden.grad = None

    return chunked, naive, clear


def _measure_runs(fn: Callable[[], None], clear: Callable[[], None], device, repeats: int, backward: bool) -> list[int]:
    """One unmeasured run (one-time allocations: thread pools, kernel workspaces), then `repeats`
    measured ones, each starting from cleared gradients."""
    with torch.set_grad_enabled(backward):
        fn()
        clear()
        runs = []
        for _ in range(repeats):
            runs.append(measure_peak_bytes(fn, device))
            clear()
    return runs


def _isolated_side(path: str, side: str, kw: dict, repeats: int, threads: int) -> list[int]:
    """Worker (a freshly spawned process): load the saved model and batch, measure one side."""
    torch.set_num_threads(threads)
    _configure_malloc()
    saved = torch.load(path, weights_only=False)  # our own file, written just before by the parent
    model, ids, mask = saved["model"], saved["input_ids"], saved["attention_mask"]
    chunked, naive, clear = _sides(model, ids, mask, **kw)
    return _measure_runs(chunked if side == "chunked" else naive, clear, "cpu", repeats, kw["backward"])


def peak_memory_ratio(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    *,
    chunk_size: int = DEFAULT_CHUNK,
    backward: bool = True,
    head_only: bool = True,
    repeats: int = 3,
    isolate: bool | None = None,
) -> dict:
    """Peak memory of the chunked log-prob computation vs the naive full log-softmax.

    head_only: measure from the hidden states on (the log-prob computation itself; the backbone's
    activations are the same in both and are excluded). Otherwise the whole forward is measured.
    backward: include the backward pass (gradients into the trainable parameters / hidden states).
    repeats: each side is run once unmeasured (one-time allocations: thread pools, kernel
    workspaces) and then measured this many times; the minimum is kept. On CPU the probe is the
    whole process's resident set, which other threads (a logger, a leftover worker) can only
    raise, so the minimum is the estimate least polluted by them.
    isolate (default: on CPU): measure each side in a freshly spawned process. The resident-set
    probe counts every page the computation touches for the first time; in a long-lived process
    (a test session, a training run) the heap is fragmented by whatever ran before, and freed
    heap pages that get re-used show up as new resident memory or hide it, so the same
    computation measured 20 MB in a fresh process and 54-59 MB after other tests had run. A fresh
    process per side measures the computation, not the history of the process. CUDA's allocator
    statistics have no such problem, so CUDA is measured in this process.
    Returns {"naive_bytes", "chunked_bytes", "ratio", ...}.
    """
    device, repeats = input_ids.device, max(1, repeats)
    isolate = device.type == "cpu" if isolate is None else isolate
    if isolate and device.type != "cpu":
        raise ValueError(f"isolate=True measures on the CPU only; the batch is on {device}")
    kw = {"chunk_size": chunk_size, "backward": backward, "head_only": head_only}
    if isolate:
        import multiprocessing as mp
        import tempfile
        from concurrent.futures import ProcessPoolExecutor
        from pathlib import Path

        with tempfile.TemporaryDirectory(prefix="harness-mem-") as tmp:
            path = str(Path(tmp) / "batch.pt")
            torch.save({"model": model, "input_ids": input_ids, "attention_mask": attention_mask}, path)
            # two fresh processes side by side (one task each): a probe reads its own resident set only
            with ProcessPoolExecutor(2, mp_context=mp.get_context("spawn"), max_tasks_per_child=1) as pool:
                threads = torch.get_num_threads()
                jobs = {
                    side: pool.submit(_isolated_side, path, side, kw, repeats, threads) for side in ("chunked", "naive")
                }
                chunk_runs, naive_runs = jobs["chunked"].result(), jobs["naive"].result()
    else:
        if device.type == "cpu":
            _configure_malloc()  # before the warm-up runs, so they allocate the way the measured ones will
        chunked, naive, clear = _sides(model, input_ids, attention_mask, **kw)
        chunk_runs = _measure_runs(chunked, clear, device, repeats, backward)
        naive_runs = _measure_runs(naive, clear, device, repeats, backward)
    chunk_bytes, naive_bytes = min(chunk_runs), min(naive_runs)
    return {
        "naive_bytes": naive_bytes,
        "chunked_bytes": chunk_bytes,
        "ratio": chunk_bytes / max(naive_bytes, 1),
        "tokens": int(attention_mask.sum()),
        "chunk_size": chunk_size,
        "head_only": head_only,
        "backward": backward,
        "device": str(device),
        "repeats": repeats,
        "isolated": isolate,
    }
