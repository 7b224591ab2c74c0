"""Mutual-information proxy for template collapse (RAGEN-2; docs/algorithms.md#mi-proxy).

Take N distinct prompts x_j and one response z_a per prompt (z_a answered x_a). Score every
response under every prompt,

    S[a, j] = log p(z_a | x_j) / len(z_a)            (length-normalised, nats per token)

then matched = S[a, a], marginal = logsumexp_j S[a, j] - log N, and

    mi_estimate = mean_a(matched - marginal)         (<= log N)

If responses carry information about their prompt, z_a is far likelier under x_a than under
the others (mi -> log N, retrieval -> 1). Template collapse: responses stop depending on the
prompt (mi -> 0, retrieval -> chance k/N) while entropy may stay high. Run it every k updates;
it costs N^2 forward passes of len(x) + len(z) tokens, without gradients.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn

from harness.model.logprobs import DEFAULT_CHUNK, token_logprobs


def mi_from_scores(S: torch.Tensor, k: Sequence[int] = (1, 5)) -> dict[str, float]:
    """MI estimate, retrieval accuracy and conditional entropy from a score matrix.

    S: (N, N), S[a, j] = length-normalised log p(z_a | x_j); the diagonal holds each response's
    own prompt. Retrieval@k: the fraction of rows whose own prompt ranks in the top min(k, N).
    Ties are broken uniformly at random, in expectation: an own score tied with t-1 others and
    beaten by g scores counts clamp((k - g) / t, 0, 1). So a constant row (identical responses,
    nothing to retrieve) scores exactly chance k/N, neither 1 (ties won) nor 0 (ties lost).
    Keys (k as requested, clipped to N in the value): diag/mi_estimate, diag/mi_log_n,
    diag/mi_n, diag/retrieval_acc@k, diag/retrieval_chance@k, diag/cond_entropy (-mean matched,
    nats per token).
    """
    if S.dim() != 2 or S.shape[0] != S.shape[1] or S.shape[0] < 2:
        raise ValueError(f"mi_from_scores: S must be square (N, N) with N >= 2, got shape {tuple(S.shape)}")
    if not torch.isfinite(S).all():
        raise ValueError("mi_from_scores: S has non-finite entries (empty response or overflow?)")
    S = S.detach().double().cpu()
    N = S.shape[0]
    matched = S.diagonal()  # (N,)
    marginal = torch.logsumexp(S, dim=1) - math.log(N)  # (N,)
    out = {"diag/mi_estimate": (matched - marginal).mean().item(), "diag/mi_log_n": math.log(N), "diag/mi_n": float(N)}
    beaten = (S > matched[:, None]).sum(1).double()  # (N,) scores strictly above the own prompt's
    tied = (S == matched[:, None]).sum(1).double()  # (N,) includes the own prompt itself
    for kk in k:
        top = min(int(kk), N)
        out[f"diag/retrieval_acc@{kk}"] = ((top - beaten) / tied).clamp(0.0, 1.0).mean().item()
        out[f"diag/retrieval_chance@{kk}"] = top / N
    out["diag/cond_entropy"] = -matched.mean().item()
    return out


def _validate(prompts: Sequence[Sequence[int]], responses: Sequence[Sequence[int]]) -> None:
    where = "mi_proxy"
    if len(prompts) != len(responses):
        raise ValueError(f"{where}: {len(prompts)} prompts but {len(responses)} responses (one response per prompt)")
    if len(prompts) < 2:
        raise ValueError(f"{where}: needs at least 2 prompt/response pairs, got {len(prompts)}")
    if any(len(p) == 0 for p in prompts) or any(len(r) == 0 for r in responses):
        raise ValueError(f"{where}: empty prompt or response; drop those pairs first")
    if len({tuple(p) for p in prompts}) != len(prompts):
        raise ValueError(f"{where}: prompts must be distinct (one response per task); see distinct_prompt_pairs")


def cross_logprob_matrix(
    model: nn.Module,
    prompts: Sequence[Sequence[int]],
    responses: Sequence[Sequence[int]],
    *,
    batch_size: int,
    pad_id: int,
    temperature: float = 1.0,
    chunk_size: int = DEFAULT_CHUNK,
) -> torch.Tensor:
    """S (N, N) float32 on CPU, S[a, j] = sum_t log p(z_a,t | x_j, z_a,<t) / len(z_a).

    The N^2 sequences concat(x_j, z_a) run `batch_size` at a time, right-padded with `pad_id`
    under an attention mask, in order of length. Only response positions
    go through the lm_head and log-softmax (`harness.model.logprobs`, `chunk_size` rows at a time), so
    no (batch, T, V) float32 tensor is built. No gradients; the model's train/eval mode is restored.
    """
    _validate(prompts, responses)
    N = len(prompts)
    device = next(model.parameters()).device
    pairs = sorted(
        ((a, j) for a in range(N) for j in range(N)), key=lambda p: len(prompts[p[1]]) + len(responses[p[0]])
    )  # by length: little padding
    S = torch.empty(N, N, dtype=torch.float32)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            for s in range(0, len(pairs), batch_size):
                chunk = pairs[s : s + batch_size]
                seqs = [(list(prompts[j]), list(responses[a])) for a, j in chunk]
                T = max(len(x) + len(z) for x, z in seqs)
                ids = torch.full((len(seqs), T), pad_id, dtype=torch.long)  # (B, T)
                attn = torch.zeros(len(seqs), T, dtype=torch.long)  # (B, T)
                resp = torch.zeros(len(seqs), T, dtype=torch.long)  # (B, T) 1 on response tokens
                for b, (x, z) in enumerate(seqs):
                    ids[b, : len(x) + len(z)] = torch.tensor(x + z)
                    attn[b, : len(x) + len(z)] = 1
                    resp[b, len(x) : len(x) + len(z)] = 1
                lp, _ = token_logprobs(
                    model,
                    ids.to(device),
                    attn.to(device),
                    temperature=temperature,
                    chunk_size=chunk_size,
                    token_mask=resp.to(device),
                )  # (B, T)
                scores = (lp.float().sum(1).cpu() / resp.sum(1)).tolist()  # (B,)
                for (a, j), v in zip(chunk, scores):
                    S[a, j] = v
    finally:
        model.train(was_training)
    return S


def mi_proxy(
    model: nn.Module,
    prompts: Sequence[Sequence[int]],
    responses: Sequence[Sequence[int]],
    *,
    batch_size: int,
    pad_id: int,
    temperature: float = 1.0,
    k: Sequence[int] = (1, 5),
    chunk_size: int = DEFAULT_CHUNK,
) -> dict[str, float]:
    """The MI proxy of `model` on N distinct prompts (token id lists) and their own responses.

    responses[a] answered prompts[a]. See `cross_logprob_matrix` (batching, memory) and
    `mi_from_scores` (the metrics and their keys). `temperature`: the sampler's, so scores use
    the distribution the responses were drawn from.
    """
    S = cross_logprob_matrix(
        model, prompts, responses, batch_size=batch_size, pad_id=pad_id, temperature=temperature, chunk_size=chunk_size
    )
    return mi_from_scores(S, k)


def distinct_prompt_pairs(
    prompts: Sequence[Sequence[int]], responses: Sequence[Sequence[int]], max_n: int
) -> tuple[list[list[int]], list[list[int]]]:
    """The first non-empty response of each distinct prompt, at most `max_n` pairs, in order.

    A GRPO batch holds G responses per prompt; the MI proxy wants one per distinct prompt.
    """
    seen: set[tuple[int, ...]] = set()
    xs: list[list[int]] = []
    zs: list[list[int]] = []
    for x, z in zip(prompts, responses):
        key = tuple(x)
        if key in seen or not x or not z:
            continue
        seen.add(key)
        xs.append(list(x))
        zs.append(list(z))
        if len(xs) == max_n:
            break
    return xs, zs
