"""The copying probe (harness.model.copying) on an environment's expert episodes, and its command:

    python -m harness.rl.copying MODEL_DIR ENV [OPTIONS_JSON] [--episodes N] [--start SEED]

MODEL_DIR is a model folder (a tiny model's cache entry under results/.cache/models, or any
causal LM with its tokenizer); episodes come from the environment's expert on task seeds from
`--start` on (past a tiny model's pre-training seeds by default).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from algorithms.registry import UnknownChoiceError
from envs.registry import validate_options
from harness.model.copying import copy_stats
from harness.rl.demos import collect_demos


def copy_probe(model, tok, env: str, options: dict, episodes: int = 60, start: int = 5000) -> dict:
    """{'copied': {...}, 'other': {...}}: tokens, mean loss and greedy-token accuracy of each, on
    `episodes` expert episodes of `env` from train seed index `start` on."""
    return copy_stats(model, tok, collect_demos(env, options, episodes, start=start)[0])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m harness.rl.copying", description=__doc__.split("\n\n")[0])
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
