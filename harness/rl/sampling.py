"""Token sampling for the rollout engine: temperature, top-p, greedy, constrained decoding.

Log-prob convention (verl): the recorded log-prob of a token is under the *tempered*
distribution `log_softmax(logits / T)`, the same quantity the trainer recomputes. Top-p only
decides which tokens may be drawn; it does not renormalise the recorded log-prob.

Constrained decoding (`rollout.constrain`): a row with a trie of admissible action token
sequences may only draw tokens that continue one of them. Its recorded log-prob is under the
constrained distribution (tempered logits with every disallowed token removed, renormalised),
which is the distribution the token was actually drawn from; the unconstrained tempered
log-prob is returned beside it so the trainer can use either as the behaviour log-prob.

Draws use inverse-CDF sampling with one uniform number per row from `generator`, so the same
generator state gives the same tokens, and a CPU generator can drive a model on any device.
`uniforms` (B,) replaces the generator's numbers: the rollout passes one stream per episode for
evaluation (common random numbers: an episode's tokens depend only on its own stream).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


class ActionTrie:
    """Prefix trie over token-id sequences (each admissible action's ids + end-of-turn)."""

    def __init__(self, sequences: list[list[int]]):
        self.root: dict[int, dict] = {}
        for seq in sequences:
            node = self.root
            for tok in seq:
                node = node.setdefault(tok, {})


@dataclass
class Draw:
    tokens: torch.Tensor  # (B,) long
    logprobs: torch.Tensor  # (B,) log-prob under the distribution drawn from (constrained if any)
    raw_logprobs: torch.Tensor  # (B,) log-prob under the unconstrained tempered distribution
    # (B,) entropy of the tempered distribution over the whole vocabulary, and of the distribution drawn
    # from (the admissible set's when constrained, else the same): what the trainer's behaviour pass
    # computes at this token, recorded so an update can take them from the sampler
    # (train.learner.behaviour: sampler, docs/trainer.md#update-plan); None unless asked for
    entropy: torch.Tensor | None = None
    entropy_constrained: torch.Tensor | None = None


def top_p_filter(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Zero all but the smallest set of most likely tokens whose mass reaches top_p. (B, V)."""
    sorted_p, order = probs.sort(dim=-1, descending=True)
    before = sorted_p.cumsum(-1) - sorted_p  # mass strictly before each token (B, V)
    sorted_p = sorted_p.masked_fill(before >= top_p * sorted_p.sum(-1, keepdim=True), 0.0)
    return torch.zeros_like(probs).scatter_(-1, order, sorted_p)


def inverse_cdf(probs: torch.Tensor, generator: torch.Generator | None, u: torch.Tensor | None = None) -> torch.Tensor:
    """One draw per row of unnormalised `probs` (B, V); zero-probability tokens are never drawn.
    u (B,) float64 in [0, 1): the uniform numbers to use instead of drawing them from `generator`."""
    if u is None:
        u = torch.rand(probs.shape[0], generator=generator, device=generator.device, dtype=torch.float64)
    u = u.to(probs.device)  # (B,)
    cdf = probs.double().cumsum(-1)  # (B, V)
    tok = torch.searchsorted(cdf, (u * cdf[:, -1]).unsqueeze(1), right=True).squeeze(1)
    tok = tok.clamp(max=probs.shape[1] - 1)
    ok = probs.gather(1, tok.unsqueeze(1)).squeeze(1) > 0  # rounding at the top edge
    return torch.where(ok, tok, probs.argmax(-1))


def draw(
    logits: torch.Tensor,
    *,
    temperature: float,
    top_p: float,
    greedy: bool,
    generator: torch.Generator | None,
    allowed: torch.Tensor | None = None,
    uniforms: torch.Tensor | None = None,
    with_entropy: bool = False,
) -> Draw:
    """Next tokens for a batch. logits (B, V); allowed (B, V) bool or None (no constraint).
    with_entropy: also the entropies (`Draw.entropy`), two more passes over the vocabulary a token."""
    scaled = logits.float() / temperature  # (B, V)
    raw_logp = scaled.log_softmax(-1)  # (B, V)
    logp = raw_logp
    if allowed is not None:
        logp = scaled.masked_fill(~allowed, float("-inf")).log_softmax(-1)
    if greedy:
        tok = logp.argmax(-1)
    else:
        probs = logp.exp()
        if top_p < 1.0:
            probs = top_p_filter(probs, top_p)
        tok = inverse_cdf(probs, generator, uniforms)
    idx = tok.unsqueeze(1)
    d = Draw(tok, logp.gather(1, idx).squeeze(1), raw_logp.gather(1, idx).squeeze(1))
    if with_entropy:
        d.entropy = _entropy(raw_logp)
        d.entropy_constrained = _entropy(logp) if allowed is not None else d.entropy
    return d


def _entropy(logp: torch.Tensor) -> torch.Tensor:
    """(B,) entropy of each row of log-probs (B, V); -inf entries (disallowed tokens) add nothing."""
    return -torch.where(logp > float("-inf"), logp.exp() * logp, torch.zeros((), dtype=logp.dtype)).sum(-1)


def allowed_mask(nodes: list[dict | None], vocab: int, device) -> torch.Tensor | None:
    """(B, V) bool: row b may emit the children of its trie node; None node = unconstrained."""
    if all(n is None for n in nodes):
        return None
    mask = torch.ones(len(nodes), vocab, dtype=torch.bool)
    for b, node in enumerate(nodes):
        if node is not None:
            mask[b] = False
            mask[b, list(node)] = True
    return mask.to(device)
