"""Per-token log-probs (and entropies) without a full-vocabulary float32 log-softmax.

The naive way, `model(ids).logits.float().log_softmax(-1).gather(...)`, holds several (B, T, V)
float32 tensors at once (logits, their float copy, the log-softmax and, in backward, its
gradient): 63 GiB for a 0.5B model at 8 x 2048 tokens on a GPU. Here the backbone gives hidden
states (B, T, H); only the positions that are asked for are gathered into (N, H) rows, and the
lm_head + log-softmax run on `chunk_size` rows at a time through a fused autograd function that
keeps no logits for backward (it recomputes them per chunk and writes the gradient over them in
place), so at most two (chunk, V) float32 blocks are alive at any time, forward or backward.
A head that is not a plain nn.Linear (e.g. LoRA on lm_head) falls back to activation
checkpointing per chunk.

Convention (verl): logits are divided by `temperature` before the log-softmax, the same
tempered distribution the sampler draws from. With constrained decoding (`rollout.constrain`)
the sampler draws from that distribution restricted to the admissible continuations and
renormalised; `allowed` (B, T, K) lists those token ids per position (-1 padding; a row of -1
= unconstrained), and the log-softmax, its entropy and gradient are then taken over that set
only, so the trainer's log-probs are those of the policy that acted. A token that was the only
admissible continuation has log-prob 0 and no gradient. `logp[:, t] = log p(ids[:, t] | ids[:, <t])`;
position 0, padding and positions not asked for are 0. Position ids are derived from the
attention mask, so left- and right-padded batches give the same values.
"""

from __future__ import annotations

from functools import partial

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from harness.model.prefix_cache import kv_cache_hidden_states
from harness.model.segmented import Segments, segmented_decoder_call

DEFAULT_CHUNK = 1024  # rows of (chunk, V) float32 logits: 0.6 GB for Qwen's 152k vocabulary
# Disallowed logits are set to this finite value rather than -inf, so that p * logit stays 0
# (not nan) in the entropy and in the fused backward; exp(NEG - lse) underflows to exactly 0.
NEG = -1.0e30


def restrict_(logits: torch.Tensor, allowed: torch.Tensor | None) -> torch.Tensor:
    """In place: logits (n, V) float32 outside each row's allowed ids (n, K; -1 padding) -> NEG.
    Rows whose ids are all -1 are left unconstrained."""
    if allowed is None:
        return logits
    constrained = allowed[:, 0] >= 0  # (n,)
    if not bool(constrained.any()):
        return logits
    idx = torch.where(allowed >= 0, allowed, allowed[:, :1].clamp(min=0))  # pad -> an allowed id
    keep = torch.zeros(logits.shape, dtype=torch.bool, device=logits.device).scatter_(1, idx, True)
    keep |= ~constrained[:, None]
    return logits.masked_fill_(~keep, NEG)


def backbone_and_head(model: nn.Module) -> tuple[nn.Module, nn.Module]:
    """(decoder stack, lm_head) of a causal LM, PEFT-wrapped or not (LoRA layers stay active)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return base.get_decoder(), base.get_output_embeddings()


def position_ids(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions counted over attended tokens only (left padding safe). (B, T)"""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def hidden_states(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    prefix: tuple[torch.Tensor, str] | None = None,
) -> torch.Tensor:
    """Last hidden states of the backbone, (B, T, H). Shared by log-probs and the value head.
    prefix (keys (B,), impl), optional: rows with the same key run their common prefix once, computed as
    `impl` (a key of `PREFIX_IMPLS` or `PADDING_FREE_LAYOUTS`) says (`shared_prefix_hidden_states`; the
    padding-free layouts pack the clusters end to end in one row, a row with a key of its own being a sequence
    alone); None: every row in full."""
    if prefix is not None:
        return shared_prefix_hidden_states(model, input_ids, attention_mask, *prefix)
    decoder, _ = backbone_and_head(model)
    out = decoder(
        input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids(attention_mask), use_cache=False
    )
    return out.last_hidden_state


def common_prefix(ids: torch.Tensor, lengths: torch.Tensor) -> int:
    """Length of the longest prefix that the right-padded rows `ids` (n, T) share, within every row's length."""
    n_min = int(lengths.min())
    same = (ids[:, :n_min] == ids[:1, :n_min]).all(0)  # (n_min,)
    return n_min if bool(same.all()) else int((~same).nonzero()[0])


