"""Checks of a config against its environment, made by the trainer before any rollout: the token
limit must hold the expert's actions (else the point fails with a one-paragraph message), a turn
budget below the expert's episode length is a warning. Real tiny models (no pre-training, so
they build in seconds), real environments and experts."""

from __future__ import annotations

import random
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from envs.demos import expert_episodes
from harness.config.errors import ConfigError, ConfigWarning
from harness.config.schema import RunConfig
from harness.experiments.runner import RunOptions, run_point
from harness.experiments.sweep import Point, point_id
from harness.model.base import load_pretrained
from harness.model.cache import cache_dir
from harness.model.tiny import tiny_base
from harness.rl.demos import DEMO_MAX_TURNS, Demonstrations, collect_demos
from harness.rl.preflight import EXPERT_SAMPLE, check_fits_env
from harness.store import read_jsonl
from harness.transcript.chat import ChatFormat

SMALL = {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "intermediate_size": 64}


def config(env: str, **sections) -> RunConfig:
    raw = {
        "model": {"tiny": {**SMALL, "pretrain_demos": 0, "pretrain_epochs": 0}, "lora": {"r": 2, "alpha": 4}},
        "env": {"name": env, "heldout_tasks": 8},
        "rollout": {"tasks_per_update": 1, "group_size": 2},
        "train": {"updates": 1, "eval_episodes": 2, "threads": 1},
        "tracking": {"mlflow": False},
    }
    for section, values in sections.items():
        raw.setdefault(section, {}).update(values)
    return RunConfig.model_validate(raw)


def chat_of(cfg: RunConfig) -> ChatFormat:
    folder, _ = tiny_base(cfg, cache_dir(), Demonstrations.of(cfg))
    return ChatFormat(load_pretrained(str(folder), torch.float32)[1])


def heldout(cfg: RunConfig) -> list[int]:
    from envs import ENVS

    return ENVS.get(cfg.env.name).task_seeds("heldout", cfg.env.heldout_tasks, cfg.env.options)


def expert_tokens(cfg: RunConfig, chat: ChatFormat) -> int:
    demos, _ = collect_demos(cfg.env.name, cfg.env.options, EXPERT_SAMPLE)
    return max(len(chat.action(a)) for d in demos for a in d.actions)


@pytest.fixture(scope="module")
def tooluse():
    cfg = config("tooluse", rollout={"max_new_tokens": 8})
    return cfg, chat_of(cfg)


def test_a_token_limit_below_the_expert_s_longest_action_is_refused(tooluse):
    cfg, chat = tooluse
    needed = expert_tokens(cfg, chat)
    assert needed > 8  # tool calls are long: the FrozenLake limit cannot hold them
    with pytest.raises(ConfigError) as err:
        check_fits_env(cfg, chat, heldout(cfg))
    msg = str(err.value)
    assert "rollout.max_new_tokens = 8" in msg and f"at least {needed}" in msg and "\n" not in msg
    exact = cfg.model_copy(update={"rollout": cfg.rollout.model_copy(update={"max_new_tokens": needed})})
    check_fits_env(exact, chat, heldout(exact))  # exactly enough passes
    short = cfg.model_copy(update={"rollout": cfg.rollout.model_copy(update={"max_new_tokens": needed - 1})})
    with pytest.raises(ConfigError, match=f"at least {needed}"):
        check_fits_env(short, chat, heldout(short))


def test_the_point_fails_before_any_rollout_without_a_traceback_on_screen(tooluse, tmp_path, capfd):
    cfg, _ = tooluse
    point = Point(point_id("base", 0, "0" * 8), "base", None, 0, {}, cfg, "0" * 8, True)
    res = run_point(point, "s", RunOptions(tmp_path, train_fn="harness.rl.trainer:train"))
    run_dir = tmp_path / "s" / point.id
    assert res["status"] == "failed" and "rollout.max_new_tokens = 8" in res["error"]
    assert (run_dir / "status").read_text().strip() == "failed"
    assert not read_jsonl(run_dir / "metrics.jsonl") and not read_jsonl(run_dir / "samples.jsonl")  # no rollout
    assert "Traceback" not in "".join(capfd.readouterr())


@pytest.fixture(scope="module")
def frozenlake():
    cfg = config("frozenlake", turns={"max": 4})
    return cfg, chat_of(cfg)


def test_a_turn_budget_below_the_expert_s_episode_length_warns(frozenlake):
    cfg, chat = frozenlake
    lengths = [len(e.turns) for e in expert_episodes("frozenlake", {}, heldout(cfg)[:EXPERT_SAMPLE], DEMO_MAX_TURNS)]
    assert min(lengths) >= 6  # a 4x4 map needs at least 6 moves from corner to corner
    with pytest.warns(ConfigWarning, match=r"turns.max: a budget of 4 turns is below the expert's episode length"):
        check_fits_env(cfg, chat, heldout(cfg))
    roomy = cfg.model_copy(update={"turns": cfg.turns.model_copy(update={"max": max(lengths)})})
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConfigWarning)  # no warning at all
        check_fits_env(roomy, chat, heldout(roomy))


def test_the_checks_leave_every_random_state_as_they_found_it(frozenlake):
    cfg, chat = frozenlake
    random.seed(1), np.random.seed(1), torch.manual_seed(1)
    expected = (random.random(), np.random.rand(), torch.rand(1).item())
    random.seed(1), np.random.seed(1), torch.manual_seed(1)
    with pytest.warns(ConfigWarning):
        check_fits_env(cfg, chat, heldout(cfg))
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == expected


def test_a_turn_budget_warning_is_recorded_in_the_point_s_events(frozenlake, tmp_path, capfd):
    cfg, _ = frozenlake
    cfg = cfg.model_copy(update={"train": cfg.train.model_copy(update={"updates": 0, "eval_episodes": 1})})
    point = Point(point_id("base", 0, "1" * 8), "base", None, 0, {}, cfg, "1" * 8, True)
    res = run_point(point, "s", RunOptions(Path(tmp_path), train_fn="harness.rl.trainer:train"))
    assert res["status"] == "done", res
    events = read_jsonl(tmp_path / "s" / point.id / "events.jsonl")
    warned = [e for e in events if e["event"] == "warning"]
    assert len(warned) == 1 and "turns.max: a budget of 4 turns" in warned[0]["message"]
    assert f"warning: {point.id}: turns.max: a budget of 4 turns" in capfd.readouterr().err
