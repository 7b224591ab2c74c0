"""Supervised training on expert demonstrations, shared by the tiny model's pre-training
(`harness.model.tiny`) and the SFT warm-up (`harness.model.sft`).

A demonstration is laid out exactly as the rollout lays out an episode in the concatenated
layout (`harness.transcript.chat` segments, each tokenized once):

    prompt(instructions, obs_1) | action_1 | observation(obs_2) | action_2 | ...

and the loss is on the action segments only: the action text ids plus the end-of-turn id,
exactly the tokens RL samples. Batches group sequences of similar length (little padding);
the loss is the mean over the batch's action tokens, computed through the memory-bounded
log-prob path (`harness.model.logprobs`), so only action positions reach the lm_head.

Deterministic on CPU: the shuffling uses its own generator seeded by `seed`.

The demonstrations come from above: the layer that plays environments (harness.rl.demos) hands
model/ a `DemoSource`, so nothing here imports an environment.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import torch
from torch import nn

from harness.model.logprobs import hidden_states, logprobs_from_hidden
from harness.transcript.chat import ChatFormat
from harness.transcript.context import APPEND_ONLY, build_context, shown_observation, system_ids


@dataclass
class Demo:
    """One expert episode as text: observations[t] is what the expert saw before actions[t]."""

    instructions: str
    observations: list[str]
    actions: list[str]
    final_observation: str = ""
    seed: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def to_demo(ep: Any) -> Demo:
    """A `Demo` from an `envs.demos.Episode` (turns), a `harness.transcript.records.Episode` (steps) or a Demo."""
    if isinstance(ep, Demo):
        return ep
    if hasattr(ep, "turns"):
        return Demo(
            ep.instructions,
            [t.observation for t in ep.turns],
            [t.action for t in ep.turns],
            getattr(ep, "final_observation", ""),
            getattr(ep, "seed", None),
        )
    if hasattr(ep, "steps"):
        return Demo(
            ep.instructions,
            [s.observation for s in ep.steps],
            [s.action_text for s in ep.steps],
            "",
            getattr(ep, "task_seed", None),
        )
    raise TypeError(f"not a demonstration: {type(ep).__name__}")


class DemoSource(Protocol):
    """The expert's demonstrations of one config's environment, as model/ uses them (built above
    model/, by harness.rl.demos, and passed down; it plays an episode only when one is taken)."""

    @property
    def key(self) -> dict:
        """The environment part of a cache key: its name, options and the source of its classes."""

    @property
    def code(self) -> str:
        """Hash of the source that plays the demonstrations (part of a cache key)."""

    def take(self, n: int, start: int = 0) -> tuple[list[Demo], int]:
        """`n` won expert episodes on the train seeds from index `start` on, in seed order, and the
        index after the last train seed used (a later caller takes demonstrations of other tasks)."""

    def markers(self) -> list[str]:
        """Text the environment's observations are built from, for a tokenizer to learn."""

    def report(self, stage: str, done: int, total: int | None = None) -> None:
        """`done` of `total` units of the set-up step `stage` are finished (progress display)."""


# ----------------------------------------------------------------------------- encoding
def encode_demo(chat: ChatFormat, demo: Demo, max_len: int) -> tuple[list[int], list[int]]:
    """(input ids, loss mask) of one demonstration; turns that would pass `max_len` are dropped."""
    ids = chat.prompt(demo.instructions, demo.observations[0])
    mask = [0] * len(ids)
    for t, action in enumerate(demo.actions):
        obs = chat.observation(demo.observations[t]) if t > 0 else []
        act = chat.action(action)
        if len(ids) + len(obs) + len(act) > max_len:
            break
        ids += obs + act
        mask += [0] * len(obs) + [1] * len(act)
    return ids, mask


def demo_examples(chat: ChatFormat, demo: Demo, max_len: int, context=None) -> list[tuple[list[int], list[int]]]:
    """Training examples of one demonstration under a context policy (`config.ContextConfig`).

    None / full: one concatenated sequence (`encode_demo`). obs_truncate: the same with each
    observation cut as the rollout shows it. window / single: one sequence per turn, the context
    the rollout would build (`harness.transcript.context.build_context`) + that turn's action (loss on it).
    """
    if context is None or context.policy == "full":
        return [encode_demo(chat, demo, max_len)]
    shown = [shown_observation(chat, o, context) for o in demo.observations]
    if context.policy in APPEND_ONLY:
        return [encode_demo(chat, replace(demo, observations=shown), max_len)]
    system, segments, actions, out = system_ids(chat, demo.instructions), [], [], []
    for t, action in enumerate(demo.actions):
        segments.append(chat.observation(shown[t]))
        ctx_ids, act = build_context(context, system, segments, actions), chat.action(action)
        if len(ctx_ids) + len(act) <= max_len:
            out.append((ctx_ids + act, [0] * len(ctx_ids) + [1] * len(act)))
        actions.append(act)
    return out


def length_batches(
    lengths: Sequence[int], batch_size: int, generator: torch.Generator, window: int = 32
) -> list[list[int]]:
    """Shuffled batches of similar-length examples: shuffle, sort within windows of
    `window` batches, cut, shuffle the batch order. Every index appears exactly once."""
    perm = torch.randperm(len(lengths), generator=generator).tolist()
    span = batch_size * window
    batches = []
    for w in range(0, len(perm), span):
        chunk = sorted(perm[w : w + span], key=lambda i: lengths[i])
        batches += [chunk[b : b + batch_size] for b in range(0, len(chunk), batch_size)]
    order = torch.randperm(len(batches), generator=generator).tolist()
    return [batches[i] for i in order]