def _pack(ids: torch.Tensor, lengths: torch.Tensor, rows: list[int], P: int):
    """One packed row for `rows` and their common prefix length P: the prefix once, then each row's rest.
    Returns the packed ids (Lp,), positions (Lp,), member of each packed token (-1: the prefix) and, per
    row, the packed index of each of its positions (L_r,)."""
    toks, pos, member, where = [ids[rows[0], :P]], [torch.arange(P)], [torch.full((P,), -1)], []
    at = P
    for i, r in enumerate(rows):
        n = int(lengths[r])
        toks.append(ids[r, P:n])
        pos.append(torch.arange(P, n))
        member.append(torch.full((n - P,), i))
        where.append(torch.cat([torch.arange(P), torch.arange(at, at + n - P)]))
        at += n - P
    return torch.cat(toks), torch.cat(pos), torch.cat(member), where


def shared_prefix_hidden_states(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    prefix_keys: torch.Tensor,
    impl: str,
) -> torch.Tensor:
    """`hidden_states` with the common prefix of rows that share a key computed once (docs/trainer.md#shared-prefix).

    The rows of one key (the members of a GRPO group: system prompt, instructions, first observation) form a
    cluster; `impl` (train.learner.prefix_impl) says how its prefix is shared: packed (`_packed_hidden_states`,
    Prefix Grouper's packed sequence), segmented (the same sequence, attention per segment) or kv_cache
    (`harness.model.prefix_cache`); the padding-free layouts (`PADDING_FREE_LAYOUTS`) put every cluster of the
    call end to end in one segmented row (train.learner.padding_free). Either way every row's
    hidden states come back as (B, T, H), so log-probs, values and their gradients read them as from the
    plain pass (the prefix's gradient sums over the rows that share it), equal to it up to float rounding.
    Rows are right-padded (the batch layout); positions past a row's length get a placeholder hidden state
    and are masked by every caller."""
    decoder, _ = backbone_and_head(model)
    attn = getattr(decoder.config, "_attn_implementation", None)
    if attn not in ("sdpa", "eager", None):  # flash kernels take no arbitrary mask: rows would see each other
        raise ValueError(
            f"train.learner.shared_prefix needs an attention that takes a 4D mask (sdpa or eager), not {attn!r}"
        )
    if impl not in PREFIX_IMPLS and impl not in PADDING_FREE_LAYOUTS:
        raise ValueError(f"train.learner.prefix_impl must be one of {sorted(PREFIX_IMPLS)}, not {impl!r}")
    ids, lengths = input_ids.cpu(), attention_mask.sum(1).cpu()
    if not bool((attention_mask.cpu().bool() == (torch.arange(ids.shape[1])[None] < lengths[:, None])).all()):
        raise ValueError("shared_prefix_hidden_states needs right-padded rows")
    keys = prefix_keys.cpu().tolist()
    rows_of: dict[int, list[int]] = {}
    for r, k in enumerate(keys):
        rows_of.setdefault(k, []).append(r)
    clusters = [(rows, common_prefix(ids[rows], lengths[rows])) for rows in rows_of.values()]
    return (PREFIX_IMPLS.get(impl) or PADDING_FREE_LAYOUTS[impl])(decoder, input_ids, lengths, clusters)


