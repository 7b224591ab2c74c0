"""How well a model copies: teacher-forced loss and greedy-token accuracy on expert episodes, split
into the action tokens that must be copied from the conversation and all the others.

Tool use and the simulated user ask the policy to repeat what it was told: a name from the goal, a
number from a tool response, an order id the user said three turns earlier. A small model trained
from scratch can learn the format of every call and still fail at that, and then every episode
fails on one wrong token. This probe tells the two apart.

A target token counts as *copied* when its text has a digit, or when it is a capitalised word
that already occurs in the context before it (names, cities, order ids). Everything else
(call names, punctuation, fixed arguments) counts as *other*.

`copy_stats(model, tok, demos)` measures it on demonstrations; `python -m harness.rl.copying
MODEL_DIR ENV [OPTIONS_JSON]` runs it on an environment's expert episodes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from harness.model.supervised import Demo, encode_demo
from harness.transcript.chat import ChatFormat


def is_copied(token_text: str, context_text: str) -> bool:
    """True when the target token repeats something from the conversation (see module doc)."""
    word = token_text.strip().strip("\"'(),")
    if any(c.isdigit() for c in token_text):
        return True
    return bool(word) and word[0].isupper() and word in context_text


@dataclass
class CopyStats:
    tokens: int = 0
    loss_sum: float = 0.0
    correct: int = 0

    def add(self, nll: float, hit: bool) -> None:
        self.tokens += 1
        self.loss_sum += nll
        self.correct += int(hit)

    def row(self) -> dict:
        n = max(self.tokens, 1)
        return {"tokens": self.tokens, "loss": self.loss_sum / n, "accuracy": self.correct / n}


def copy_stats(model, tok, demos: list[Demo]) -> dict:
    """{'copied': {...}, 'other': {...}}: tokens, mean loss and greedy-token accuracy of each, over
    the action tokens of `demos`."""
    fmt = ChatFormat(tok)
    stats = {"copied": CopyStats(), "other": CopyStats()}
    model.eval()
    for demo in demos:
        ids, mask = encode_demo(fmt, demo, 1 << 30)
        x = torch.tensor([ids])
        with torch.no_grad():
            logits = model(x).logits[0, :-1].float()
        target = x[0, 1:]
        nll = -torch.log_softmax(logits, -1).gather(1, target[:, None])[:, 0]
        hit = logits.argmax(-1) == target
        for i in range(len(target)):
            if mask[i + 1]:
                kind = "copied" if is_copied(tok.decode([int(target[i])]), tok.decode(ids[: i + 1])) else "other"
                stats[kind].add(float(nll[i]), bool(hit[i]))
    return {k: s.row() for k, s in stats.items()}
