"""How well a model copies: teacher-forced loss and greedy-token accuracy on expert episodes, split
into the action tokens that must be copied from the conversation and all the others.

Tool use and the simulated user ask the policy to repeat what it was told: a name from the goal, a
number from a tool response, an order id the user said three turns earlier. A small model trained
from scratch can learn the format of every call and still fail at that, and then every episode
fails on one wrong token. This probe tells the two apart.

A target token counts as *copied* when its text has a digit, or when it is a capitalised word
that already occurs in the context before it (names, cities, order ids). Everything else
(call names, punctuation, fixed arguments) counts as *other*.

    python -m harness.model.copying MODEL_DIR ENV [OPTIONS_JSON] [--episodes N] [--start SEED]

MODEL_DIR is a model folder (a tiny model's cache entry under results/.cache/models, or any
causal LM with its tokenizer); episodes come from the environment's expert on task seeds from
`--start` on (past a tiny model's pre-training seeds by default).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from algorithms.registry import UnknownChoiceError
from envs.registry import validate_options
from harness.model.supervised import collect_demos, encode_demo
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


def copy_probe(model, tok, env: str, options: dict, episodes: int = 60, start: int = 5000) -> dict:
    """{'copied': {...}, 'other': {...}}: tokens, mean loss and greedy-token accuracy of each."""
    fmt = ChatFormat(tok)
    demos, _ = collect_demos(env, options, episodes, start=start)
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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m harness.model.copying", description=__doc__.split("\n\n")[0])
    ap.add_argument("model_dir")
    ap.add_argument("env")
    ap.add_argument("options", nargs="?", default="{}", help="environment options as JSON")
    ap.add_argument("--episodes", type=int, default=60)
    ap.add_argument("--start", type=int, default=5000, help="first task seed of the expert episodes")
    a = ap.parse_args(argv)
    try:
        options = json.loads(a.options)
    except json.JSONDecodeError as e:
        print(f"error: OPTIONS_JSON {a.options!r} is not JSON ({e.msg})", file=sys.stderr)
        return 2
    if not isinstance(options, dict):
        print(f"error: OPTIONS_JSON {a.options!r} must be a JSON object of env options", file=sys.stderr)
        return 2
    if not (Path(a.model_dir) / "config.json").is_file():
        print(f"error: MODEL_DIR {a.model_dir!r} is not a model folder (no config.json in it)", file=sys.stderr)
        return 2
    try:
        validate_options(a.env, options)
    except (UnknownChoiceError, ValueError) as e:  # the registry's messages name the env or option and the valid ones
        print(f"error: {e}", file=sys.stderr)
        return 2
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(a.model_dir)
    model = AutoModelForCausalLM.from_pretrained(a.model_dir)
    rows = copy_probe(model, tok, a.env, options, a.episodes, a.start)
    for kind, r in rows.items():
        line = f"{kind:>6}: {r['tokens']} tokens, loss {r['loss']:.3f} a token"
        print(f"{line}, greedy-token accuracy {r['accuracy']:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