def _packed_layout(
    ids: torch.Tensor, lengths: torch.Tensor, clusters: list[tuple[list[int], int]], one_row: bool = False
):
    """Prefix Grouper's packed rows, one per cluster (its rows, their common prefix length): [prefix, rest of
    row 1, rest of row 2, ...], right-padded to the longest; `one_row` (the padding-free layout): every cluster
    end to end in a single packed row, nothing padded. Returns, on the CPU, the packed ids and positions
    (Bp, Lp), each packed token's member (Bp, Lp; -1 the prefix, -2 padding; meaningful for one cluster per
    row only), each row's source of its positions in the packed rows (src_row, src_pos: (B, T)) and, per
    packed row, its clusters as `harness.model.segmented.Segments` lists them: (start, prefix length, the
    [start, end) spans of its rests). Positions past a row's length point at its first token."""
    packs = [_pack(ids, lengths, rows, P) for rows, P in clusters]
    sizes = [len(p[0]) for p in packs]
    if one_row:
        place = [(0, sum(sizes[:c])) for c in range(len(packs))]  # (packed row, offset) of each cluster
        Bp, Lp = 1, sum(sizes)
    else:
        place = [(c, 0) for c in range(len(packs))]
        Bp, Lp = len(packs), max(sizes)
    T = ids.shape[1]
    pid = torch.zeros(Bp, Lp, dtype=ids.dtype)
    ppos = torch.zeros(Bp, Lp, dtype=torch.long)
    member = torch.full((Bp, Lp), -2)  # -2: padding, which sees only itself
    src_row, src_pos = torch.zeros(ids.shape[0], T, dtype=torch.long), torch.zeros(ids.shape[0], T, dtype=torch.long)
    spans: list[list[tuple[int, int, list[tuple[int, int]]]]] = [[] for _ in range(Bp)]
    for (tok, pos, mem, where), (rows, P), (b, off) in zip(packs, clusters, place):
        n = len(tok)
        pid[b, off : off + n], ppos[b, off : off + n], member[b, off : off + n] = tok, pos, mem
        at, own = off + P, []
        for r, w in zip(rows, where):
            src_row[r] = b
            src_pos[r, : len(w)] = w + off
            own.append((at, at + len(w) - P))
            at += len(w) - P
        spans[b].append((off, P, own))
    return pid, ppos, member, src_row, src_pos, spans


def _packed_hidden_states(
    decoder: nn.Module, input_ids: torch.Tensor, lengths: torch.Tensor, clusters: list[tuple[list[int], int]]
) -> torch.Tensor:
    """train.learner.prefix_impl packed: the rows of each cluster (its rows, their common prefix length) are
    packed into one sequence, [prefix, rest of row 1, rest of row 2, ...], with a block attention mask (a
    row's tokens see the prefix and their own earlier tokens, nothing of the other rows) and each row's own
    position ids, as Prefix Grouper (Liu et al. 2025) does; every row's hidden states are then gathered back
    into (B, T, H). Positions past a row's length get the hidden state of its first token."""
    dev = input_ids.device
    pid, ppos, member, src_row, src_pos, _ = _packed_layout(input_ids.cpu(), lengths, clusters)
    Lp = pid.shape[1]
    q, k = torch.arange(Lp)[:, None], torch.arange(Lp)[None, :]
    mq, mk = member[:, :, None], member[:, None, :]  # (Bp, Lp, 1), (Bp, 1, Lp)
    see = ((k <= q) & ((mk == -1) | (mk == mq)) & (mk != -2)) | ((q == k) & (mq == -2))  # (Bp, Lp, Lp)
    dtype = next(decoder.parameters()).dtype
    mask = torch.zeros(pid.shape[0], 1, Lp, Lp, dtype=dtype).masked_fill_(~see[:, None], torch.finfo(dtype).min)
    out = decoder(input_ids=pid.to(dev), attention_mask=mask.to(dev), position_ids=ppos.to(dev), use_cache=False)
    return out.last_hidden_state[src_row.to(dev), src_pos.to(dev)]  # (B, T, H)


def _segmented_hidden_states(
    decoder: nn.Module,
    input_ids: torch.Tensor,
    lengths: torch.Tensor,
    clusters: list[tuple[list[int], int]],
    one_row: bool = False,
) -> torch.Tensor:
    """train.learner.prefix_impl segmented: the packed path's rows, positions and gather, with each layer's
    attention computed per segment instead of under the dense block mask (`harness.model.segmented`).
    one_row (train.learner.padding_free): all clusters end to end in one packed row, nothing padded."""
    dev = input_ids.device
    pid, ppos, _, src_row, src_pos, spans = _packed_layout(input_ids.cpu(), lengths, clusters, one_row)
    h = segmented_decoder_call(decoder, pid.to(dev), ppos.to(dev), Segments(spans))
    return h[src_row.to(dev), src_pos.to(dev)]  # (B, T, H)


# train.learner.prefix_impl -> (decoder, input_ids (B, T), lengths (B,) on the CPU, clusters) -> (B, T, H)
PREFIX_IMPLS = {
    "packed": _packed_hidden_states,
    "segmented": _segmented_hidden_states,
    "kv_cache": kv_cache_hidden_states,
}
# train.learner.padding_free: a micro-batch's clusters end to end in one packed row under the segmented attention;
# PADDING_FREE with every row its own cluster (no shared prefix), SEGMENTED_PADDING_FREE with a group's rows
# sharing their prefix (prefix_impl segmented). The update plan's `prefix` names one of these or of PREFIX_IMPLS.
PADDING_FREE, SEGMENTED_PADDING_FREE = "padding_free", "segmented_padding_free"
PADDING_FREE_LAYOUTS = {
    PADDING_FREE: partial(_segmented_hidden_states, one_row=True),
    SEGMENTED_PADDING_FREE: partial(_segmented_hidden_states, one_row=True),
}


