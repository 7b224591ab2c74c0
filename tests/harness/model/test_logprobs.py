"""Memory-bounded log-probs: equal to the naive full log-softmax, values and gradients; less memory."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import Qwen2Config, Qwen2ForCausalLM

from harness.bench.memory import measure_peak_bytes, naive_token_logprobs, peak_memory_ratio
from harness.model.logprobs import hidden_states, logprobs_from_hidden, token_logprobs


def _model(vocab=300, hidden=32, seed=0):
    torch.manual_seed(seed)
    cfg = Qwen2Config(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=True,
    )
    return Qwen2ForCausalLM(cfg).eval()


class WrappedHead(nn.Module):
    """An output layer that is not a plain nn.Linear: exercises the checkpointed fallback path."""

    def __init__(self, lin):
        super().__init__()
        self.lin = lin

    def forward(self, h):
        return self.lin(h)


def _batch(vocab=300, B=3, T=40, seed=1):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (B, T), generator=g)
    mask = torch.ones(B, T, dtype=torch.long)
    mask[1, 30:] = 0  # right padding
    mask[2, :7] = 0  # left padding
    return ids, mask


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_values_equal_naive(temperature):
    model, (ids, mask) = _model(), _batch()
    with torch.no_grad():
        lp, ent = token_logprobs(model, ids, mask, temperature=temperature, chunk_size=7, with_entropy=True)
        lp0, ent0 = naive_token_logprobs(model, ids, mask, temperature=temperature, with_entropy=True)
    assert lp.shape == ids.shape and lp.dtype == torch.float32
    torch.testing.assert_close(lp, lp0, atol=1e-5, rtol=0)
    torch.testing.assert_close(ent, ent0, atol=1e-5, rtol=0)
    assert (lp[:, 0] == 0).all() and (lp[1, 30:] == 0).all() and (lp[2, :8] == 0).all()
    assert (lp[mask.bool()][1:] < 0).any()


def test_gradients_equal_naive_into_lora():
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(_model(), LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "up_proj"]))
    for n, p in model.named_parameters():  # B = 0 at init would make LoRA-A gradients vanish
        if "lora_B" in n:
            nn.init.normal_(p, std=0.1)
    ids, mask = _batch()
    w = torch.randn(ids.shape, generator=torch.Generator().manual_seed(3))

    def grads(fn, **kw):
        model.zero_grad()
        lp, ent = fn(model, ids, mask, temperature=0.8, with_entropy=True, **kw)
        ((lp * w).sum() + (ent * w.flip(0)).sum()).backward()
        return {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}

    g1, g0 = grads(token_logprobs, chunk_size=5), grads(naive_token_logprobs)
    assert g1 and all("lora_" in n for n in g1)
    for n in g0:
        torch.testing.assert_close(g1[n], g0[n], atol=1e-5, rtol=1e-4)
    assert any(g.abs().sum() > 0 for n, g in g1.items() if "lora_A" in n)


def test_full_finetune_gradients_reach_tied_head():
    model, (ids, mask) = _model(), _batch()
    model.zero_grad()
    token_logprobs(model, ids, mask, chunk_size=9)[0].sum().backward()
    g1 = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    naive_token_logprobs(model, ids, mask)[0].sum().backward()
    for n, p in model.named_parameters():
        torch.testing.assert_close(g1[n], p.grad, atol=1e-5, rtol=1e-4)


def test_token_mask_and_generic_head():
    model, (ids, mask) = _model(), _batch()
    tmask = torch.zeros_like(mask)
    tmask[:, 20:25] = 1
    with torch.no_grad():
        lp, _ = token_logprobs(model, ids, mask, token_mask=tmask)
        lp0, _ = naive_token_logprobs(model, ids, mask)
    torch.testing.assert_close(lp, lp0 * tmask, atol=1e-5, rtol=0)

    model.lm_head = WrappedHead(model.lm_head)
    hid = hidden_states(model, ids, mask).detach().requires_grad_(True)
    lp2, ent2 = logprobs_from_hidden(model, hid, ids, mask, chunk_size=4, with_entropy=True)
    lp2.sum().backward()
    torch.testing.assert_close(lp2.detach(), lp0, atol=1e-5, rtol=0)
    assert hid.grad is not None and hid.grad.abs().sum() > 0


class _LargestOutput(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        return out


def test_no_full_vocab_tensor_is_materialized():
    """The largest tensor made in forward + backward is one (chunk, V) block, not (B, T, V)."""
    V, chunk = 1000, 8
    model, (ids, mask) = _model(vocab=V), _batch(vocab=V, B=3, T=40)
    hid = hidden_states(model, ids, mask).detach().requires_grad_(True)
    with _LargestOutput() as spy:
        lp, ent = logprobs_from_hidden(model, hid, ids, mask, chunk_size=chunk, with_entropy=True)
        (lp.sum() + ent.sum()).backward()
    assert spy.largest <= max(chunk * V, model.lm_head.weight.numel())  # a chunk, or the head's gradient
    assert chunk * V < ids.numel() * V // 10
    with _LargestOutput() as spy:
        naive_token_logprobs(model, ids, mask)[0].sum().backward()
    assert spy.largest >= ids.numel() * V


def test_measured_peak_memory_is_lower():
    """Resident-memory high-water mark (CPU): chunked well below the naive log-softmax."""
    V = 8192
    model, (ids, mask) = _model(vocab=V, hidden=64), _batch(vocab=V, B=4, T=256)
    r = peak_memory_ratio(model, ids, mask, chunk_size=256, backward=True)
    assert r["isolated"]  # each side in a fresh process: what ran before in this one cannot move it
    assert r["naive_bytes"] > 4 * ids.numel() * V  # at least the float32 (B, T, V) log-softmax
    assert r["ratio"] < 0.4, r
    assert measure_peak_bytes(lambda: torch.ones(1 << 22)) >= (1 << 24) * 0.9  # the probe sees 16 MB


def _allowed(ids, seed=5, vocab=300, K=6):
    """(B, T, K) allowed sets: the target id plus random others; one-token sets (forced tokens),
    unconstrained rows (all -1) and sets padded with -1 mixed in."""
    g = torch.Generator().manual_seed(seed)
    B, T = ids.shape
    al = torch.randint(0, vocab, (B, T, K), generator=g)
    al[..., 0] = ids  # the drawn token is always allowed
    al[:, 3:6, 1:] = -1  # forced: only one admissible continuation
    al[:, 8:12, 3:] = -1  # short sets, padded
    al[0, 15:25] = -1  # unconstrained positions
    return al


@pytest.mark.parametrize("generic_head", [False, True])
def test_constrained_values_and_gradients_equal_naive(generic_head):
    """Constrained decoding: log-softmax, entropy and their gradients over the allowed set only,
    on the fused path and on the checkpointed generic-head path."""
    model, (ids, mask) = _model(), _batch()
    if generic_head:
        model.lm_head = WrappedHead(model.lm_head)
    al = _allowed(ids)
    w = torch.randn(ids.shape, generator=torch.Generator().manual_seed(3))
    hid0 = hidden_states(model, ids, mask).detach()

    def run(fn):
        hid = hid0.clone().requires_grad_(True)
        lp, ent = fn(hid)
        ((lp * w).sum() + (ent * w.flip(0)).sum()).backward()
        return lp.detach(), ent.detach(), hid.grad

    def naive(hid):
        _, head = (model.model, model.lm_head)
        logits = (head(hid).float() / 0.8)[:, :-1]
        keep = torch.zeros(logits.shape, dtype=torch.bool)
        for b, t, k in (al[:, 1:] >= 0).nonzero().tolist():
            keep[b, t, al[b, t + 1, k]] = True
        keep |= ~(al[:, 1:, 0] >= 0)[..., None]
        logsm = logits.masked_fill(~keep, float("-inf")).log_softmax(-1)
        valid = (mask[:, 1:] * mask[:, :-1]).float()
        lp = logsm.gather(-1, ids[:, 1:, None]).squeeze(-1) * valid
        ent = -(logsm.exp() * logsm.clamp(min=-1e30)).sum(-1) * valid
        pad = lp.new_zeros(lp.shape[0], 1)
        return torch.cat([pad, lp], 1), torch.cat([pad, ent], 1)

    lp, ent, g = run(
        lambda h: logprobs_from_hidden(
            model, h, ids, mask, temperature=0.8, chunk_size=7, with_entropy=True, allowed=al
        )
    )
    lp0, ent0, g0 = run(naive)
    torch.testing.assert_close(lp, lp0, atol=1e-5, rtol=0)
    torch.testing.assert_close(ent, ent0, atol=1e-5, rtol=0)
    torch.testing.assert_close(g, g0, atol=1e-5, rtol=1e-4)
    assert torch.isfinite(g).all()
    forced = mask[:, 3:6].bool()
    assert (lp[:, 3:6][forced] == 0).all() and (ent[:, 3:6][forced] == 0).all()  # forced: no choice
    free, _ = token_logprobs(model, ids, mask, temperature=0.8)
    assert (lp[mask.bool()] >= free.detach()[mask.bool()] - 1e-6).all()  # renormalising never lowers p
    torch.testing.assert_close(lp[0, 16:25], free.detach()[0, 16:25], atol=1e-5, rtol=0)  # unconstrained rows
    # the whole-model reference agrees too
    with torch.no_grad():
        lp_n, ent_n = naive_token_logprobs(model, ids, mask, temperature=0.8, with_entropy=True, allowed=al)
    torch.testing.assert_close(lp, lp_n, atol=1e-5, rtol=0)
    torch.testing.assert_close(ent, ent_n, atol=1e-5, rtol=0)