def collate(examples: Sequence[tuple[list[int], list[int]]], pad_id: int, device) -> tuple[torch.Tensor, ...]:
    """Right-padded (input_ids, attention_mask, loss_mask), each (B, T)."""
    T = max(len(ids) for ids, _ in examples)
    ids = torch.full((len(examples), T), pad_id, dtype=torch.long)
    attn = torch.zeros((len(examples), T), dtype=torch.long)
    lmask = torch.zeros((len(examples), T), dtype=torch.float32)
    for b, (x, m) in enumerate(examples):
        ids[b, : len(x)] = torch.tensor(x)
        attn[b, : len(x)] = 1
        lmask[b, : len(m)] = torch.tensor(m, dtype=torch.float32)
    return ids.to(device), attn.to(device), lmask.to(device)


def action_loss(model: nn.Module, ids: torch.Tensor, attn: torch.Tensor, lmask: torch.Tensor) -> torch.Tensor:
    """Mean negative log-likelihood over the action tokens of a batch (scalar)."""
    hidden = hidden_states(model, ids, attn)  # (B, T, H)
    logp, _ = logprobs_from_hidden(model, hidden, ids, attn, token_mask=lmask)  # (B, T)
    return -(logp * lmask).sum() / lmask.sum().clamp(min=1)


# ----------------------------------------------------------------------------- training
def _schedule(total_steps: int, warmup_frac: float, min_lr_frac: float) -> Callable[[int], float]:
    warm = max(1, int(total_steps * warmup_frac))

    def factor(step: int) -> float:
        if step < warm:
            return (step + 1) / warm
        progress = min(1.0, (step - warm) / max(1, total_steps - warm))
        return min_lr_frac + (1 - min_lr_frac) * 0.5 * (1 + math.cos(math.pi * progress))

    return factor


def sft_train(
    model: nn.Module,
    chat: ChatFormat,
    episodes: Sequence[Any],
    epochs: int,
    lr: float,
    batch_size: int,
    seed: int,
    max_len: int,
    *,
    weight_decay: float = 0.0,
    warmup_frac: float = 0.05,
    min_lr_frac: float = 0.1,
    grad_clip: float = 1.0,
    context=None,
    log: Callable[[dict], None] | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> dict:
    """Train the trainable parameters of `model` on expert demonstrations; return metrics.

    AdamW, linear warm-up then cosine decay to `min_lr_frac * lr`, gradient clipping. The loss is
    on action tokens only (see the module docstring). `episodes`: Demos or episodes `to_demo` reads.
    `context`: a ContextConfig to train in the layout that context policy gives (`demo_examples`);
    None = the full concatenated history. `batch_size` counts training sequences. Every optimizer
    step is reported to `progress(steps done, steps planned)`.
    """
    examples = [x for e in episodes for x in demo_examples(chat, to_demo(e), max_len, context)]
    examples = [x for x in examples if any(x[1])]
    if not examples or epochs <= 0:
        return {"sft/examples": len(examples), "sft/steps": 0}
    device = next(model.parameters()).device
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
    gen = torch.Generator().manual_seed(seed)
    lengths = [len(x[0]) for x in examples]
    steps_per_epoch = math.ceil(len(examples) / batch_size)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, _schedule(epochs * steps_per_epoch, warmup_frac, min_lr_frac))
    was_training = model.training
    model.train()
    t0, step, epoch_losses, first_loss = time.time(), 0, [], None
    for epoch in range(epochs):
        total = torch.zeros((), device=device)  # summed action-token NLL; one sync per epoch
        count = 0.0
        for idx in length_batches(lengths, batch_size, gen):
            batch = [examples[i] for i in idx]
            ids, attn, lmask = collate(batch, chat.pad_id, device)
            loss = action_loss(model, ids, attn, lmask)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            if grad_clip > 0:
                torch.nn.utils.clip_grad_norm_(params, grad_clip)
            opt.step()
            sched.step()
            n_act = float(sum(sum(m) for _, m in batch))
            total, count, step = total + loss.detach() * n_act, count + n_act, step + 1
            if progress:
                progress(step, epochs * steps_per_epoch)
            first_loss = loss.detach() if first_loss is None else first_loss
        epoch_losses.append(float(total) / max(count, 1.0))
        if log:
            log({"sft/epoch": epoch + 1, "sft/loss": epoch_losses[-1], "sft/seconds": time.time() - t0})
    model.train(was_training)
    seconds = time.time() - t0
    tokens = sum(lengths) * epochs
    return {
        "sft/examples": len(examples),
        "sft/steps": step,
        "sft/first_loss": float(first_loss),
        "sft/epoch_losses": epoch_losses,
        "sft/final_loss": epoch_losses[-1],
        "sft/seconds": round(seconds, 2),
        "sft/tokens_per_s": round(tokens * 1.0 / max(seconds, 1e-9), 1),
        "sft/action_tokens": int(sum(sum(m) for _, m in examples)),
        "sft/tokens": int(sum(lengths)),
    }