class _LinearLogprob(torch.autograd.Function):
    """lm_head + tempered log-softmax + gather (+ entropy) on one chunk of rows, fused.

    Saves only the inputs and two numbers per row; backward recomputes the logits and writes
    the gradient over them in place, so at most two (n, V) float32 blocks exist at once.
    Under autocast (train.learner.precision) backward recomputes the logits in the forward's autocast
    state, as torch.amp.custom_bwd does, so they match the ones `lse` was taken from.
    """

    @staticmethod
    def forward(ctx, h, weight, bias, targets, temperature, with_entropy, allowed):
        dev = h.device.type
        ctx.autocast = torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else None
        logits = restrict_(_linear_logits(h, weight, bias, temperature), allowed)  # (n, V) float32
        lse = torch.logsumexp(logits, dim=-1)  # (n,)
        logp = logits.gather(-1, targets[:, None]).squeeze(-1) - lse
        ent = torch.zeros_like(logp)
        if with_entropy:
            p = torch.exp(logits - lse[:, None])  # (n, V)
            ent = lse - torch.linalg.vecdot(p, logits)
        ctx.save_for_backward(h, weight, bias, targets, lse, ent, allowed)
        ctx.temperature, ctx.with_entropy = temperature, with_entropy
        return logp, ent

    @staticmethod
    def backward(ctx, g_logp, g_ent):
        if ctx.autocast is None:
            return _LinearLogprob._backward(ctx, g_logp, g_ent)
        h = ctx.saved_tensors[0]
        with torch.autocast(h.device.type, dtype=ctx.autocast):
            g_h, g_w, g_b, *rest = _LinearLogprob._backward(ctx, g_logp, g_ent)
        weight = ctx.saved_tensors[1]  # gradients in the dtypes of their inputs (float32 master weights)
        g_h = g_h.to(h.dtype) if g_h is not None else None
        g_w = g_w.to(weight.dtype) if g_w is not None else None
        g_b = g_b.to(weight.dtype) if g_b is not None else None
        return g_h, g_w, g_b, *rest

    @staticmethod
    def _backward(ctx, g_logp, g_ent):
        h, weight, bias, targets, lse, ent, allowed = ctx.saved_tensors
        logq = restrict_(_linear_logits(h, weight, bias, ctx.temperature), allowed).sub_(lse[:, None])  # (n, V)
        grad = logq.exp()  # p, (n, V)
        if ctx.with_entropy:  # dH/dz = -p (log p + H)
            logq.add_(ent[:, None]).mul_(grad).mul_(-g_ent[:, None])
        grad.mul_(-g_logp[:, None])  # d logp_target / dz = onehot - p
        grad.scatter_add_(-1, targets[:, None], g_logp[:, None].to(grad.dtype))
        if ctx.with_entropy:
            grad.add_(logq)
        del logq
        grad = grad.div_(ctx.temperature).to(weight.dtype)  # (n, V)
        g_h = grad @ weight if ctx.needs_input_grad[0] else None  # (n, H)
        g_w = grad.t() @ h if ctx.needs_input_grad[1] else None  # (V, H)
        g_b = grad.sum(0) if bias is not None and ctx.needs_input_grad[2] else None
        return g_h, g_w, g_b, None, None, None, None


def _linear_logits(
    h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, temperature: float
) -> torch.Tensor:
    logits = (h @ weight.t() if bias is None else torch.addmm(bias, h, weight.t())).float()  # (n, V)
    return logits.div_(temperature) if temperature != 1.0 else logits


