"""On-policy distillation, with hindsight hints or without (`algo.distill`; docs/algorithms.md#distillation).

For every action token of a trained turn, the teacher's log-prob of the sampled token is taken with
the judge's hint about that step added to the teacher's context (hindsight: the judge read the next
state), or with the plain context (`hint: none`). The distillation advantage is
`teacher_logp - old_logp` (the behaviour policy's), detached, added to the RL advantage with the
weights (rl_coef, coef) after the RL advantage's normalisation, and used inside the same PPO
surrogate (OpenClaw-RL `openclaw-combine`: weights 1 and 1, neither normalised nor clipped). Turns
without a usable hint leave the term (their tokens keep the RL advantage only).

The hint goes inside the turn's last user message, just before its end: the context's ids are kept
as they were and only `"\nHint: " + hint` is inserted before the closing `<|im_end|>\n<|im_start|>assistant\n`.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass

import torch

from harness.config.schema import RunConfig
from harness.model.logprobs import token_logprobs
from harness.rl.batch import episode_stream, row_groups
from harness.transcript.chat import IM_END, IM_START
from harness.transcript.records import Episode

HINT_PREFIX = "\nHint: "


@dataclass
class TeacherStream:
    """Stream-form (N, Ts) tensors, trajectory order as the batch: the teacher's log-probs of the
    distilled action tokens and the mask of those tokens."""

    logp: torch.Tensor
    mask: torch.Tensor

    @property
    def turns(self) -> int:
        return int(self.mask.sum().item())


def hinted_context(chat, ctx: list[int], hint: str) -> list[int] | None:
    """`ctx` with the hint inserted before the closing assistant header, or None when `ctx` does not
    end with that header (e.g. a truncated context)."""
    tail = chat.encode(f"{IM_END}\n{IM_START}assistant\n")
    if len(ctx) < len(tail) or ctx[-len(tail) :] != tail:
        return None
    return ctx[: -len(tail)] + chat.encode(HINT_PREFIX + hint) + tail


def teacher_rows(chat, episodes: list[Episode], hindsight: bool) -> tuple[list[list[int]], list[tuple[int, int, int]]]:
    """The teacher's rows (context [+ hint] + the sampled action) and, for each, (trajectory, stream
    position of the action's first token, number of action tokens)."""
    rows, where = [], []
    for i, ep in enumerate(episodes):
        s = episode_stream(ep)
        for t, st in enumerate(ep.steps):
            ctx = st.context_ids if st.context_ids is not None else s.ids[: s.action_start[t]]
            if hindsight:
                hint = (st.judge or {}).get("hint")
                ctx = hinted_context(chat, ctx, hint) if hint else None
                if ctx is None:
                    continue
            rows.append(list(ctx) + list(st.action_ids))
            where.append((i, s.action_start[t], len(st.action_ids)))
    return rows, where


@torch.no_grad()
def teacher_stream(
    frozen: Callable[[], AbstractContextManager],
    chat,
    episodes: list[Episode],
    cfg: RunConfig,
    stream_len: int,
) -> TeacherStream:
    """Teacher log-probs on the stream (N, stream_len) of `episodes`."""
    rows, where = teacher_rows(chat, episodes, cfg.algo.distill.hint == "hindsight")
    logp = torch.zeros(len(episodes), stream_len)
    mask = torch.zeros(len(episodes), stream_len)
    if not rows:
        return TeacherStream(logp, mask)
    a = cfg.algo
    lengths = [len(r) for r in rows]
    groups = row_groups(lengths, a.micro_batch_size, a.micro_batch_tokens)
    with frozen() as model:
        was_training = model.training
        model.eval()
        dev = next(model.parameters()).device
        for g in groups:
            L = max(lengths[k] for k in g)
            ids = torch.full((len(g), L), chat.pad_id, dtype=torch.long)
            att = torch.zeros(len(g), L, dtype=torch.long)
            for r, k in enumerate(g):
                ids[r, : lengths[k]] = torch.tensor(rows[k])
                att[r, : lengths[k]] = 1
            lp, _ = token_logprobs(model, ids.to(dev), att.to(dev), temperature=cfg.rollout.temperature)
            lp = lp.float().cpu()
            for r, k in enumerate(g):
                i, start, n = where[k]
                logp[i, start : start + n] = lp[r, lengths[k] - n : lengths[k]]
                mask[i, start : start + n] = 1.0
        model.train(was_training)
    return TeacherStream(logp, mask)


def teacher_model(cfg: RunConfig, policy, judge) -> Callable[[], AbstractContextManager]:
    """The teacher `algo.distill.teacher` names, as a context manager yielding a frozen model."""
    t = cfg.algo.distill.teacher
    if t == "policy":

        @contextmanager
        def live():
            with torch.no_grad():
                yield policy.model

        return live
    if t == "judge" and getattr(judge, "own_model", False):
        return judge.frozen
    return policy.reference


def distill_gap(batch, old_logp: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(gap, mask) on the rows (B, T): teacher - behaviour log-prob on the distilled action tokens."""
    mask = batch.to_rows(batch.distill_mask) * batch.action_mask
    gap = (batch.to_rows(batch.teacher_logp) - old_logp) * mask
    return gap.detach(), mask
