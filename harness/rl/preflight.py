"""Checks of a config against its environment, made by the trainer once the policy is built and
before any rollout (they need the model's tokenizer and the environment's expert):

- `rollout.max_new_tokens` must hold the expert's longest action on a sample of train tasks, as
  the policy would write it (the action's token ids plus the end-of-turn token). A shorter
  limit cuts every such action off: it parses as a format error and can never be learned. This
  is a ConfigError (the point fails before any rollout).
- The final turn budget (`turns.max`, or the last curriculum budget) should let the expert finish
  the held-out tasks; tasks it cannot finish within the budget cap the success rate, which is a
  warning (a short budget can be the question a sweep asks).

Both play the expert in this process with the random states of python, numpy and torch kept, so
a run's numbers are the same with or without the checks. The train tasks' expert episodes come
from the run's `Demonstrations` (harness.rl.demos), which the tiny model's pre-training may have
played already.
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import torch

from envs.demos import expert_episodes
from harness.config.errors import ConfigError, warn
from harness.config.schema import RunConfig
from harness.model.supervised import Demo
from harness.rl.demos import DEMO_MAX_TURNS, Demonstrations
from harness.transcript.chat import ChatFormat

EXPERT_SAMPLE = 16  # tasks the expert plays for each check


@contextmanager
def _random_states_kept() -> Iterator[None]:
    py, npy = random.getstate(), np.random.get_state()
    with torch.random.fork_rng(devices=[]):
        try:
            yield
        finally:
            random.setstate(py)
            np.random.set_state(npy)


def check_fits_env(
    cfg: RunConfig, chat: ChatFormat, heldout: list[int], demonstrations: Demonstrations | None = None
) -> None:
    """ConfigError when rollout.max_new_tokens cannot hold the expert's actions; a warning when
    the turn budget is below the expert's episode length on held-out tasks (module doc).
    `demonstrations`: the run's (None: played here)."""
    with _random_states_kept():
        demos, _ = (demonstrations or Demonstrations.of(cfg)).take(EXPERT_SAMPLE)
        check_action_tokens(cfg, chat, demos)
        episodes = expert_episodes(cfg.env.name, cfg.env.options, heldout[:EXPERT_SAMPLE], DEMO_MAX_TURNS)
        check_turn_budget(cfg, [len(e.turns) for e in episodes if e.won and not e.env_error])


def check_action_tokens(cfg: RunConfig, chat: ChatFormat, demos: list[Demo]) -> None:
    lengths = [(len(chat.action(a)), a) for d in demos for a in d.actions]
    if not lengths:
        return
    needed, action = max(lengths, key=lambda pair: pair[0])
    limit = cfg.rollout.max_new_tokens
    if limit < needed:
        shown = action if len(action) <= 60 else action[:57] + "..."
        raise ConfigError(
            f"rollout.max_new_tokens = {limit} is too small for {cfg.env.name}: the expert's longest action on "
            f"{len(demos)} train tasks takes {needed} tokens in this model's tokenizer ({shown!r} and the "
            f"end-of-turn token), so such actions would be cut off and count as format errors. Set "
            f"rollout.max_new_tokens to at least {needed}."
        )


def final_turn_budget(cfg: RunConfig) -> tuple[str, int]:
    """(the key that sets it, the turn budget of the last updates and evaluations)."""
    if cfg.turns.curriculum:
        return "turns.curriculum", cfg.turns.curriculum[-1]
    return "turns.max", cfg.turns.max


def check_turn_budget(cfg: RunConfig, expert_turns: list[int]) -> None:
    key, budget = final_turn_budget(cfg)
    longer = [t for t in expert_turns if t > budget]
    if not longer:
        return
    warn(
        f"{key}: a budget of {budget} turns is below the expert's episode length on {len(longer)} of "
        f"{len(expert_turns)} held-out tasks of {cfg.env.name} it solves (longest {max(longer)} turns, median "
        f"{statistics.median(expert_turns):g}): those tasks cannot be won within the budget, which caps the "
        f"success rate near {1 - len(longer) / len(expert_turns):.2f}.",
        once_key=("turn_budget", cfg.env.name, repr(cfg.env.options), budget),
    )