def _chunk_generic(
    head: nn.Module,
    h: torch.Tensor,
    targets: torch.Tensor,
    temperature: float,
    with_entropy: bool,
    allowed: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Any head module (e.g. a LoRA-wrapped lm_head); used under activation checkpointing."""
    logits = restrict_(head(h).float() / temperature, allowed)  # (n, V), a fresh tensor
    lse = torch.logsumexp(logits, dim=-1)
    logp = logits.gather(-1, targets[:, None]).squeeze(-1) - lse
    if not with_entropy:
        return logp, torch.zeros_like(logp)
    return logp, lse - torch.linalg.vecdot(torch.exp(logits - lse[:, None]), logits)


def _chunk_logprobs(
    head: nn.Module,
    h: torch.Tensor,
    targets: torch.Tensor,
    temperature: float,
    with_entropy: bool,
    allowed: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    if type(head) is nn.Linear:
        return _LinearLogprob.apply(h, head.weight, head.bias, targets, temperature, with_entropy, allowed)
    if torch.is_grad_enabled() and h.requires_grad:
        return checkpoint(_chunk_generic, head, h, targets, temperature, with_entropy, allowed, use_reentrant=False)
    return _chunk_generic(head, h, targets, temperature, with_entropy, allowed)


def logprobs_from_hidden(
    model: nn.Module,
    hidden: torch.Tensor,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    *,
    temperature: float = 1.0,
    chunk_size: int = DEFAULT_CHUNK,
    with_entropy: bool = False,
    token_mask: torch.Tensor | None = None,
    allowed: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Chunked lm_head + log-softmax on given hidden states. See `token_logprobs`."""
    _, head = backbone_and_head(model)
    B, T = input_ids.shape
    want = attention_mask[:, 1:].bool() & attention_mask[:, :-1].bool()  # (B, T-1) target t+1 from state t
    if token_mask is not None:
        want = want & token_mask[:, 1:].bool()
    h = hidden[:, :-1][want]  # (N, H)
    targets = input_ids[:, 1:][want]  # (N,)
    allow = allowed[:, 1:][want] if allowed is not None else None  # (N, K)
    lps, ents = [], []
    for s in range(0, h.shape[0], chunk_size):
        lp, ent = _chunk_logprobs(
            head,
            h[s : s + chunk_size],
            targets[s : s + chunk_size],
            temperature,
            with_entropy,
            allow[s : s + chunk_size] if allow is not None else None,
        )
        lps.append(lp)
        ents.append(ent)
    zeros = torch.zeros(B, T - 1, dtype=torch.float32, device=hidden.device)
    pad = torch.zeros(B, 1, dtype=torch.float32, device=hidden.device)

    def scatter(parts: list[torch.Tensor]) -> torch.Tensor:
        flat = torch.cat(parts) if parts else zeros.new_zeros(0)
        return torch.cat([pad, zeros.masked_scatter(want, flat)], dim=1)  # (B, T)

    return scatter(lps), (scatter(ents) if with_entropy else None)


def token_logprobs(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    *,
    temperature: float = 1.0,
    chunk_size: int = DEFAULT_CHUNK,
    with_entropy: bool = False,
    token_mask: torch.Tensor | None = None,
    allowed: torch.Tensor | None = None,
    prefix: tuple[torch.Tensor, str] | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs of `input_ids` under `model`, memory-bounded, differentiable.

    input_ids, attention_mask: (B, T). Returns `logp` (B, T) float32 with
    `logp[:, t] = log softmax(logits[:, t-1] / temperature)[input_ids[:, t]]`, and the full-vocabulary
    entropy of the same tempered distribution (B, T) when `with_entropy` (else None).
    `token_mask` (B, T), optional: compute only where it is 1 (e.g. action tokens); others are 0.
    `allowed` (B, T, K), optional: token ids position t could be drawn from (constrained decoding;
    -1 padding, all -1 = unconstrained); log-softmax and entropy are then over that set.
    `prefix` (keys (B,), impl), optional: rows with the same key run their common prefix once, as `impl`
    says (`hidden_states`).
    """
    hidden = hidden_states(model, input_ids, attention_mask, prefix)  # (B, T, H)
    return logprobs_from_hidden(
        model,
        hidden,
        input_ids,
        attention_mask,
        temperature=temperature,
        chunk_size=chunk_size,
        with_entropy=with_entropy,
        token_mask=token_mask,
        allowed=allowed,
    )


__all__ = [
    "restrict_",
    "token_logprobs",
    "logprobs_from_hidden",
    "hidden_states",
    "shared_prefix_hidden_states",
    "PREFIX_IMPLS",
    "PADDING_FREE_LAYOUTS",
    "PADDING_FREE",
    "SEGMENTED_PADDING_FREE",
    "common_prefix",
    "backbone_and_head",
    "position_ids",
    "DEFAULT_CHUNK",
    "NEG",
]
